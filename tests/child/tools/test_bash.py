"""bash: real shells, real process groups, checked with psutil."""

import os
import signal

import psutil
import pytest
import trio

from child.tools import ToolContext, build_tools
from child.tools._bash import DRAIN_GRACE, KILL_GRACE


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    return root


async def bash(ws, command, *, ceiling=15.0, bash_timeout=120.0, **extra):
    ctx = ToolContext(workspace=ws, bash_timeout=bash_timeout)
    with trio.fail_after(ceiling):
        return await build_tools(["bash"], ctx)["bash"].run(ctx, {"command": command, **extra})


def dead(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def read_pid(path):
    with trio.fail_after(5):
        # Another process writes the file; there is nothing to wait on but the file itself.
        while not path.exists() or not path.read_text().strip():  # noqa: ASYNC110
            await trio.sleep(0.01)
    return int(path.read_text())


async def test_output_is_combined_and_the_exit_code_reported(ws):
    result = await bash(ws, "echo out; echo err >&2; exit 3")
    assert result.text == "out\nerr\n[exit code 3]"
    assert result.is_error


async def test_runs_in_the_workspace_with_empty_stdin(ws):
    result = await bash(ws, "pwd; cat; echo done")
    assert result.text == f"{ws}\ndone\n[exit code 0]"
    assert not result.is_error


async def test_runs_in_its_own_session(ws):
    result = await bash(ws, "ps -o sid= -p $$; echo $$")
    sid, pid = result.text.split()[:2]
    assert sid == pid
    assert int(sid) != os.getsid(0)


async def test_timeout_kills_a_grandchild(ws):
    pid_file = ws / "pid"
    start = trio.current_time()
    result = await bash(ws, "sleep 300 & echo $! > pid; wait", timeout=0.5)
    elapsed = trio.current_time() - start
    assert result.is_error
    assert result.text == "[timed out after 0.5 s; the command's process group was killed]"
    assert dead(int(pid_file.read_text()))
    assert elapsed < 0.5 + KILL_GRACE


async def test_default_timeout_comes_from_the_context(ws):
    result = await bash(ws, "sleep 30", bash_timeout=0.3)
    assert result.text == "[timed out after 0.3 s; the command's process group was killed]"


async def test_timeout_kills_a_grandchild_that_left_the_group(ws):
    command = "setsid sh -c 'ps -o pgid= -p $$ > pgid; echo $$ > pid; exec sleep 300' & wait"
    result = await bash(ws, command, timeout=0.5)
    assert result.is_error
    pid = int((ws / "pid").read_text())
    assert int((ws / "pgid").read_text()) == pid  # its own group: killpg alone would miss it
    assert dead(pid)


@pytest.mark.slow
async def test_a_grandchild_ignoring_sigterm_gets_sigkill_after_the_grace(ws):
    script = "sh -c 'trap \"\" TERM; echo $$ > pid; while :; do sleep 0.05; done' & wait"
    start = trio.current_time()
    result = await bash(ws, script, timeout=0.5)
    elapsed = trio.current_time() - start
    assert result.is_error
    assert dead(int((ws / "pid").read_text()))
    assert 0.5 + KILL_GRACE <= elapsed < 0.5 + 2 * KILL_GRACE + 1


async def test_background_processes_do_not_outlive_the_call(ws):
    result = await bash(ws, "sleep 300 >/dev/null 2>&1 & echo $! > pid; echo started")
    assert result.text == "started\n[exit code 0]"
    assert dead(int((ws / "pid").read_text()))


@pytest.mark.slow
async def test_a_grandchild_holding_the_pipe_delays_the_result_by_the_drain_grace_only(ws):
    start = trio.current_time()
    result = await bash(ws, "sleep 300 & echo $! > pid; echo started")
    elapsed = trio.current_time() - start
    assert result.text == "started\n[exit code 0]"
    assert dead(int((ws / "pid").read_text()))
    assert DRAIN_GRACE <= elapsed < DRAIN_GRACE + KILL_GRACE + 1


async def test_cancelling_the_call_kills_the_process_group(ws):
    ctx = ToolContext(workspace=ws)
    tool = build_tools(["bash"], ctx)["bash"]
    command = "sleep 300 & echo $! > pid; trap '' TERM; echo $$ > shell; wait"
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tool.run, ctx, {"command": command})
            grandchild = await read_pid(ws / "pid")
            shell = await read_pid(ws / "shell")
            assert not dead(grandchild)
            start = trio.current_time()
            nursery.cancel_scope.cancel()
        elapsed = trio.current_time() - start
    assert dead(grandchild)
    assert dead(shell)
    assert elapsed < 2 * KILL_GRACE + 1


async def test_output_is_capped_keeping_the_tail(ws):
    result = await bash(ws, "seq 1 100000")
    lines = result.text.splitlines()
    assert lines[0].startswith("[truncated: first ")
    assert lines[-2:] == ["100000", "[exit code 0]"]
    assert len(lines) <= 2002
    assert len(result.text.encode()) <= 50 * 1024 + 200


async def test_a_flood_on_one_line_is_capped_in_memory_and_in_the_result(ws):
    result = await bash(ws, "head -c 3000000 /dev/zero | tr '\\0' a")
    first = result.text.splitlines()[0]
    assert first.startswith("[truncated: first 1 lines and ")
    assert "earlier bytes not shown]" in first
    assert len(result.text.encode()) <= 50 * 1024 + 200
    assert result.text.endswith("a\n[exit code 0]")


@pytest.mark.parametrize("timeout", [0, -1, "5", True, 4000])
async def test_bad_timeouts_are_refused(ws, timeout):
    result = await bash(ws, "true", timeout=timeout)
    assert result.is_error
    assert result.text.startswith("bash: ")
    assert "timeout" in result.text


async def test_killed_by_a_signal_reports_a_negative_exit_code(ws):
    result = await bash(ws, "kill -KILL $$")
    assert result.text == f"[exit code {-signal.SIGKILL}]"
