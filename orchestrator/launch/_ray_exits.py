"""The supervisor's side of a node host's exit stream (``._node_exits``): one long poll a host.

Each carried child's launch asks its host to watch it (the ``watch`` step); the child's exit
watch here (``LaunchedRay._watch``) then waits on :meth:`HostExits.expect` instead of a Ray call
of its own. One task a host asks ``NodeHost.exits`` for whatever ended, again and again while
any child of the host is awaited, and hands each end to its waiter. A host that does not answer
(it died, or its node) fails every waiter at once, as their own calls would have failed.
"""

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from orchestrator.launch._ray_refs import resolved

__all__ = ["POLL_S", "HostExits"]

log = logging.getLogger("orchestrator")

#: How long one poll waits on the host for an end before it answers with none.
POLL_S = 10.0
#: How much longer than that a poll may take to come back before the host counts as gone.
_SLACK_S = 60.0

#: A child's end: its exit status and the last of its output.
End = tuple[int, bytes]


class _Outcome:
    """One awaited end: set once, with the end or the reason there will be none."""

    def __init__(self) -> None:
        self._done = trio.Event()
        self._end: End | None = None
        self._error: BaseException | None = None

    def set(self, end: End) -> None:
        self._end = end
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    async def get(self) -> End:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._end is not None  # noqa: S101 - set before the event
        return self._end


class HostExits:
    """The ends awaited from one node host, and the one task that polls it."""

    def __init__(self, host: Any, nursery: trio.Nursery) -> None:
        self.host = host
        self._nursery = nursery
        self._waiting: dict[str, _Outcome] = {}
        self._polling = False

    def expect(self, ident: str) -> Callable[[], Awaitable[End]]:
        """What awaits the end of the child whose state in the host is *ident* (its ``watch``
        step is in the call that started it). Synchronous: call it before the next await
        after the start, so no poll can bring the end before it is awaited."""
        outcome = self._waiting[ident] = _Outcome()
        if not self._polling:
            self._polling = True
            self._nursery.start_soon(self._poll)
        return outcome.get

    async def _poll(self) -> None:
        try:
            while self._waiting:
                got: dict[str, End] = await resolved(
                    self.host.exits.remote(POLL_S), timeout=POLL_S + _SLACK_S
                )
                for ident, (status, tail) in got.items():
                    outcome = self._waiting.pop(ident, None)
                    if outcome is not None:
                        outcome.set((int(status), bytes(tail)))
        except Exception as exc:  # the host (or its node) is gone: every watch on it fails
            for outcome in self._waiting.values():
                outcome.fail(exc)
            self._waiting.clear()
        finally:
            self._polling = False
