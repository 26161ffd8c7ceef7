"""The loop gate wired into real runs: builtin children (scripted models) whose calls the
supervisor refuses before they run, steers and stops; and the pure event-to-gate mapping."""

import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import ipc
from orchestrator._config import Config
from orchestrator._records import State
from orchestrator.core._loops import LoopWatch
from orchestrator.core._supervisor import SpawnRequest, Supervisor, open_supervisor
from tests.fakes.model_server import ModelServer

CEILING = 60
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def start(tool: str, digest: str) -> ipc.Event:
    return ipc.Event(activity="tool_start", tool=tool, input_digest=digest)


def end(tool: str, digest: str, *, failed: bool = False) -> ipc.Event:
    return ipc.Event(activity="tool_end", tool=tool, output_digest=digest, failed=failed)


# -- the event-to-gate mapping (pure) ---------------------------------------------------------


def test_a_checked_call_repeating_the_same_result_is_refused_and_says_looping() -> None:
    watch = LoopWatch()
    for _ in range(2):
        assert watch.check(start("read", "i1")) is None
        assert watch.observe(end("read", "o1")) is None
    trip = watch.check(start("read", "i1"))
    assert trip is not None
    assert trip.kind == "repeat"
    assert not trip.stop
    assert "read was called with the same input 3 times" in trip.line
    assert watch.activity.startswith("looping: read was called")
    assert watch.check(start("ls", "i2")) is None  # a different call: no longer looping
    assert watch.activity == ""


def test_an_observed_call_with_growing_output_never_trips() -> None:
    watch = LoopWatch()
    for n in range(8):
        assert watch.observe(start("read", "log")) is None
        assert watch.observe(end("read", f"out{n}")) is None
    assert watch.activity == ""


def test_three_failures_in_a_row_trip_and_the_third_trip_stops() -> None:
    watch = LoopWatch()
    trips = []
    for n in range(9):
        watch.observe(start("read", f"missing{n}"))
        trips.append(watch.observe(end("read", f"e{n}", failed=True)))
    kinds = [(t.kind, t.stop) for t in trips if t is not None]
    assert kinds == [("failures", False), ("failures", False), ("failures", True)]
    watch.new_prompt()
    assert watch.activity == ""
    assert watch.gate.interventions == 0


def test_events_without_digests_are_not_judged() -> None:
    watch = LoopWatch()
    for _ in range(5):
        assert watch.check(ipc.Event(activity="tool_start", tool="read")) is None
        assert watch.observe(ipc.Event(activity="tool_end", tool="read")) is None


# -- real builtin children ------------------------------------------------------------------


@attrs.define
class Env:
    home: Path
    repo: Path
    scripts: Path

    def config(self, name: str, text: str) -> Config:
        path = self.scripts / f"{name}.yaml"
        path.write_text(textwrap.dedent(text))
        return Config(
            home=self.home,
            session="t",
            workspace=self.repo,
            agents_scope="project",
            model=f"scripted:{path}",
        )


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    home = Path(tempfile.mkdtemp(prefix="flg-", dir="/tmp"))  # short socket paths
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("# sample\n\nThe answer is 42.\n")
    git_env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=repo, env=git_env, check=True, capture_output=True)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    try:
        yield Env(home=home, repo=repo, scripts=scripts)
    finally:
        shutil.rmtree(home, ignore_errors=True)


READ = "      - tool: read\n        args: {path: README.md}\n"

REPEAT = f"""
turns:
  - steps:
{READ * 3}      - wait: 30
        until: steer
      - reply: "{{{{tool:read}}}}"
"""


async def until_activity(sup: Supervisor, key: str, prefix: str) -> str:
    while True:
        activity = str(sup.peek([key])["agents"][0]["activity"])
        if activity.startswith(prefix):
            return activity
        await trio.sleep(0.02)


@pytest.mark.slow
async def test_the_third_identical_read_is_refused_before_it_runs(env: Env) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config("repeat", REPEAT)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="read it")])
            activity = await until_activity(sup, record.key, "looping")
            assert "read was called with the same input 3 times" in activity
            await sup.steer(record.key, "go on")
            [note] = await sup.wait([record.key])
            await sup.stop([record.key])
    report = note["report"]
    assert report.startswith('error: this read call ({"path":"README.md"}) was refused: ')
    assert "loop gate: read was called with the same input 3 times" in report
    assert "The answer is 42" not in report  # the refused call never ran


