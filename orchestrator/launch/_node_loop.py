"""A node process's one trio thread: what its children need served while they run.

A node host (:mod:`._ray_host`) serves many children from Ray's actor threads, which block.
What must run on an event loop instead — its fork servers' readers and reapers
(:mod:`._ray_forks`) and every child's egress proxy (:class:`._ray_node.NodeEgress`) — runs on
one trio thread per node process, started on first use and kept for the process's life: a
fork server started there dies with it (``PR_SET_PDEATHSIG`` fires when its *thread* ends), and
a child's proxy costs a few tasks on it, not a thread and an event loop of its own.

A task that fails after it has started must not end the loop (every other child's proxy and
the fork servers run there): :meth:`NodeLoop.start` catches what each raises once it has
started and tells the task's own callback how it ended.
"""

import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

__all__ = ["NodeLoop"]

log = logging.getLogger("orchestrator")

T = TypeVar("T")
#: How long the thread may take to start its loop.
_START_S = 30.0


class NodeLoop:
    """One trio thread of a node process; blocking calls, from any other thread."""

    def __init__(self, name: str = "fleet-node-loop") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None

    @property
    def nursery(self) -> trio.Nursery:
        """The loop's nursery (only on the loop's own thread, once it runs)."""
        assert self._nursery is not None  # noqa: S101 - set before the token is
        return self._nursery

    def token(self) -> trio.lowlevel.TrioToken:
        """The loop's token, its thread started on the first call."""
        with self._lock:
            if self._token is not None:
                return self._token
            started = threading.Event()
            tokens: list[trio.lowlevel.TrioToken] = []

            async def main() -> None:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    tokens.append(trio.lowlevel.current_trio_token())
                    started.set()
                    await trio.sleep_forever()

            thread = threading.Thread(target=trio.run, args=(main,), name=self._name, daemon=True)
            thread.start()
            if not started.wait(_START_S) or not tokens:
                raise RuntimeError(f"the node's loop ({self._name}) did not start")
            self._token = tokens[0]
            return self._token

    def run(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await afn(*args)`` on the loop; its result (or its exception)."""
        return trio.from_thread.run(afn, *args, trio_token=self.token())

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the loop's thread; its result (or its exception)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token())

    def start(
        self,
        afn: Callable[..., Awaitable[None]],
        *,
        ended: Callable[[BaseException | None], None],
    ) -> trio.CancelScope:
        """Start ``afn(task_status=...)`` on the loop and return once it has started (raising
        what it raised before that); the scope that ends it. Once it has started, *ended* is
        told when it ends (with what it raised, or ``None``): a failure never reaches the
        loop."""

        async def begin() -> trio.CancelScope:
            scope = trio.CancelScope()
            await self.nursery.start(self._guarded, afn, scope, ended)
            return scope

        return self.run(begin)

    @staticmethod
    async def _guarded(
        afn: Callable[..., Awaitable[None]],
        scope: trio.CancelScope,
        ended: Callable[[BaseException | None], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        status = _Status(task_status)
        error: BaseException | None = None
        try:
            with scope:
                await afn(task_status=status)
        except Exception as exc:
            if not status.began:
                raise  # to the caller of start
            log.warning("a task of the node's loop failed: %r", exc)
            error = exc
        finally:
            if status.began:
                ended(error)


class _Status:
    """The task status a guarded task is given: the caller's, and whether it has started."""

    def __init__(self, outer: "trio.TaskStatus[None]") -> None:
        self._outer = outer
        self.began = False

    def started(self, value: None = None) -> None:
        self.began = True
        self._outer.started(value)
