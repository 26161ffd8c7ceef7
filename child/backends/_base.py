"""The interface every backend implements, and the host services a backend may call.

A backend runs turns. The runtime (:mod:`child._runtime`) owns the IPC channel and gives the
backend a :class:`Host`: the way to emit activity, ask the parent, spawn nested children, take
ownership of paths and use the discussion paper. Backends never see the channel or the token.
"""

from collections.abc import Sequence
from typing import Protocol

import attrs

import ipc

#: Said once, hidden from everyone but the model, in the first prompt after a revive.
RESTARTED = (
    "(You were restarted: your supervisor ended and this conversation was restored from "
    "your transcript. Files may have changed meanwhile; check before relying on them.)"
)


@attrs.frozen(kw_only=True)
class TurnResult:
    """How a turn ended. ``text`` is the final report (the only thing the parent sees)."""

    text: str
    ok: bool = True
    aborted: bool = False
    error: str = ""
    #: What the backend resumes from after this turn (a name below the scratch → its text),
    #: for a child whose loadout asks (``context_inline``); empty when it cannot say.
    context: dict[str, str] = attrs.Factory(dict)


class TurnAborted(Exception):
    """Raised inside a turn when the supervisor is stopping the child (the loop gate's last
    trip, :meth:`Host.check_tool`): the turn asks its model nothing more and waits for the
    abort that follows. Its message is the reason."""


class Host(Protocol):
    """What the child runtime offers a backend."""

    def emit(self, event: ipc.Event) -> None:
        """Queue an activity event (the runtime throttles and sends it)."""

    async def ask_parent(self, question: str) -> str:
        """Ask the parent and wait (without deadline) for the answer."""

    async def spawn(self, agent: str, task: str, name: str = "") -> str:
        """Run a nested child and return its final text (or a refusal line)."""

    async def ownership(self, paths: Sequence[str]) -> str | None:
        """Own *paths* before writing; ``None`` when granted, else the refusal line."""

    async def discuss(self, op: str, **fields: str | None) -> str:
        """A discussion-paper operation; returns the paper's reply text."""

    async def check_tool(self, start: ipc.Event) -> str | None:
        """Announce a ``tool_start`` *before* the tool runs, or a ``tool_end`` before the next
        model step (instead of emitting it), in order behind the events already emitted;
        ``None`` when the call may run (or the turn go on), else the loop gate's refusal line.
        Raises :class:`TurnAborted` when the gate stopped the child."""


class Backend(Protocol):
    """One agent process or loop, driven turn by turn.

    ``run_turn`` returns when the turn settles. ``steer`` redirects a working turn. ``abort``
    makes the working turn return with ``aborted=True`` promptly. ``aclose`` releases
    everything (processes, files); it is called once, at exit.
    """

    name: str

    async def run_turn(self, text: str, *, side: bool = False) -> TurnResult: ...

    async def steer(self, text: str) -> None: ...

    async def abort(self) -> None: ...

    async def aclose(self) -> None: ...
