"""The processes behind background shells: start one that dies with the child, wait, stop it.

A shell is ``/bin/sh -c COMMAND`` in its own session (so its process group is exactly what it
started), stdin empty, stdout and stderr into one pipe. It must die with the child however the
child ends:

- ``PR_SET_PDEATHSIG`` = SIGKILL on the leader. It fires when the *thread* that forked exits,
  so ``subprocess.Popen`` is called on the trio thread itself, never through
  ``trio.lowlevel.open_process`` (which forks from a worker thread that trio retires after
  10 s idle, killing the shell with it).
- the guardian (:mod:`._shellguard`) for the rest of the group: it SIGKILLs every registered
  group when the child's end of its pipe closes.

``stop_group`` is the kill ladder of ``bash`` with a longer grace: SIGTERM the group (and the
descendants snapshotted before, which may have left it with ``setsid``), up to
:data:`KILL_GRACE` seconds, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import psutil
import trio

from ._bash import _any_alive, _descendants, _group_alive, _signal_all

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

log = logging.getLogger("child")

#: Seconds between SIGTERM and SIGKILL for a shell's process group.
KILL_GRACE: Final = 3.0
_POLL: Final = 0.05
_PR_SET_PDEATHSIG: Final = 1
_PR_SET_CHILD_SUBREAPER: Final = 36
#: Run as a script, never imported by the child (see its docstring).
_GUARD_SCRIPT: Final = Path(__file__).with_name("_shellguard.py")
_libc = ctypes.CDLL(None, use_errno=True)
if sys.platform == "linux":
    _libc.prctl.argtypes = (ctypes.c_int,) + (ctypes.c_ulong,) * 4


def _die_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: SIGKILL this process when *parent*'s forking thread ends."""

    def preexec() -> None:  # pragma: no cover - runs in the forked child
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: nobody would notice
            os._exit(1)

    return preexec


def adopt_orphans() -> bool:
    """In a child process (``FLEET_CHILD=1``), become the subreaper of everything it starts;
    whether it now is.

    A process that double-forks or ``setsid``s away from its shell, and empties its
    environment (so no run marker finds it), was re-parented to init and outlived its child's
    stop. Re-parented here instead, it stays in the child's process tree: the supervisor's
    kill ladder snapshots it, and :func:`end_adopted` ends it when the child exits. Never in
    another process (a test's, which has its own children to keep)."""
    if sys.platform != "linux" or os.environ.get("FLEET_CHILD") != "1":
        return False
    return int(_libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0


def end_adopted(keep: Collection[int]) -> int:
    """SIGKILL every descendant of this process but *keep* (the guardian): at the child's
    exit, what its shells left behind, re-parented here (:func:`adopt_orphans`); how many."""
    try:
        found = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    ended = 0
    for process in found:
        if process.pid in keep:
            continue
        with contextlib.suppress(psutil.Error):
            process.kill()  # psutil checks the pid was not reused
            ended += 1
    return ended


def spawn(command: str, cwd: Path) -> tuple[subprocess.Popen[bytes], trio.lowlevel.FdStream]:
    """Start ``/bin/sh -c command`` as above; the process and the read end of its output."""
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=write_end,
            start_new_session=True,
            preexec_fn=_die_with(os.getpid()),  # noqa: PLW1509 - prctl and getppid only
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return process, trio.lowlevel.FdStream(read_end)


async def wait_exit(process: subprocess.Popen[bytes]) -> int:
    """Wait for *process* to exit (on a pidfd where there is one, else by polling)."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            trio.lowlevel.notify_closing(pidfd)
            os.close(pidfd)
    # Polled without a pidfd; afterwards the exit is there and ``poll`` only reaps it.
    while (code := process.poll()) is None:  # noqa: ASYNC110
        await trio.sleep(_POLL)
    return code


def _running(process: subprocess.Popen[bytes], strays: list[psutil.Process]) -> bool:
    return process.poll() is None or _group_alive(process.pid) or _any_alive(strays)


async def stop_group(process: subprocess.Popen[bytes]) -> bool:
    """Stop *process*'s group; whether SIGKILL was needed. Call it shielded.

    On return nothing of the group is running (zombies aside) and the leader is reaped.
    """
    pgid = process.pid  # the session leader's pid is the group id (start_new_session=True)
    strays = _descendants(process.pid) if process.poll() is None else []
    killed = False
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if not _running(process, strays):
            break
        killed = signum is signal.SIGKILL
        _signal_all(pgid, strays, signum)
        with trio.move_on_after(KILL_GRACE):
            # Nothing signals "the whole group is gone", so this polls.
            while _running(process, strays):  # noqa: ASYNC110
                await trio.sleep(_POLL)
    return killed


@attrs.define(eq=False)
class Guardian:
    """The child's end of the guardian's pipe (see :mod:`._shellguard`), started on first use."""

    _process: subprocess.Popen[bytes] | None = None
    _pipe: int | None = None

    def add(self, pgid: int) -> None:
        if self._pipe is None:
            self._start()
        self._write(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        self._write(f"-{pgid}\n")

    def _start(self) -> None:
        read_end, write_end = os.pipe()  # both close-on-exec; the guardian gets read_end only
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_GUARD_SCRIPT), str(read_end)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(read_end,),
                start_new_session=True,  # a signal to the child's group does not reach it
            )
        except OSError as exc:
            os.close(write_end)
            log.warning("shell guardian did not start (%s); leaders still die with the child", exc)
            self._pipe = -1
            return
        finally:
            os.close(read_end)
        self._pipe = write_end

    def _write(self, line: str) -> None:
        if self._pipe is None or self._pipe < 0:
            return
        try:
            os.write(self._pipe, line.encode())
        except OSError as exc:  # the guardian died: leaders still have their PDEATHSIG
            log.warning("shell guardian is gone (%s)", exc)
            os.close(self._pipe)
            self._pipe = -1

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def aclose(self) -> None:
        """Close the pipe (the guardian exits) and reap it, within a second."""
        if self._pipe is not None and self._pipe >= 0:
            os.close(self._pipe)
        self._pipe = -1
        if self._process is not None:
            with trio.move_on_after(1.0):
                await wait_exit(self._process)
