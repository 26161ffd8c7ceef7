"""The kill ladder: SIGTERM the group, grace, SIGKILL the survivors.

The process tree is snapshotted with psutil *before* signalling, so a grandchild that called
``setsid`` (leaving our process group) is still found. One that has already left the tree — its
parent exited and it was re-parented to init, or the child itself died first — is found by the
run's marker, an environment variable every process the child starts inherits
(:data:`MARKER_ENV`). The direct child is never waited on through psutil: its launcher reaps it,
so its exit code is kept.
"""

import contextlib
import os
import signal
from typing import Final

import psutil
import trio

#: Set in a child's environment to a value unique to its run; descendants inherit it.
MARKER_ENV: Final = "FLEET_RUN"


def snapshot(pid: int) -> list[psutil.Process]:
    """Every descendant of *pid* now (empty if it is gone)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def marked(marker: str | None, *, besides: int) -> list[psutil.Process]:
    """Every process but *besides* whose environment carries *marker* (none without one)."""
    if marker is None:
        return []
    found = []
    for process in psutil.process_iter(["environ"]):
        environ = process.info["environ"] or {}
        if process.pid != besides and environ.get(MARKER_ENV) == marker:
            found.append(process)
    return found


async def _marked(marker: str | None, *, besides: int) -> list[psutil.Process]:
    # Reading every process's environment costs ~50 us a process: off the event loop, so a
    # fleet-wide stop on a busy machine does not stall every other child's I/O.
    if marker is None:
        return []
    return await trio.to_thread.run_sync(lambda: marked(marker, besides=besides))


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_all(processes: list[psutil.Process], sig: int) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of *processes* still running (zombies count as gone)."""
    result = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                result.append(process)
    return result


async def kill_tree(
    pid: int, *, exited: trio.Event, grace: float, marker: str | None = None
) -> None:
    """Terminate *pid* (a session leader) and all its descendants, and every process that
    carries its run's *marker*.

    *exited* is set by whoever reaps the direct child. Returns when the direct child has exited
    and no snapshotted descendant is left, or after SIGKILL when grace ran out.
    """
    tree = snapshot(pid) + await _marked(marker, besides=pid)
    if not exited.is_set():
        _signal_group(pid, signal.SIGTERM)
    _signal_all(tree, signal.SIGTERM)
    with trio.move_on_after(grace):
        await exited.wait()
        while alive(tree):  # noqa: ASYNC110 - no event exists for a non-child exit
            await trio.sleep(0.02)
    tree = alive(tree + snapshot(pid) + await _marked(marker, besides=pid))
    if not exited.is_set():
        _signal_group(pid, signal.SIGKILL)
    _signal_group(pid, signal.SIGKILL)
    _signal_all(tree, signal.SIGKILL)
    with trio.move_on_after(grace):
        await exited.wait()
    # Descendants re-parented to init are reaped by it; give the kernel a moment to finish.
    with trio.move_on_after(1.0):
        while alive(tree):  # noqa: ASYNC110 - no event exists for a non-child exit
            await trio.sleep(0.02)
