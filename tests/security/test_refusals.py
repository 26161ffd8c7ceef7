"""What fails closed says so without naming an escape hatch (#36): a child whose nested spawn is
refused — by the workflow mode, by the fleet's cap — is told that it was and why, never which
mode, setting or flag would have allowed it; the parent, asking the same, is told the way.

Real children through the real supervisor: a scripted ``lead`` (a fork with the ``subagent``
tool) asks for a worker in plan mode and for one more child in a full fleet.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from orchestrator._config import Config
from orchestrator._errors import CapacityError, PolicyError
from orchestrator.core._supervisor import SpawnRequest, open_supervisor
from orchestrator.launch._ray_node import ChildActor
from tests.orchestrator.launch.test_nodeplan import plan_in

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.slow

CEILING = 90
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}
#: Words that would tell a child how to get past a refusal.
HATCHES = ("fleet mode", "switch", "raise", "--allow", "allow_unsandboxed", "config", "set ")
LEAD = """
turns:
  - steps:
      - tool: subagent
        args: {agent: worker, task: "write it"}
      - reply: "lead: {{last}}"
"""
HOLD = "turns:\n  - steps:\n      - wait: 60\n        until: steer\n"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Path]]:
    home = Path(tempfile.mkdtemp(prefix="frf-", dir="/tmp"))  # short socket paths
    repo = tmp_path / "repo"
    agents = repo / ".fleet" / "agents"
    agents.mkdir(parents=True)
    (repo / "README.md").write_text("# sample\n")
    front = {
        "name": "lead",
        "description": "delegates",
        "tools": ["read"],
        "mode": "fork",
        "subagent_agents": ["worker", "scout"],
    }
    (agents / "lead.md").write_text(f"---\n{json.dumps(front)}\n---\nYou delegate.\n")
    git_env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=repo, env=git_env, check=True, capture_output=True)
    try:
        yield {"home": home, "repo": repo, "tmp": tmp_path}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def config(world: dict[str, Path], **settings: Any) -> Config:
    path = world["tmp"] / "lead.yaml"
    path.write_text(textwrap.dedent(LEAD))
    return Config(
        home=world["home"],
        session="t",
        workspace=world["repo"],
        agents_scope="project",
        model=f"scripted:{path}",
        **settings,
    )


def assert_no_hatch(text: str) -> None:
    for word in HATCHES:
        assert word not in text, f"{word!r} in what the child was told: {text}"


async def test_a_child_refused_by_the_mode_is_not_told_how_to_switch_it(world) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(config(world)) as sup:
            sup.set_mode("plan")
            [lead] = await sup.spawn([SpawnRequest(task="delegate", agent="lead")])
            [note] = await sup.wait([lead.key])
            report = note["report"]
            assert report.startswith("lead: "), report
            assert "is not allowed in plan mode" in report, report
            assert_no_hatch(report)
            # The parent asking the same is told the way.
            with pytest.raises(PolicyError, match="switch with fleet mode build"):
                await sup.spawn([SpawnRequest(task="write it", agent="worker")])


async def test_a_child_refused_by_the_cap_is_not_told_to_raise_it(world) -> None:
    hold = world["tmp"] / "hold.yaml"
    hold.write_text(HOLD)
    with trio.fail_after(CEILING):
        async with open_supervisor(config(world, max_subagents=2)) as sup:
            [held] = await sup.spawn([SpawnRequest(task="hold", model=f"scripted:{hold}")])
            [lead] = await sup.spawn([SpawnRequest(task="delegate", agent="lead")])
            [note] = await sup.wait([lead.key])
            report = note["report"]
            assert "would exceed max_subagents 2" in report, report
            assert_no_hatch(report)
            with pytest.raises(CapacityError, match="or raise the cap"):
                await sup.spawn([SpawnRequest(task="one more")])
            await sup.stop([held.key])


def test_a_nodes_sandbox_refusal_keeps_its_way_past_for_the_parent() -> None:
    # A child on a Ray node whose node cannot (or may not) sandbox it: the node's answer
    # carries the refusal and the hint apart; the parent's error has both, a child's neither.
    actor = ChildActor()
    actor.make_node("t", "a1")
    actor.write_files({os.path.join(actor.node_dir, "loadout.json"): b"{}"})
    try:
        plan = plan_in(actor.node_dir, sandbox_off=True)
        answer = actor.start((), "/", {}, None, plan.plain())
    finally:
        actor.clean_up()
    assert answer["refused"] == (
        "spawn a1: the sandbox is turned off (sandbox: off) and every child must be sandboxed"
    )
    assert_no_hatch(answer["refused"])
    assert "--allow-unsandboxed" in answer["hint"]
    error = PolicyError(answer["refused"], hint=answer["hint"])
    assert "--allow-unsandboxed" in str(error)  # what the parent is told
    assert error.for_child == answer["refused"]  # what a nested caller is told
