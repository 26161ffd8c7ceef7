"""The supervisor's API in process: ``open_supervisor`` with real child processes.

Workflow modes, nested spawn, ownership over IPC and the reject log, each driven through the
public API (``spawn``, ``wait``, ``stop``, ``set_mode``, ``peek``) against real ``python -m
child`` processes running scripted models in a real git repository.
"""

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from orchestrator._config import Config, load_config
from orchestrator._errors import PolicyError, UsageError
from orchestrator._records import State
from orchestrator.core._supervisor import SpawnRequest, Supervisor, open_supervisor
from orchestrator.governance._ownership import LockTable

pytestmark = pytest.mark.slow

CEILING = 60
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


@attrs.define
class Env:
    """A real repository with project agent definitions, scripts and a private FLEET_HOME."""

    home: Path
    repo: Path
    scripts: Path

    def script(self, name: str, text: str) -> str:
        path = self.scripts / f"{name}.yaml"
        path.write_text(textwrap.dedent(text))
        return f"scripted:{path}"

    def agent(self, name: str, prompt: str = "You are a test agent.", **front: Any) -> None:
        directory = self.repo / ".fleet" / "agents"
        directory.mkdir(parents=True, exist_ok=True)
        header = json.dumps({"name": name, "description": f"test agent {name}", **front})
        (directory / f"{name}.md").write_text(f"---\n{header}\n---\n{prompt}\n")

    def config(self, **overrides: Any) -> Config:
        settings: dict[str, Any] = {"agents_scope": "project", **overrides}
        return Config(home=self.home, session="t", workspace=self.repo, **settings)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    # Socket paths must stay short (sun_path), so FLEET_HOME is not under pytest's tmp_path.
    home = Path(tempfile.mkdtemp(prefix="fsa-", dir="/tmp"))
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "README.md").write_text("# sample\n\nThe answer is 42.\n")
    (repo / "src" / "app.py").write_text("def main():\n    return 42\n")
    git_env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=repo, env=git_env, check=True, capture_output=True)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    try:
        yield Env(home=home, repo=repo, scripts=scripts)
    finally:
        shutil.rmtree(home, ignore_errors=True)


REPLY_LAST = """
turns:
  - steps:
      - tool: read
        args: {path: README.md}
      - reply: "## Summary\\n{{last}}"
"""

HOLD = """
turns:
  - steps:
      - wait: 30
        until: steer
      - reply: "held until {{steer}}"
  - steps:
      - reply: "resumed: {{task}}"
"""


async def until(condition: Callable[[], bool]) -> None:
    """Poll *condition* (a state with no event of its own) until it holds."""
    while True:
        if condition():
            return
        await trio.sleep(0.02)


async def settle(sup: Supervisor, key: str) -> dict[str, Any]:
    [note] = await sup.wait([key])
    return note


# -- workflow modes --------------------------------------------------------------------------


async def test_plan_mode_refuses_a_writer_before_reserving_anything(env: Env) -> None:
    env.agent("writer", tools=["read", "edit", "write", "bash"], mode="worktree")
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(model=env.script("r", REPLY_LAST))) as sup:
            assert sup.set_mode("plan") == "plan"
            with pytest.raises(PolicyError) as refused:
                await sup.spawn([SpawnRequest(task="change it", agent="writer")])
            message = str(refused.value)
            assert "\n" not in message
            assert message.startswith("spawn writer: tool ")
            assert "is not allowed in plan mode" in message
            assert "fleet mode build" in message
            assert refused.value.exit_code == 4
            assert sup.capacity.used == 0
            assert list(sup.registry.live()) == []
            assert sup.peek()["agents"] == []


async def test_a_batch_with_one_writer_is_refused_whole_in_review_mode(env: Env) -> None:
    env.agent("writer", tools=["read", "write"], mode="worktree")
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(model=env.script("r", REPLY_LAST))) as sup:
            sup.set_mode("review")
            with pytest.raises(PolicyError, match="review mode"):
                await sup.spawn(
                    [SpawnRequest(task="look"), SpawnRequest(task="change", agent="writer")]
                )
            assert sup.capacity.used == 0
            assert list(sup.registry.live()) == []


async def test_an_unknown_mode_is_a_usage_error_and_keeps_the_current_one(env: Env) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config()) as sup:
            with pytest.raises(UsageError, match="'ship' is not one of build, plan"):
                sup.set_mode("ship")
            assert sup.set_mode(None) == "build"


