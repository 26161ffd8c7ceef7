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

from orchestrator._config import Config
from orchestrator._errors import PolicyError, UsageError
from orchestrator._ownership import LockTable
from orchestrator._registry import State
from orchestrator._supervisor import SpawnRequest, Supervisor, open_supervisor

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


