"""The kill ladder: SIGTERM the group, grace, SIGKILL the survivors.

The process tree is read *before* signalling, so a grandchild that called ``setsid`` (leaving
our process group) is still found. One that has already left the tree — its
parent exited and it was re-parented to init, or the child itself died first — is found by the
run's marker, an environment variable every process the child starts inherits
(:data:`MARKER_ENV`). The direct child is never waited on through psutil: its launcher reaps it,
so its exit code is kept.
"""

import contextlib
import os
import signal
from collections.abc import Collection
from typing import Final

import attrs
import psutil
import trio

#: Set in a child's environment to a value unique to its run; descendants inherit it.
MARKER_ENV: Final = "FLEET_RUN"
#: How far up the parent chain :func:`in_child_tree` looks (a tree is never this deep).
_MAX_ANCESTRY: Final = 1024


def run_marker(session: str, key: str) -> str:
    """The :data:`MARKER_ENV` value of *key*'s run under this supervisor process."""
    return f"{session}/{key}/{os.getpid()}"


def _is_our_marker(value: str, session: str) -> bool:
    """Whether *value* marks a run of *session* under this supervisor process (any key)."""
    return value.startswith(f"{session}/") and value.endswith(f"/{os.getpid()}")


def _parent_and_marker(pid: int) -> tuple[int, str | None]:
    """*pid*'s parent and run marker from ``/proc`` (``(0, None)`` once it is unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        parent = int(stat[stat.rindex(b")") + 2 :].split(None, 2)[1])
    except (OSError, ValueError, IndexError):
        return 0, None
    return parent, _marker_of(pid)


def _marker_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            block = handle.read()
    except OSError:
        return None
    entry = MARKER_ENV.encode() + b"="
    for item in block.split(b"\0"):
        if item.startswith(entry):
            return item[len(entry) :].decode(errors="replace")
    return None


def in_child_tree(pid: int, children: Collection[int], session: str) -> str | None:
    """Why *pid* belongs to a child of ours, or ``None`` when it does not.

    It does when *pid* or any ancestor is one of *children* (the launched pids), or carries
    the run marker of one of this supervisor's runs of *session* (every process a child starts
    inherits it; a process that dropped it is still found by its ancestry). A few ``/proc``
    reads: run it off the event loop. Without ``/proc`` only the marker via psutil is checked.
    """
    if not os.path.isdir("/proc/self"):
        try:
            value = psutil.Process(pid).environ().get(MARKER_ENV)
        except psutil.Error:
            return None
        return (
            f"pid {pid} carries run marker {value}"
            if value and _is_our_marker(value, session)
            else None
        )
    current, seen = pid, 0
    while current > 1 and seen < _MAX_ANCESTRY:
        if current in children:
            return f"pid {pid} descends from child pid {current}"
        parent, marker = _parent_and_marker(current)
        if marker is not None and _is_our_marker(marker, session):
            return f"pid {current} carries run marker {marker}"
        current, seen = parent, seen + 1
    return None


@attrs.frozen
class ProcessTable:
    """Every visible process's parent and run marker, read in one pass."""

    parents: dict[int, int]
    markers: dict[int, str]

    def descendants(self, pid: int) -> list[int]:
        """*pid*'s descendants at the time of the reading."""
        children: dict[int, list[int]] = {}
        for child, parent in self.parents.items():
            children.setdefault(parent, []).append(child)
        found, stack = [], list(children.get(pid, ()))
        while stack:
            child = stack.pop()
            found.append(child)
            stack.extend(children.get(child, ()))
        return found

    def marked(self, marker: str | None, *, besides: int) -> list[int]:
        """Every process but *besides* whose environment carries *marker*."""
        if marker is None:
            return []
        return [pid for pid, value in self.markers.items() if value == marker and pid != besides]


def read_table() -> ProcessTable:
    """The process table now: ``/proc`` read directly where there is one, else psutil."""
    if not os.path.isdir("/proc/self"):
        parents, markers = {}, {}
        for process in psutil.process_iter(["ppid", "environ"]):
            parents[process.pid] = process.info["ppid"] or 0
            value = (process.info["environ"] or {}).get(MARKER_ENV)
            if value is not None:
                markers[process.pid] = value
        return ProcessTable(parents=parents, markers=markers)
    # Raw reads are a tenth of what a psutil.Process and a dict per process cost.
    parents, markers = {}, {}
    entry = MARKER_ENV.encode() + b"="
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
            # The command name is in parentheses and may hold anything, spaces and ")" too.
            parents[int(name)] = int(stat[stat.rindex(b")") + 2 :].split(None, 2)[1])
            with open(f"/proc/{name}/environ", "rb") as handle:
                block = handle.read()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if block.startswith(entry):
            at = 0
        else:
            found = block.find(b"\0" + entry)
            at = found + 1 if found >= 0 else -1
        if at >= 0:
            end = block.find(b"\0", at)
            value = block[at + len(entry) : end if end >= 0 else None]
            markers[int(name)] = value.decode(errors="replace")
    return ProcessTable(parents=parents, markers=markers)


@attrs.define(eq=False)
class _Reading:
    done: trio.Event = attrs.Factory(trio.Event)
    table: ProcessTable | None = None


@attrs.define(eq=False)
class _Tables:
    """Readings shared by concurrent callers: a fleet-wide stop reads ``/proc`` a few times,
    not twice per child. A caller only shares a reading that began after it asked."""

    waiting: _Reading | None = None  # asked for, not begun: anyone may still join it
    running: _Reading | None = None

    async def fresh(self) -> ProcessTable:
        while True:
            reading = self.waiting
            if reading is not None:
                await reading.done.wait()
            else:
                reading = self.waiting = _Reading()
                try:
                    while self.running is not None:  # begun before we asked: not enough
                        await self.running.done.wait()
                    self.waiting, self.running = None, reading
                    # ~10 us a process: off the event loop, so every other child's I/O
                    # goes on meanwhile.
                    reading.table = await trio.to_thread.run_sync(read_table)
                finally:
                    if self.waiting is reading:
                        self.waiting = None
                    if self.running is reading:
                        self.running = None
                    reading.done.set()
            if reading.table is not None:
                return reading.table
            # Its reader was cancelled before it could read: read again.


_TABLES: trio.lowlevel.RunVar[_Tables] = trio.lowlevel.RunVar("fleet_process_tables")


async def _fresh_table() -> ProcessTable:
    try:
        tables = _TABLES.get()
    except LookupError:
        tables = _Tables()
        _TABLES.set(tables)
    return await tables.fresh()


def _processes(pids: list[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found


async def _tree(pid: int, marker: str | None) -> list[psutil.Process]:
    """*pid*'s descendants and every other process with its run's *marker*, now."""
    table = await _fresh_table()
    return _processes(table.descendants(pid) + table.marked(marker, besides=pid))


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
    tree = await _tree(pid, marker)
    if not exited.is_set():
        _signal_group(pid, signal.SIGTERM)
    _signal_all(tree, signal.SIGTERM)
    with trio.move_on_after(grace):
        await exited.wait()
        while alive(tree):  # noqa: ASYNC110 - no event exists for a non-child exit
            await trio.sleep(0.02)
    tree = alive(tree + await _tree(pid, marker))
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
