"""Hand-offs from a channel's reader to the tasks it wakes, each one scheduler step.

A round trip crosses a process boundary twice and wakes a task on each side, so every wake-up
is paid once per round trip per side, with cold caches. ``trio.Event`` (a parking lot and a
broadcast) and a fresh task per incoming request (a coroutine, a context copy, nursery
bookkeeping) are general tools; here each waiter is one known task, so these park it with
:func:`trio.lowlevel.wait_task_rescheduled` and wake it with one
:func:`trio.lowlevel.reschedule`. Cancellation is honoured: the abort callback forgets the
parked task, so no waker can reschedule it twice.
"""

import math
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import attrs
import trio

Job = TypeVar("Job")


@attrs.define(eq=False)
class Pending:
    """One request waiting for its response: filled once, by the reader, a deadline or a close."""

    type: str
    # Set only when serve()'s deadline keeper enforces this request's deadline.
    deadline: float = math.inf
    # The requester reads the socket itself (ipc._lending): a deadline must interrupt it.
    lent: bool = False
    done: bool = False
    result: Any = None
    error: Exception | None = None
    _task: trio.lowlevel.Task | None = None

    def finish(self, result: Any = None, error: Exception | None = None) -> None:
        """Fill the slot (no result and no error: the deadline passed) and wake the requester."""
        if self.done:
            return
        self.done = True
        self.result = result
        self.error = error
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task)

    def wait(self) -> Awaitable[object]:
        """Await this to park until finished; a cancellation leaves the slot unfilled.

        Returns trio's own parking coroutine (no wrapper: a coroutine frame fewer per round
        trip). Must be awaited at once, and only while the slot is not done.
        """
        self._task = trio.lowlevel.current_task()
        return trio.lowlevel.wait_task_rescheduled(self._abort)  # noqa: ASYNC105 - see above

    def _abort(self, _: Any) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED


@attrs.define(eq=False)
class Worker(Generic[Job]):
    """A long-lived task running one job at a time; while it is busy, :meth:`offer` declines.

    Whoever gets a ``False`` from :meth:`offer` starts a task of its own for the job, so a slow
    job never delays the next one.
    """

    run_job: Callable[[Job], Awaitable[None]]
    _task: trio.lowlevel.Task | None = None
    _job: Job | None = None

    def offer(self, job: Job) -> bool:
        """Hand *job* to the worker if it is idle; ``False`` if it is busy (or not running)."""
        task = self._task
        if task is None:
            return False
        self._task = None
        self._job = job
        trio.lowlevel.reschedule(task)
        return True

    async def run(self) -> None:
        """Run jobs as they are offered, until cancelled."""
        while True:
            self._task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)
            job, self._job = self._job, None
            await self.run_job(job)  # type: ignore[arg-type]  # offer() stored one

    def _abort(self, _: Any) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED
