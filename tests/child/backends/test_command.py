"""Backend ``command``: the task on stdin, stdout is the final text, the exit code decides."""

import sys

import psutil
import pytest
import trio

from child.backends._command import CommandBackend
from tests.child.backends._backends import Host, make_loadout


def backend_for(tmp_path, code: str):
    host = Host()
    loadout = make_loadout(tmp_path, backend="command", command=[sys.executable, "-c", code])
    return CommandBackend.from_loadout(loadout, host), host


async def test_the_task_goes_in_on_stdin_and_stdout_is_the_final_text(tmp_path):
    backend, host = backend_for(
        tmp_path,
        "import os, sys; task = sys.stdin.read(); "
        "print(f'## Summary\\n{task} in {os.getcwd()} child={os.environ[\"FLEET_CHILD\"]}')",
    )
    with trio.fail_after(20):
        result = await backend.run_turn("count the files")
    assert result.ok, result.error
    assert result.text == f"## Summary\ncount the files in {tmp_path / 'ws'} child=1\n"
    assert [e.activity for e in host.events] == ["tool_start", "tool_end"]
    assert host.events[-1].text == "exit 0"


async def test_a_non_zero_exit_fails_the_turn_with_the_last_stderr_line(tmp_path):
    backend, _host = backend_for(
        tmp_path,
        "import sys; print('partial'); print('boom\\nreal cause', file=sys.stderr); sys.exit(3)",
    )
    with trio.fail_after(20):
        result = await backend.run_turn("go")
    assert not result.ok
    assert result.text == "partial\n"
    assert result.error == "command exited with 3: real cause"


async def test_steer_is_refused_and_peek_is_told_why(tmp_path):
    backend, host = backend_for(tmp_path, "print('x')")
    with pytest.raises(ValueError, match="cannot be steered"):
        await backend.steer("go east")
    [event] = host.events
    assert (event.activity, event.text) == ("message", "steer ignored: a command cannot be steered")


@pytest.mark.slow
async def test_abort_kills_the_command_group_promptly(tmp_path):
    marker = tmp_path / "grandchild.pid"
    backend, _host = backend_for(
        tmp_path,
        "import subprocess, sys, time; "
        f"p = subprocess.Popen(['sleep', '300']); open({str(marker)!r}, 'w').write(str(p.pid)); "
        "time.sleep(300)",
    )
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:

            async def abort_when_started():
                while not marker.exists():  # noqa: ASYNC110 - a file is the only signal
                    await trio.sleep(0.05)
                await backend.abort()

            nursery.start_soon(abort_when_started)
            start = trio.current_time()
            result = await backend.run_turn("go")
            elapsed = trio.current_time() - start
    assert result.aborted
    assert elapsed < 10
    pid = int(marker.read_text())
    with trio.fail_after(5):
        while _running(pid):  # noqa: ASYNC110 - no event for a grandchild's exit
            await trio.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_side_question_is_refused(tmp_path):
    backend, _host = backend_for(tmp_path, "print('x')")
    result = await backend.run_turn("what now?", side=True)
    assert (result.ok, result.error) == (False, "command backend cannot answer side questions")
