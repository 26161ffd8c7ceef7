"""The kill ladder's process table: real processes, read from the real ``/proc``."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from orchestrator.launch import _kill
from orchestrator.launch._kill import MARKER_ENV, ProcessTable, kill_tree, read_table

CEILING = 30


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def _start(
    started: list[subprocess.Popen[bytes]], argv: list[str], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(argv, env=env, start_new_session=True)
    started.append(process)
    # Popen returns once the child's exec has begun (vfork), which can be before the kernel
    # has laid out the new environment: until then /proc/PID/environ is not yet what we gave.
    environ = Path(f"/proc/{process.pid}/environ")
    given = {f"{key}={value}".encode() for key, value in env.items()}
    _wait_for(lambda: _environ(environ) == given, f"pid {process.pid}'s environment")
    return process


def _environ(path: Path) -> set[bytes]:
    try:
        return set(path.read_bytes().split(b"\0")) - {b""}
    except OSError:
        return set()


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + CEILING
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_the_table_knows_parents_and_exact_markers(processes) -> None:
    base = {"PATH": os.environ.get("PATH", "/usr/bin")}
    # The marker as the first entry, in the middle, and one that only shares a prefix.
    first = _start(processes, ["sleep", "30"], {MARKER_ENV: "s/a1/9", **base})
    middle = _start(processes, ["sleep", "30"], {**base, MARKER_ENV: "s/a1/9", "Z": "1"})
    longer = _start(processes, ["sleep", "30"], {**base, MARKER_ENV: "s/a1/99"})
    tree = _start(processes, ["sh", "-c", "sleep 30 & sleep 30 & wait"], base)
    _wait_for(lambda: len(read_table().descendants(tree.pid)) == 2, "the shell's children")
    table = read_table()
    assert table.parents[first.pid] == os.getpid()
    assert sorted(table.marked("s/a1/9", besides=0)) == sorted([first.pid, middle.pid])
    assert table.marked("s/a1/9", besides=first.pid) == [middle.pid]
    assert table.marked("s/a1/99", besides=0) == [longer.pid]
    assert table.marked(None, besides=0) == []
    assert table.descendants(first.pid) == []
    assert table.descendants(os.getpid()) != []


def test_descendants_follow_every_generation() -> None:
    table = ProcessTable(parents={2: 1, 3: 2, 4: 3, 5: 1, 6: 9}, markers={})
    assert sorted(table.descendants(1)) == [2, 3, 4, 5]
    assert table.descendants(4) == []


async def test_concurrent_callers_share_readings_taken_after_they_asked(monkeypatch) -> None:
    readings: list[float] = []

    def counted() -> ProcessTable:
        readings.append(time.monotonic())
        time.sleep(0.05)  # a slow /proc: later callers pile up behind this reading
        # Each reading is told apart by its number.
        return ProcessTable(parents={len(readings) - 1: 0}, markers={})

    monkeypatch.setattr(_kill, "read_table", counted)
    asked: list[tuple[float, ProcessTable]] = []

    async def one() -> None:
        when = time.monotonic()
        table = await _kill._fresh_table()
        asked.append((when, table))

    async with trio.open_nursery() as nursery:
        for _ in range(16):
            nursery.start_soon(one)
    assert len(asked) == 16
    # The first caller's reading, then one more for everyone who asked while it ran.
    assert len(readings) <= 2
    for when, table in asked:
        [number] = table.parents
        assert readings[number] >= when  # never a reading that began before the caller asked


async def test_kill_tree_ends_a_group_and_an_escaped_marked_process(processes) -> None:
    marker = f"kill-test/{os.getpid()}"
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), MARKER_ENV: marker}
    leader = _start(processes, [sys.executable, "-c", "import time; time.sleep(60)"], env)
    escaped = _start(processes, ["sleep", "61"], env)  # its own session: not in the group
    exited = trio.Event()

    async def reap() -> None:
        await trio.to_thread.run_sync(leader.wait)
        exited.set()

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reap)
            await kill_tree(leader.pid, exited=exited, grace=1.0, marker=marker)
    assert leader.returncode == -15
    assert escaped.wait(timeout=CEILING) in {-15, -9}


IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _start_ignoring_sigterm(
    started: list[subprocess.Popen[bytes]], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """A process in a session of its own that ignores SIGTERM (once this returns)."""
    process = subprocess.Popen(
        [sys.executable, "-c", IGNORES_SIGTERM],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    started.append(process)
    assert process.stdout is not None
    with process.stdout:
        assert process.stdout.readline() == b"ready\n"
    return process


async def test_an_escaped_marked_process_that_ignores_sigterm_ends_by_sigkill(processes) -> None:
    grace = 1.0
    marker = f"kill-test/{os.getpid()}"
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), MARKER_ENV: marker}
    leader = _start(processes, [sys.executable, "-c", "import time; time.sleep(60)"], env)
    # Its own session, so not in the leader's group: only the marker finds it.
    escaped = _start_ignoring_sigterm(processes, env)
    exited = trio.Event()

    async def reap() -> None:
        await trio.to_thread.run_sync(leader.wait)
        exited.set()

    started = time.monotonic()
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reap)
            await kill_tree(leader.pid, exited=exited, grace=grace, marker=marker)
    budget = 2 * grace + 1 - (time.monotonic() - started)
    try:
        code = escaped.wait(timeout=max(budget, 0.01))
    except subprocess.TimeoutExpired:
        raise AssertionError("the escaped process outlived the kill ladder") from None
    assert code == -signal.SIGKILL
    assert leader.returncode == -signal.SIGTERM


def test_in_child_tree_finds_descendants_and_our_markers_only(processes) -> None:
    base = {"PATH": os.environ.get("PATH", "/usr/bin")}
    ours = _kill.run_marker("s", "a1")
    # A child, and its grandchild with the marker dropped: found by ancestry.
    child = _start(processes, ["sh", "-c", "env -i sleep 30 & wait"], base)
    _wait_for(lambda: len(read_table().descendants(child.pid)) == 1, "the grandchild")
    [grandchild] = read_table().descendants(child.pid)
    assert "child pid" in (_kill.in_child_tree(grandchild, {child.pid}, "s") or "")
    assert _kill.in_child_tree(grandchild, set(), "s") is None
    # Out of the tree (its own session, another parent) but with our marker: found by it.
    marked = _start(processes, ["sleep", "30"], {**base, MARKER_ENV: ours})
    assert "marker" in (_kill.in_child_tree(marked.pid, set(), "s") or "")
    # Another session's run, or another supervisor's (another pid), is not ours.
    other = _start(processes, ["sleep", "30"], {**base, MARKER_ENV: "s/a1/1"})
    foreign = _start(processes, ["sleep", "30"], {**base, MARKER_ENV: ours.replace("s/", "x/")})
    assert _kill.in_child_tree(other.pid, set(), "s") is None
    assert _kill.in_child_tree(foreign.pid, set(), "s") is None
    # The test process itself (the parent's position) is never inside a child's tree.
    assert _kill.in_child_tree(os.getpid(), {child.pid}, "s") is None
