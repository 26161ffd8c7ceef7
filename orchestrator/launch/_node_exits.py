"""A node host's exit stream: its children's ends, collected on its loop, handed over in batches.

An exit watch that is a Ray call of its own held one of the host's threads for its child's
whole life (reading the child's output, then waiting for it) and cost a call a child on both
ends. Here a child the supervisor asks to have watched (the ``watch`` step of its launch) gets
a task on the host's one trio thread (:mod:`._node_loop`) that drains its output, keeping the
last 8 KiB (to its end, or for :data:`DRAIN_S` past the child's exit: what it left running
may hold it open), and waits for its exit without a thread (a forked child's reaper tells it, a
``Popen`` child's pidfd); its status and output tail then wait here until the supervisor's one
long poll for the whole host (:meth:`NodeExits.collect`, ``NodeHost.exits``) takes them, with
every other child's that ended meanwhile. A host that dies fails that poll, and so every watch
on it at once, as a watch of its own failed before.
"""

import contextlib
import logging
import os
import subprocess
import threading
from typing import Any

import trio

from orchestrator.launch._forkserver import UNKNOWN_STATUS
from orchestrator.launch._node_loop import NodeLoop

__all__ = ["TAIL", "NodeExits"]

log = logging.getLogger("orchestrator")

#: The most bytes of a child's output kept for its end.
TAIL = 8192
#: The most bytes one read of a child's output takes.
_CHUNK = 65536
#: How long a child's output is still read once it has ended (a process it left behind may
#: hold it open for ever; its host kills those when it releases the child).
DRAIN_S = 1.0


class NodeExits:
    """The ends of one node host's watched children (see the module docstring)."""

    def __init__(self, loop: NodeLoop) -> None:
        self._loop = loop
        self._changed = threading.Condition()
        #: Ended and not yet collected: the child's state name → its status and output tail.
        self._ended: dict[str, tuple[int, bytes]] = {}

    def watch(self, ident: str, proc: Any) -> None:
        """Watch child *ident*'s process *proc* (a ``Popen`` or a fork) until it ends; its end
        waits for :meth:`collect`. From an actor thread."""
        self._loop.run_sync(lambda: self._loop.nursery.start_soon(self._watch, ident, proc))

    def collect(self, wait: float) -> dict[str, tuple[int, bytes]]:
        """The ends since the last call, waiting up to *wait* seconds for one. Blocking: an
        actor thread's."""
        with self._changed:
            if not self._ended:
                self._changed.wait(wait)
            got, self._ended = self._ended, {}
            return got

    async def _watch(self, ident: str, proc: Any) -> None:
        output, status = _Tail(), UNKNOWN_STATUS
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(output.drain, proc)
                status = await _exited(proc)
                # What it left running may hold its output open: its end is told anyway.
                with trio.move_on_after(DRAIN_S):
                    await output.done.wait()
                nursery.cancel_scope.cancel()
        except Exception as exc:  # never into the loop: every other child's watch runs there
            log.warning("the watch of %s failed: %r", ident, exc)
        finally:
            with self._changed:
                self._ended[ident] = (status, output.tail)
                self._changed.notify_all()


class _Tail:
    """The last :data:`TAIL` bytes of a child's output, read to its end (or until cancelled)."""

    def __init__(self) -> None:
        self.tail = b""
        self.done = trio.Event()

    async def drain(self, proc: Any) -> None:
        try:
            if proc.stdout is None:
                return
            with proc.stdout as out:
                stream = trio.lowlevel.FdStream(os.dup(out.fileno()))
            async with stream:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    while chunk := await stream.receive_some(_CHUNK):
                        self.tail = (self.tail + chunk)[-TAIL:]
        finally:
            self.done.set()


async def _exited(proc: Any) -> int:
    """*proc*'s exit status, awaited without a thread where Linux gives a pidfd."""
    reaped = getattr(proc, "reaped", None)
    if reaped is not None:  # a fork: its server's reaper sets it, on this loop
        await reaped.wait()
        return int(proc.returncode)
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux, or it is reaped already
        return int(await trio.to_thread.run_sync(proc.wait))
    try:
        await trio.lowlevel.wait_readable(pidfd)  # readable once the process ended
    finally:
        os.close(pidfd)
    with contextlib.suppress(subprocess.TimeoutExpired):
        return int(proc.wait(timeout=5))
    return int(await trio.to_thread.run_sync(proc.wait))
