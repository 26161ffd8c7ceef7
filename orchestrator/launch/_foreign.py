"""Processes a surface forked for us (a tmux pane's, a cmux surface's): waiting and killing.

Such a process is not our child, so it is awaited on a pidfd (or by polling) without reaping
it, and the kill ladder also signals the process itself, since it may share a group with a
shell.
"""

import contextlib
import os
import signal

import psutil
import trio

from orchestrator.launch._kill import alive, kill_tree


class ForeignProcess:
    """A process we did not fork (a tmux or cmux pane's): wait for its exit without reaping it.

    The pidfd is opened at construction, right after the pid is learned, so a later pid reuse
    cannot fool the wait.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None
        self._gone = False
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is None:
            return
        try:
            self._fd = pidfd_open(pid)
        except ProcessLookupError:
            self._gone = True
        except OSError:
            self._fd = None  # e.g. a seccomp filter refuses pidfd_open: poll instead

    async def wait(self) -> None:
        if self._gone:
            await trio.lowlevel.checkpoint()
            return
        if self._fd is not None:
            try:
                await trio.lowlevel.wait_readable(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None
            return
        try:
            process = psutil.Process(self.pid)
        except psutil.Error:
            await trio.lowlevel.checkpoint()
            return
        while alive([process]):  # noqa: ASYNC110 - no event exists for a non-child exit
            await trio.sleep(0.1)

    def zombie_status(self) -> int | None:
        """The exit status while the process is a zombie its parent has not reaped yet.

        Read from ``/proc/<pid>/stat`` (Linux), as ``subprocess`` would report it: the exit
        code, or minus the signal. ``None`` once reaped, or where there is no ``/proc``.
        """
        try:
            with open(f"/proc/{self.pid}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        if fields[0] not in {"Z", "X"}:
            return None
        status = int(fields[-1])  # the wait(2) status (field 52, Linux 3.5+)
        return -(status & 0x7F) if status & 0x7F else status >> 8


async def kill_foreign(pid: int, *, exited: trio.Event, grace: float) -> None:
    """The kill ladder for a process we did not fork.

    A tmux pane's process leads its own session, as does a job of a shell with job control; a
    shell without it leaves the job in the shell's group, which :func:`kill_tree` would miss. So
    the process itself is signalled too.
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    await kill_tree(pid, exited=exited, grace=grace)
    if not exited.is_set():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with trio.move_on_after(grace):
            await exited.wait()
