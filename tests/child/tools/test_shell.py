"""shell: real background shells, real process groups, checked with psutil."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import trio
from trio._core import _thread_cache as trio_thread_cache

from child.tools import ToolContext, build_tools
from child.tools._shell import MAX_KEPT, MAX_LINES, MAX_RUNNING, ShellTool, strip_ansi
from child.tools._shellproc import KILL_GRACE


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
async def shells(ws):
    """A ``(tool, ctx, notes)`` triple whose shells are all stopped afterwards."""
    notes: list[str] = []
    ctx = ToolContext(workspace=ws, notify=notes.append)
    tool = build_tools(["bash"], ctx)["shell"]
    assert isinstance(tool, ShellTool)
    try:
        yield tool, ctx, notes
    finally:
        with trio.fail_after(15):
            await tool.aclose()


async def call(shells, **args):
    tool, ctx, _ = shells
    with trio.fail_after(15):
        return await tool.run(ctx, args)


async def start(shells, command, **extra):
    result = await call(shells, action="start", command=command, **extra)
    assert not result.is_error, result.text
    return result.text.split()[1]  # "started s1 (pid N)"


async def finished(shells, sid, timeout=10):
    with trio.fail_after(timeout):
        await shells[0].shells[sid].finished.wait()


def dead(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def read_pids(path, count):
    with trio.fail_after(5):
        # Another process writes the file; there is nothing to wait on but the file itself.
        while len(path.read_text().split()) < count if path.exists() else True:  # noqa: ASYNC110
            await trio.sleep(0.01)
    return [int(word) for word in path.read_text().split()]


def test_only_a_toolset_with_bash_gets_shell(ws):
    ctx = ToolContext(workspace=ws)
    assert "shell" in build_tools(["read", "bash"], ctx)
    assert "shell" not in build_tools(["read", "edit", "write", "todo"], ctx)


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("\x1b[1;31merror\x1b[0m: boom", "error: boom"),
        ("\x1b]0;title\x07prompt$ ", "prompt$ "),
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("10%\r50%\r100% done\r", "100% done"),
        ("\x1b(Bplain\x1b=\ttab\x00", "plain\ttab"),
        ("\x1b[?25lhidden cursor\x1b[?25h", "hidden cursor"),
    ],
)
def test_ansi_and_carriage_returns_are_stripped(raw, clean):
    assert strip_ansi(raw) == clean


async def test_output_is_kept_ansi_stripped_and_read_back(shells, ws):
    sid = await start(shells, "pwd; printf '\\033[32mgreen\\033[0m\\n'; echo err >&2; exit 3")
    assert sid == "s1"
    await finished(shells, sid)
    result = await call(shells, action="read", id=sid)
    assert result.text == f"[s1 exited 3; 3 lines]\n{ws}\ngreen\nerr"
    listed = await call(shells, action="list")
    assert listed.text.startswith("s1 [exited 3] 3 lines · pwd;")


async def test_only_the_last_2000_lines_are_kept(shells):
    sid = await start(shells, "seq 1 2500")
    await finished(shells, sid)
    shell = shells[0].shells[sid]
    assert shell.total == 2500
    assert list(shell.lines) == [str(n) for n in range(501, 2501)]
    result = await call(shells, action="read", id=sid, lines=5000)
    header, *lines = result.text.splitlines()
    assert header == f"[s1 exited 0; 2500 lines, showing the last {MAX_LINES}]"
    assert lines == [str(n) for n in range(501, 2501)]
    tail = await call(shells, action="read", id=sid, lines=2)
    assert tail.text.splitlines()[1:] == ["2499", "2500"]


async def test_an_unterminated_line_is_read_too(shells):
    sid = await start(shells, "printf 'Password: '; sleep 30")
    with trio.fail_after(5):
        while not shells[0].shells[sid].partial:  # noqa: ASYNC110 - output arrives on its own
            await trio.sleep(0.01)
    result = await call(shells, action="read", id=sid)
    assert result.text.splitlines()[1:] == ["Password: "]


async def test_a_watch_fires_exactly_once_across_many_matching_lines(shells):
    command = "echo booting; for i in $(seq 1 200); do echo ready $i; done; sleep 0.3; echo ready"
    sid = await start(shells, command, watch=r"ready \d+|^ready$")
    await finished(shells, sid)
    notes = shells[2]
    assert len(notes) == 1, notes
    assert "background shell s1" in notes[0]
    assert notes[0].endswith("matched: ready 1 (read it with shell read s1)")
    assert "watch /ready \\d+|^ready$/ fired" in (await call(shells, action="list")).text


async def test_a_watch_is_checked_at_start(shells):
    bad = await call(shells, action="start", command="true", watch="(unclosed")
    assert bad.is_error
    assert bad.text.startswith("shell: watch '(unclosed' is not a valid regex:")
    assert "\n" not in bad.text
    long = await call(shells, action="start", command="true", watch="x" * 201)
    assert long.is_error
    assert long.text == "shell: watch is 201 characters; keep it <= 200"
    assert shells[0].shells == {}  # nothing was started


async def test_bad_calls_are_one_line_errors(shells):
    for args, text in [
        ({"action": "dance"}, "shell: action 'dance' is not one of start, read, list, kill"),
        ({"action": "read", "id": "s9"}, "shell: no shell 's9' (kept: none); see shell list"),
        ({"action": "kill"}, "shell: argument 'id' must be a string (got NoneType)"),
        ({"action": "start"}, "shell: argument 'command' must be a string (got NoneType)"),
    ]:
        result = await call(shells, **args)
        assert result.is_error
        assert result.text == text


async def test_kill_stops_the_group_with_sigterm(shells, ws):
    sid = await start(shells, f"sleep 60 & echo $! > {ws}/pid; wait")
    [grandchild] = await read_pids(ws / "pid", 1)
    leader = shells[0].shells[sid].process.pid
    started = time.monotonic()
    result = await call(shells, action="kill", id=sid)
    assert result.text == "s1 killed (SIGTERM)"
    assert time.monotonic() - started < KILL_GRACE
    assert dead(grandchild)
    assert dead(leader)
    again = await call(shells, action="kill", id=sid)
    assert again.text == "s1 already killed (SIGTERM)"


@pytest.mark.slow
async def test_a_grandchild_ignoring_sigterm_is_killed_after_the_grace(shells, ws):
    # SIG_IGN is inherited: both sleeps, and the shell, ignore the SIGTERM.
    command = (
        f"trap '' TERM; sleep 60 & echo $! >> {ws}/pids; sleep 60 & echo $! >> {ws}/pids; wait"
    )
    sid = await start(shells, command)
    pids = await read_pids(ws / "pids", 2)
    leader = shells[0].shells[sid].process.pid
    started = time.monotonic()
    result = await call(shells, action="kill", id=sid)
    elapsed = time.monotonic() - started
    assert result.text == f"s1 killed (SIGKILL after {KILL_GRACE:g} s)"
    assert KILL_GRACE - 0.2 <= elapsed < KILL_GRACE + 2
    assert all(dead(pid) for pid in [leader, *pids])
    assert group_members(leader) == []  # the whole group is gone


def group_members(pgid):
    """The live (non-zombie) processes in group *pgid*."""
    members = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
    return members


async def test_what_a_finished_leader_left_in_its_group_is_stopped(shells, ws):
    sid = await start(shells, f"sleep 60 & echo $! > {ws}/pid")
    [grandchild] = await read_pids(ws / "pid", 1)
    await finished(shells, sid)
    assert dead(grandchild)
    assert (await call(shells, action="read", id=sid)).text == "[s1 exited 0; 0 lines]"


@pytest.mark.slow
async def test_at_most_eight_run_and_the_twenty_most_recent_are_kept(shells):
    tool = shells[0]
    for n in range(1, MAX_KEPT - MAX_RUNNING + 1):  # twelve that finish
        await finished(shells, await start(shells, f"echo {n}"))
    for _ in range(MAX_RUNNING):
        await start(shells, "sleep 60")
    refused = await call(shells, action="start", command="sleep 60")
    assert refused.is_error
    assert refused.text == (
        "shell: 8 shells are already running (s13, s14, s15, s16, s17, s18, s19, s20); "
        "kill one first"
    )
    assert list(tool.shells) == [f"s{n}" for n in range(1, 21)]
    await call(shells, action="kill", id="s13")
    # The 21st start evicts the oldest finished shell (s1), not a running one.
    assert await start(shells, "sleep 60") == "s21"
    assert list(tool.shells) == [f"s{n}" for n in range(2, 22)]
    await call(shells, action="kill", id="s14")
    assert await start(shells, "sleep 60") == "s22"
    assert "s2" not in tool.shells
    assert len(tool.shells) == MAX_KEPT
    gone = await call(shells, action="read", id="s1")
    assert gone.text.startswith("shell: no shell 's1' (kept: s3, s4,")


async def test_aclose_stops_every_shell_and_refuses_new_ones(ws):
    ctx = ToolContext(workspace=ws)
    tool = build_tools(["bash"], ctx)["shell"]
    for _ in range(3):
        await tool.run(ctx, {"action": "start", "command": "sleep 60"})
    pids = [shell.process.pid for shell in tool.shells.values()]  # type: ignore[attr-defined]
    with trio.fail_after(10):
        await tool.aclose()  # type: ignore[attr-defined]
    assert all(dead(pid) for pid in pids)
    refused = await tool.run(ctx, {"action": "start", "command": "true"})
    assert refused.text == "shell: the child is shutting down; no new shells"


async def test_aclose_sends_each_running_shell_sigterm_before_any_sigkill(ws):
    # A dev server gets its SIGTERM (to flush, to remove its pid file) before the guardian's
    # SIGKILL: each shell's trap writes what it got, and only a SIGTERM can be trapped.
    ctx = ToolContext(workspace=ws)
    tool = build_tools(["bash"], ctx)["shell"]
    for n in range(2):
        command = (
            f"trap 'echo TERM > {ws}/got{n}; exit 0' TERM; echo up > {ws}/up{n}; sleep 60 & wait"
        )
        await tool.run(ctx, {"action": "start", "command": command})
    with trio.fail_after(10):
        # The traps are set once each shell wrote its file.
        while not all((ws / f"up{n}").exists() for n in range(2)):  # noqa: ASYNC110
            await trio.sleep(0.02)
    started = time.monotonic()
    with trio.fail_after(10):
        await tool.aclose()  # type: ignore[attr-defined]
    assert [(ws / f"got{n}").read_text() for n in range(2)] == ["TERM\n", "TERM\n"]
    assert time.monotonic() - started < KILL_GRACE  # they left on the SIGTERM, in parallel


# -- dying with the child --------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import json, sys, trio
    from child.tools import ToolContext, build_tools

    async def main(ws):
        ctx = ToolContext(workspace=ws)
        tool = build_tools(["bash"], ctx)["shell"]
        for command in sys.argv[2:]:
            await tool.run(ctx, {"action": "start", "command": command})
        guardian = tool._guardian._process
        leaders = [shell.process.pid for shell in tool.shells.values()]
        print(json.dumps({"leaders": leaders, "guardian": guardian.pid}), flush=True)
        await trio.sleep_forever()

    trio.run(main, sys.argv[1])
    """
)