async def test_read_only_scouts_still_launch_in_plan_mode(env: Env) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(model=env.script("r", REPLY_LAST))) as sup:
            sup.set_mode("plan")
            [record] = await sup.spawn([SpawnRequest(task="where is the answer")])
            note = await settle(sup, record.key)
            assert note["state"] == "idle"
            assert "The answer is 42." in note["report"]
            [entry] = sup.peek()["agents"]
            assert entry["workflow_mode"] == "plan"
            assert entry["mode"] == "scout"


async def test_running_children_survive_a_mode_change(env: Env) -> None:
    env.agent("writer", tools=["read", "write"], mode="worktree", model=env.script("h", HOLD))
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(model=env.script("r", REPLY_LAST))) as sup:
            [writer] = await sup.spawn([SpawnRequest(task="hold on", agent="writer")])
            sup.set_mode("plan")
            [scout] = await sup.spawn([SpawnRequest(task="look")])
            await sup.steer(writer.key, "go")
            note = await settle(sup, writer.key)
            assert note["report"] == "held until go"
            # A mode change gates launches only: the writer takes another prompt in plan mode.
            await sup.prompt(writer.key, "again")
            assert (await settle(sup, writer.key))["report"] == "resumed: again"
            modes = {a["key"]: a["workflow_mode"] for a in sup.peek()["agents"]}
            assert modes == {writer.key: "build", scout.key: "plan"}
            assert writer.state is State.IDLE


# -- nested spawn ----------------------------------------------------------------------------

LEAD = """
turns:
  - steps:
      - tool: subagent
        args: {agent: scout, task: "find the answer"}
      - reply: "lead: {{last}}"
"""


async def test_nested_spawn_returns_only_the_grandchilds_final_text(env: Env) -> None:
    env.agent("lead", tools=["read"], mode="fork", subagent_agents=["scout"])
    scout = env.script(
        "scout",
        """
        turns:
          - steps:
              - say: "scanning"
              - tool: grep
                args: {pattern: answer}
              - reply: "## Summary\\nfound it"
        """,
    )
    seen: list[dict[str, Any]] = []
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(model=scout)) as sup:
            [lead] = await sup.spawn(
                [SpawnRequest(task="delegate", agent="lead", model=env.script("lead", LEAD))]
            )
            while not any(n["key"] == lead.key for n in seen):
                seen += await sup.wait()
            assert [n["key"] for n in seen] == [lead.key]
            assert seen[0]["report"] == "lead: ## Summary\nfound it"
            grandchild = sup.registry.find("a2")
            assert (grandchild.depth, grandchild.parent) == (2, lead.key)
            assert grandchild.state is State.STOPPED
            assert sup.capacity.used == 1
            assert sup.lane.statistics()["working"] == 0


async def test_a_grandchilds_question_reaches_the_parent_and_the_answer_returns(env: Env) -> None:
    env.agent("lead", tools=["read"], mode="fork", subagent_agents=["scout"])
    asks = env.script(
        "asks",
        """
        turns:
          - steps:
              - tool: ask_parent
                args: {question: "Which database?"}
              - reply: "use {{last}}"
        """,
    )
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(model=asks)) as sup:
            [lead] = await sup.spawn(
                [SpawnRequest(task="delegate", agent="lead", model=env.script("lead", LEAD))]
            )
            [note] = await sup.wait()
            assert note["key"] == "a2"
            assert note["question"] == {"id": "q1", "text": "Which database?"}
            assert sup.registry.find("a2").state is State.WAITING
            sup.answer("q1", "postgres")
            note = await settle(sup, lead.key)
            assert note["report"] == "lead: use postgres"
            assert await sup.wait() == []


async def test_nested_spawn_does_not_deadlock_a_one_slot_lane(env: Env) -> None:
    env.agent("lead", tools=["read"], mode="fork", subagent_agents=["scout"])
    with trio.fail_after(CEILING):
        async with open_supervisor(
            env.config(lane=1, model=env.script("scout", REPLY_LAST))
        ) as sup:
            [lead] = await sup.spawn(
                [SpawnRequest(task="delegate", agent="lead", model=env.script("lead", LEAD))]
            )
            note = await settle(sup, lead.key)
            assert note["report"].startswith("lead: ## Summary\n")
            assert "The answer is 42." in note["report"]


