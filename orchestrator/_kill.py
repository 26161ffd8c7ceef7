"""The kill ladder: SIGTERM the group, grace, SIGKILL the survivors.

The process tree is snapshotted with psutil *before* signalling, so a grandchild that called
``setsid`` (leaving our process group) or was re-parented to init is still found. The direct
child is never waited on through psutil: its launcher reaps it, so its exit code is kept.
"""

import contextlib
import os
import signal

import psutil
import trio


def snapshot(pid: int) -> list[psutil.Process]:
    """Every descendant of *pid* now (empty if it is gone)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


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


async def kill_tree(pid: int, *, exited: trio.Event, grace: float) -> None:
    """Terminate *pid* (a session leader) and all its descendants.

    *exited* is set by whoever reaps the direct child. Returns when the direct child has exited
    and no snapshotted descendant is left, or after SIGKILL when grace ran out.
    """
    tree = snapshot(pid)
    if not exited.is_set():
        _signal_group(pid, signal.SIGTERM)
    _signal_all(tree, signal.SIGTERM)
    with trio.move_on_after(grace):
        await exited.wait()
        while alive(tree):  # noqa: ASYNC110 - no event exists for a non-child exit
            await trio.sleep(0.02)
    tree = alive(tree + snapshot(pid))
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