def _run_child(ws, *commands):
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(ws), *commands], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    return child, json.loads(child.stdout.readline())


async def _all_dead(pids, timeout=5):
    with trio.move_on_after(timeout):
        while not all(dead(pid) for pid in pids):  # noqa: ASYNC110 - the kernel kills them
            await trio.sleep(0.05)
    return [pid for pid in pids if not dead(pid)]


@pytest.mark.slow
async def test_every_shell_dies_when_the_child_is_sigkilled(ws):
    # A pipeline and a TERM-ignoring background grandchild: not just the leaders.
    child, started = _run_child(
        ws,
        f"trap '' TERM; sleep 300 & echo $! >> {ws}/pids; wait",
        f"sleep 300 | cat & echo $! >> {ws}/pids; wait",
        "exec sleep 300",
    )
    try:
        grandchildren = await read_pids(ws / "pids", 2)
        leaders = started["leaders"]
        assert not any(dead(pid) for pid in [*leaders, *grandchildren])
        child.send_signal(signal.SIGKILL)
        child.wait(5)
        assert await _all_dead([*leaders, *grandchildren, started["guardian"]]) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        child.wait(5)
        child.stdout.close()


@pytest.mark.slow
async def test_a_leader_dies_with_the_child_even_without_the_guardian(ws):
    # PR_SET_PDEATHSIG alone: the guardian is gone before the child is killed.
    child, started = _run_child(ws, "exec sleep 300", "exec sleep 301")
    try:
        os.kill(started["guardian"], signal.SIGKILL)
        assert await _all_dead([started["guardian"]]) == []
        assert not any(dead(pid) for pid in started["leaders"])
        child.send_signal(signal.SIGKILL)
        child.wait(5)
        assert await _all_dead(started["leaders"]) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        child.wait(5)
        child.stdout.close()


@pytest.mark.slow
async def test_a_shell_outlives_trios_idle_worker_threads(shells, monkeypatch):
    # PR_SET_PDEATHSIG fires when the forking *thread* exits, and trio retires an idle worker
    # thread after IDLE_TIMEOUT (10 s; 0.3 s here, so the test waits for the retirement
    # itself, not for 10 real seconds): a shell forked from one would be SIGKILLed then.
    monkeypatch.setattr(trio_thread_cache, "IDLE_TIMEOUT", 0.3)
    # A worker thread exists (a fork through to_thread would reuse it), and will retire.
    worker = await trio.to_thread.run_sync(threading.current_thread)
    sid = await start(shells, "exec sleep 60")
    pid = shells[0].shells[sid].process.pid
    with trio.fail_after(10):
        while worker.is_alive():  # noqa: ASYNC110 - trio retires it
            await trio.sleep(0.05)
    await trio.sleep(0.5)  # a PR_SET_PDEATHSIG kill would have landed by now
    assert not dead(pid)
    assert shells[0].shells[sid].returncode is None