async def test_nested_refusals_come_back_to_the_child_as_one_line_tool_results(env: Env) -> None:
    # mid is allowed to spawn, but at depth 2 its own subagent call would be depth 3.
    env.agent("mid", tools=["read"], mode="fork", subagent_agents=["scout"])
    env.agent("writer", tools=["read", "write"], mode="worktree")
    env.agent("lead", tools=["read"], mode="fork", subagent_agents=["mid", "writer"])
    mid = env.script(
        "mid",
        """
        turns:
          - steps:
              - tool: subagent
                args: {agent: scout, task: "too deep"}
              - reply: "mid: {{last}}"
        """,
    )
    env.agent("mid", tools=["read"], mode="fork", subagent_agents=["scout"], model=mid)
    lead = env.script(
        "lead",
        """
        turns:
          - steps:
              - tool: subagent
                args: {agent: scout, task: "not allowlisted"}
              - reply: "{{last}}"
          - steps:
              - tool: subagent
                args: {agent: mid, task: "go deeper"}
              - reply: "{{last}}"
          - steps:
              - tool: subagent
                args: {agent: writer, task: "write in plan mode"}
              - reply: "{{last}}"
        """,
    )
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(model=env.script("s", REPLY_LAST))) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", agent="lead", model=lead)])
            first = (await settle(sup, record.key))["report"]
            assert first == (
                "subagent refused: subagent: scout is not in lead's subagent_agents "
                "allowlist (mid, writer)"
            )
            await sup.prompt(record.key, "next")
            second = (await settle(sup, record.key))["report"]
            assert second == (
                "mid: subagent refused: subagent: depth 3 exceeds the maximum depth 2"
            )
            sup.set_mode("plan")
            await sup.prompt(record.key, "next")
            third = (await settle(sup, record.key))["report"]
            assert third.startswith("subagent refused: spawn writer: tool write is not allowed")
            for report in (first, second, third):
                assert "\n" not in report
            assert sup.capacity.used == 1
            assert [r.key for r in sup.registry.live()] == [record.key]


@pytest.mark.parametrize("end", ["stop", "kill"])
async def test_a_grandchild_is_stopped_when_its_caller_ends_first(env: Env, end: str) -> None:
    env.agent("lead", tools=["read"], mode="fork", subagent_agents=["scout"])
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(model=env.script("hold", HOLD))) as sup:
            [lead] = await sup.spawn(
                [SpawnRequest(task="t", agent="lead", model=env.script("lead", LEAD))]
            )
            await until(lambda: "a2" in sup.registry.records)
            grandchild = sup.registry.find("a2")
            await until(lambda: grandchild.state is State.WORKING and not grandchild.queued)
            if end == "stop":
                await sup.stop([lead.key])
            else:
                assert lead.pid is not None
                os.kill(lead.pid, 9)
            await until(lambda: grandchild.state is State.STOPPED)
            # A killed lead's end is seen by its own run, which may come after the grandchild's.
            ended = State.STOPPED if end == "stop" else State.FAILED
            await until(lambda: lead.state is ended)
            assert sup.capacity.used == 0
            assert sup.lane.statistics()["working"] == 0
            assert list(sup.registry.live()) == []


async def test_a_nested_spawn_over_capacity_is_refused_and_reserves_nothing(env: Env) -> None:
    env.agent("lead", tools=["read"], mode="fork", subagent_agents=["scout"])
    hold = env.script("hold", HOLD)
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(max_subagents=2, model=hold)) as sup:
            await sup.spawn([SpawnRequest(task="fill the cap")])
            [lead] = await sup.spawn(
                [SpawnRequest(task="t", agent="lead", model=env.script("lead", LEAD))]
            )
            report = (await settle(sup, lead.key))["report"]
            assert report.startswith("lead: subagent refused: spawn: 1 new child(ren) would ")
            assert "exceed max_subagents 2 (2 live, 0 free)" in report
            assert sup.capacity.used == 2


async def test_a_failed_nested_launch_releases_everything_it_reserved(env: Env) -> None:
    env.agent("lead", tools=["read"], mode="fork", subagent_agents=["scout"])
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(model=env.script("s", REPLY_LAST))) as sup:
            # The grandchild will be a2: a file where its scratch directory goes makes the
            # launch fail after its slot was reserved and its record created.
            sup.paths.scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
            (sup.paths.scratch / "a2").write_text("in the way")
            [lead] = await sup.spawn(
                [SpawnRequest(task="t", agent="lead", model=env.script("lead", LEAD))]
            )
            report = (await settle(sup, lead.key))["report"]
            assert report.startswith("lead: subagent refused: spawn a2: ")
            assert "\n" not in report
            assert sup.capacity.used == 1
            assert [r.key for r in sup.registry.live()] == [lead.key]
            assert set(sup.runs) == {lead.key}


# -- ownership over IPC ----------------------------------------------------------------------


