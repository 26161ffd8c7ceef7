"""The agent-CLI backends' shared half: the CLI process, the stall watch, the turn outcome."""

import sys

import psutil
import trio

from child.backends._cli_backend import CliProcess, CliTurn, StallWatch, preview, side_question


async def test_stall_watch_fires_only_when_armed_and_silent(autojump_clock):
    watch = StallWatch(seconds=5.0)
    fired_at: list[float] = []

    async def wait() -> None:
        await watch.wait_stalled()
        fired_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.sleep(100)  # disarmed: silence does not count
        assert fired_at == []
        watch.arm()  # t = 100
        await trio.sleep(4)
        watch.touch()  # t = 104
        await trio.sleep(3)
        watch.disarm()  # a tool runs from t = 107 ...
        await trio.sleep(50)
        watch.arm()  # ... until t = 157
    assert fired_at == [162.0]


async def test_terminate_takes_the_whole_tree_and_keeps_the_stderr_tail(tmp_path):
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True); "
        "print('first\\nlast words', file=sys.stderr, flush=True); time.sleep(300)"
    )
    cli = await CliProcess.start(
        "test",
        [sys.executable, "-c", code],
        env={"PATH": "/usr/bin:/bin"},
        cwd=str(tmp_path),
        stderr_path=tmp_path / "stderr.log",
    )
    with trio.fail_after(20):
        assert cli.process.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            line += await cli.process.stdout.receive_some(64)
        grandchild = int(line)
        while cli.stderr_line() != "last words":  # noqa: ASYNC110 - a file is the signal
            await trio.sleep(0.02)
        returncode = await cli.terminate(grace=1.0)
    assert returncode == -15
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == "zombie"


def test_a_turn_keeps_its_first_error_over_an_abort():
    turn = CliTurn()
    turn.fail("first")
    turn.fail("second")
    turn.abort_requested = True
    turn.finish(aborted=True)
    assert turn.done.is_set()
    result = turn.result()
    assert (result.ok, result.error, result.aborted) == (False, "first", False)
    aborted = CliTurn(text="partial")
    aborted.abort_requested = True
    aborted.finish()
    assert (aborted.result().aborted, aborted.result().text) == (True, "partial")


def test_previews_and_side_questions_are_one_line():
    assert preview({"path": "a\nb"}) == '{"path":"a\\nb"}'
    assert len(preview("x" * 500)) == 80
    assert side_question("why?").endswith(": why?")