FAILING = """
turns:
  - steps:
      - tool: read
        args: {path: missing-a.txt}
      - tool: read
        args: {path: missing-b.txt}
      - tool: read
        args: {path: missing-c.txt}
      - wait: 30
        until: steer
      - reply: "steered: {{steer}}"
"""


@pytest.mark.slow
async def test_three_failing_results_in_a_row_steer_the_child(env: Env) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config("failing", FAILING)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="read them")])
            [note] = await sup.wait([record.key])
            await sup.stop([record.key])
    assert note["report"] == (
        "steered: loop gate: 3 tool calls failed in a row (last: read); stop and rethink "
        "the approach before calling tools again"
    )


POLL_STEP = "      - tool: read\n        args: {path: grow.log}\n      - wait: 0.3\n"
POLL = f"""
turns:
  - steps:
{POLL_STEP * 5}      - reply: "polled: {{{{last}}}}"
"""


@pytest.mark.slow
async def test_polling_a_growing_log_does_not_trip(env: Env) -> None:
    log = env.repo / "grow.log"
    log.write_text("line 0\n")

    async def grow() -> None:
        for n in range(1, 1000):
            await trio.sleep(0.05)
            with log.open("a") as f:
                f.write(f"line {n}\n")

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(grow)
            async with open_supervisor(env.config("poll", POLL)) as sup:
                [record] = await sup.spawn([SpawnRequest(task="poll the log")])
                [note] = await sup.wait([record.key])
                await sup.stop([record.key])
            nursery.cancel_scope.cancel()
    assert note["report"].startswith("polled: ")
    assert "refused" not in note["report"]
    assert "line 1\n" in note["report"]
    assert "incomplete" not in note


STUCK = f"""
turns:
  - steps:
{READ * 5}      - wait: 30
      - reply: "never"
"""


@pytest.mark.slow
async def test_the_third_trip_in_one_prompt_stops_the_child_incomplete(env: Env) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config("stuck", STUCK)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="read it")])
            notes: list[dict[str, Any]] = []
            while not notes or notes[-1].get("state") != "stopped":
                notes += await sup.wait([record.key])
            assert record.state is State.STOPPED
            handoff = record.handoff()
    assert handoff["incomplete"].startswith("loop gate: read was called with the same input")
    assert notes[-1]["incomplete"] == handoff["incomplete"]


SAME_READ = {"tool_calls": [{"name": "read", "arguments": {"path": "README.md"}}]}
#: Children racing the gate at once, and rounds of them: the race was lost 1 run in 7.
RACERS = 4
ROUNDS = 3


@pytest.mark.slow
async def test_no_model_request_leaves_a_child_once_the_gate_stopped_it(env: Env) -> None:
    # Five identical reads: the third, fourth and fifth are refused, the fifth is the third
    # trip and stops the child. Its refusal must be the last thing it does: a sixth model
    # request (the script's "never") would be a turn the gate had already ended.
    config = Config(
        home=env.home,
        session="t",
        workspace=env.repo,
        agents_scope="project",
        sandbox="off",
        allow_unsandboxed=True,
    )
    async with ModelServer() as srv:
        for round_ in range(ROUNDS):
            names = [f"r{round_}c{n}" for n in range(RACERS)]
            for name in names:
                srv.script(name, [SAME_READ] * 5 + [{"text": "never"}])
            with trio.fail_after(CEILING):
                async with open_supervisor(config) as sup:
                    records = await sup.spawn(
                        [
                            SpawnRequest(
                                task="read it", model=f"openai:fake-model@{srv.base_url(n)}/v1"
                            )
                            for n in names
                        ]
                    )
                    for record in records:
                        while record.state is not State.STOPPED:  # noqa: ASYNC110
                            await trio.sleep(0.02)
                        assert record.incomplete.startswith("loop gate: read was called")
            for name in names:
                asked = [r for r in srv.requests(name) if r.api]
                assert len(asked) == 5, f"{name}: {len(asked)} model requests, the last " + str(
                    asked[-1].body["messages"][-1]
                )