@attrs.define(eq=False)
class CountingLocks(LockTable):
    """The real lock table, counting each release that actually gave locks back."""

    released: dict[str, int] = attrs.Factory(dict)

    def release(self, owner: str) -> tuple[str, ...]:
        specs = super().release(owner)
        if specs:
            self.released[owner] = self.released.get(owner, 0) + 1
        return specs


WRITE_AND_HOLD = """
turns:
  - steps:
      - tool: write
        args: {path: "{{task}}", content: "x\\n"}
      - say: "{{last}}"
      - wait: 30
        until: steer
      - reply: "{{tool:write}}"
"""


async def test_an_overlapping_writer_is_refused_with_the_holder_named(env: Env) -> None:
    hold = env.script("hold", WRITE_AND_HOLD)
    tell = env.script(
        "tell",
        """
        turns:
          - steps:
              - tool: write
                args: {path: "{{task}}", content: "y\\n"}
              - reply: "{{last}}"
        """,
    )
    env.agent("wa", tools=["read", "write"], mode="worktree", ownership=["src/**"], model=hold)
    env.agent("wb", tools=["read", "write"], mode="worktree", ownership=["src/app.py"], model=tell)
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config()) as sup:
            [a] = await sup.spawn([SpawnRequest(task="src/new.py", agent="wa")])
            await until(lambda: a.key in sup.locks.snapshot())
            repo = env.repo.resolve()
            assert sup.peek()["locks"] == {a.key: [f"{repo}/src/**"]}
            [b] = await sup.spawn([SpawnRequest(task="src/app.py", agent="wb")])
            report = (await settle(sup, b.key))["report"]
            assert report.startswith(
                f"write refused: lock for {b.key}: path {repo}/src/app.py is owned by {a.key} "
                f"({repo}/src/**)"
            )
            assert "\n" not in report
            assert (env.repo / "src" / "app.py").read_text() == "def main():\n    return 42\n"
            # Written where a works (its worktree, or the repository itself).
            assert (Path(a.workspace) / "src" / "new.py").read_text() == "x\n"
            assert set(sup.locks.snapshot()) == {a.key}


async def test_locks_are_released_exactly_once_however_a_writer_ends(env: Env) -> None:
    ends = {
        "stop": WRITE_AND_HOLD,
        "exit": "turns:\n  - steps:\n      - tool: write\n        args: {path: '{{task}}', "
        "content: x}\n      - crash: 3\n",
        "crash": WRITE_AND_HOLD,
        "close": WRITE_AND_HOLD,
    }
    for name, text in ends.items():
        env.agent(
            f"w{name}",
            tools=["read", "write"],
            mode="worktree",
            ownership=[f"out/{name}/**"],
            model=env.script(name, text),
        )
    locks = CountingLocks()
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(max_subagents=4)) as sup:
            sup.locks = locks
            records = await sup.spawn(
                [SpawnRequest(task=f"out/{n}/f.txt", agent=f"w{n}", name=n) for n in ends]
            )
            keys = {r.name: r.key for r in records}
            # The exiting writer may be gone already; the others hold their locks until they end.
            holders = {keys[n] for n in ("stop", "crash", "close")}
            await until(lambda: holders <= set(locks.snapshot()))
            await sup.stop([keys["stop"]])
            [note] = await sup.wait([keys["exit"]])
            assert note["failure"]["kind"] == "exited"
            crash = sup.registry.find("crash")
            assert crash.pid is not None
            os.kill(crash.pid, 9)
            [note] = await sup.wait([keys["crash"]])
            assert note["failure"]["kind"] == "killed"
            assert set(locks.snapshot()) == {keys["close"]}
        # Leaving the supervisor closes it: the last writer's locks go with it.
    assert locks.snapshot() == {}
    assert locks.released == dict.fromkeys(keys.values(), 1)


# -- the reject log --------------------------------------------------------------------------


