"""What the builtin agent's models share: a conversation in, one step out.

A step is final text, or tool calls for the agent loop to run.
"""

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import trio

import ipc


@attrs.frozen(kw_only=True)
class ToolCall:
    """One tool call the model asked for."""

    id: str
    name: str
    args: dict[str, Any]


@attrs.frozen(kw_only=True)
class ModelStep:
    """One model response: final text when there are no tool calls."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: ipc.Usage | None = None


@attrs.define(eq=False)
class SteerInbox:
    """Steering messages that arrived while a turn works."""

    pending: list[str] = attrs.Factory(list)
    seen: list[str] = attrs.Factory(list)
    arrived: trio.Event = attrs.Factory(trio.Event)
    #: What the last drain took: the steers that joined the conversation just before the
    #: model's current step.
    fresh: list[str] = attrs.Factory(list)

    def put(self, text: str) -> None:
        self.pending.append(text)
        self.arrived.set()

    def drain(self) -> list[str]:
        """Take every pending steer (they join the conversation)."""
        taken, self.pending = self.pending, []
        self.seen.extend(taken)
        self.fresh = list(taken)
        self.arrived = trio.Event()
        return taken

    def new_turn(self) -> None:
        self.seen.clear()
        self.fresh = []


@attrs.define(eq=False)
class StepContext:
    """What a model may look at when it decides the next step."""

    messages: list[dict[str, Any]]
    tools: Sequence[dict[str, Any]]
    turn: int
    side: bool
    task: str
    steers: SteerInbox
    emit: Callable[[ipc.Event], None]


class ModelError(Exception):
    """The model could not produce a step (endpoint down, script malformed, ...)."""


class Model(Protocol):
    """Decides; the agent loop executes."""

    async def step(self, ctx: StepContext) -> ModelStep: ...

    async def aclose(self) -> None: ...