def rejected(sup: Supervisor) -> list[dict[str, Any]]:
    path = sup.paths.logs / "rejected.jsonl"
    assert path.stat().st_mode & 0o777 == 0o600
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_the_reject_log_records_policy_refusals_and_lock_conflicts(env: Env) -> None:
    env.agent("writer", tools=["read", "write"], mode="worktree")
    hold = env.script("hold", WRITE_AND_HOLD)
    env.agent("wa", tools=["read", "write"], mode="worktree", ownership=["src/**"], model=hold)
    writes = env.script(
        "wb",
        """
        turns:
          - steps:
              - tool: write
                args: {path: src/app.py, content: "mine"}
              - reply: "{{last}}"
        """,
    )
    env.agent("wb", tools=["read", "write"], mode="worktree", model=writes)
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(reject_log=True)) as sup:
            [a] = await sup.spawn([SpawnRequest(task="src/new.py", agent="wa")])
            await until(lambda: a.key in sup.locks.snapshot())
            sup.set_mode("plan")
            with pytest.raises(PolicyError):
                await sup.spawn([SpawnRequest(task="no", agent="writer")])
            sup.set_mode("build")
            [b] = await sup.spawn([SpawnRequest(task="t", agent="wb")])
            report = (await settle(sup, b.key))["report"]
            assert report.startswith(f"write refused: lock for {b.key}: ")
            entries = rejected(sup)
            text = (sup.paths.logs / "rejected.jsonl").read_text()
            token = sup.runs[b.key].token
    assert [(e["kind"], e["owner"]) for e in entries] == [
        ("policy", "parent"),
        ("lock-conflict", b.key),
    ]
    assert entries[0]["args"]["agents"] == ["writer"]
    assert entries[0]["args"]["mode"] == "plan"
    assert "not allowed in plan mode" in entries[0]["args"]["error"]
    assert entries[1]["args"]["holder"] == a.key
    [path] = entries[1]["args"]["paths"]
    assert path.endswith("/src/app.py")
    assert token not in text
    assert sup.session_key.hex() not in text


async def test_a_nested_policy_refusal_is_logged_under_the_callers_key(env: Env) -> None:
    env.agent("lead", tools=["read"], mode="fork", subagent_agents=["scout"])
    lead = env.script(
        "lead",
        """
        turns:
          - steps:
              - tool: subagent
                args: {agent: worker, task: "not allowlisted"}
              - reply: "{{last}}"
        """,
    )
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(reject_log=True)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", agent="lead", model=lead)])
            await settle(sup, record.key)
            [entry] = rejected(sup)
    assert entry["kind"] == "policy"
    assert entry["owner"] == record.key
    assert entry["args"]["subagent"] == "worker"


async def test_the_reject_log_is_off_unless_asked_for(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.agent("writer", tools=["read", "write"], mode="worktree")
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config()) as sup:
            sup.set_mode("plan")
            with pytest.raises(PolicyError):
                await sup.spawn([SpawnRequest(task="no", agent="writer")])
            assert not (sup.paths.logs / "rejected.jsonl").exists()
    monkeypatch.setenv("FLEET_REJECT_LOG", "1")
    assert load_config(cwd=env.repo, home=env.home).reject_log is True
    monkeypatch.setenv("FLEET_REJECT_LOG", "0")
    assert load_config(cwd=env.repo, home=env.home).reject_log is False
    (env.home / "config.yaml").write_text("subagents:\n  reject_log: true\n")
    assert load_config(cwd=env.repo, home=env.home).reject_log is True


# -- a side question right behind the spawn ----------------------------------------------------

HANG_THEN_SIDE = """
turns:
  - steps:
      - hang: true
side:
  - steps:
      - reply: "side: still here"
"""


async def test_an_ask_right_after_the_spawn_is_answered_every_time(env: Env) -> None:
    # The ask's pause races the first prompt: it used to lose its abort (the child had not
    # begun the turn when the abort ran) or let a prompt waiting for the turn lock start the
    # hanging turn; either way the ask never returned. Several tries, as the race is timing.
    model = env.script("hang", HANG_THEN_SIDE)
    with trio.fail_after(4 * CEILING):
        async with open_supervisor(env.config(model=model)) as sup:
            for attempt in range(4):
                [child] = await sup.spawn([SpawnRequest(task=f"hang {attempt}")])
                with trio.fail_after(30):
                    assert await sup.ask(child.key, "are you there?") == "side: still here"
                await sup.stop([child.key])


async def test_a_child_stopped_incomplete_says_why_in_its_handoff_and_note(env: Env) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(env.config(model=env.script("hold", HOLD))) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t")])
            await until(lambda: record.state is State.WORKING and not record.queued)
            await sup.runs[record.key].stop_incomplete("budget spent: 120 of 100 tokens")
            assert record.state is State.STOPPED
            handoff = record.handoff()
            assert handoff["incomplete"] == "budget spent: 120 of 100 tokens"
            [note] = await sup.wait([record.key])
            assert note["incomplete"] == "budget spent: 120 of 100 tokens"
            assert note["error"] == "incomplete: budget spent: 120 of 100 tokens"
            assert list(sup.registry.live()) == []
