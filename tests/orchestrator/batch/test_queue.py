"""The integration queue's bookkeeping: order, refresh, and what a later supervisor reads back."""

import os
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from orchestrator._config import load_config
from orchestrator._errors import UsageError
from orchestrator.batch import IntegrationQueue


@attrs.define
class FakeWorktrees:
    repo: Path
    snapshots: dict[str, Any] = attrs.Factory(dict)
    holding: set[str] = attrs.Factory(set)

    async def change(self, key: str, paths: list[str]) -> list[Any]:
        raise AssertionError("not reached")

    async def apply(self, key: str, names: list[str] | None) -> dict[str, Any]:
        raise AssertionError("not reached")


def queue_of(tmp_path: Path, keys: list[str], gate: str = "true") -> IntegrationQueue:
    trees = FakeWorktrees(repo=tmp_path, snapshots=dict.fromkeys(keys), holding=set(keys))
    return IntegrationQueue(worktrees=trees, gate=gate, root=tmp_path / "session")


def test_held_changes_queue_in_key_order_not_text_order(tmp_path):
    queue = queue_of(tmp_path, ["a10", "a2", "a9"])
    assert [e["key"] for e in queue.show()] == ["a2", "a9", "a10"]
    assert {e["status"] for e in queue.show()} == {"queued"}


def test_a_change_discarded_or_applied_by_hand_leaves_the_queue(tmp_path):
    queue = queue_of(tmp_path, ["a1", "a2"])
    queue.show()
    del queue.worktrees.snapshots["a1"]
    queue.worktrees.holding.discard("a1")
    assert [e["key"] for e in queue.show()] == ["a2"]


def test_a_later_supervisor_reads_back_each_changes_status_and_reason(tmp_path):
    queue = queue_of(tmp_path, ["a1", "a2"])
    queue.show()
    queue.entries["a2"].status = "held"
    queue.entries["a2"].reason = "conflict with the parent's tree: a.txt"
    queue._record(queue.entries["a2"])
    again = queue_of(tmp_path, ["a1", "a2"])
    again.restore()
    shown = {e["key"]: (e["status"], e["reason"]) for e in again.show()}
    assert shown == {"a1": ("queued", ""), "a2": ("held", "conflict with the parent's tree: a.txt")}


async def test_land_without_a_gate_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"no integration\.gate"):
        await queue_of(tmp_path, ["a1"], gate="  ").land()


async def test_land_with_nothing_queued_is_none(tmp_path):
    assert await queue_of(tmp_path, []).land() is None


def test_config_reads_integration_auto_and_timeout_and_refuses_bad_values(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "integration:\n  gate: sh check.sh\n  auto: true\n  timeout: 600\n"
    )
    config = load_config(home=tmp_path, cwd=tmp_path)
    assert (config.integration_gate, config.integration_auto) == ("sh check.sh", True)
    assert config.integration_timeout == 600.0
    (tmp_path / "config.yaml").write_text("integration:\n  gate: sh check.sh\n")
    config = load_config(home=tmp_path, cwd=tmp_path)
    assert (config.integration_auto, config.integration_timeout) == (False, 1800.0)
    for bad in ("auto: yes-please", "timeout: 0", "timeout: -5", "timeout: soon", "wait: 3"):
        (tmp_path / "config.yaml").write_text(f"integration:\n  gate: x\n  {bad}\n")
        with pytest.raises(UsageError, match=r"^config\.yaml: integration") as caught:
            load_config(home=tmp_path, cwd=tmp_path)
        assert "\n" not in str(caught.value)


@attrs.define
class _Change:
    path: str
    why: str = ""
    landed: bool = False


PATCH = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-one\n+two\n"


def _gated(tmp_path: Path, gate: str, timeout: float) -> IntegrationQueue:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("one\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "i"]):
        subprocess.run(argv, cwd=repo, env={**os.environ, **env}, check=True)

    @attrs.define
    class Trees(FakeWorktrees):
        async def change(self, key: str, paths: list[str]) -> list[Any]:
            return [(_Change("a.txt"), PATCH)]

    trees = Trees(repo=repo, snapshots={"a1": None}, holding={"a1"})
    return IntegrationQueue(
        worktrees=trees,
        gate=gate,
        root=tmp_path / "session",
        gate_timeout=timeout,
        allow_unsandboxed=True,
    )


@pytest.mark.slow
async def test_a_gate_past_integration_timeout_is_stopped_and_the_change_held(tmp_path):
    queue = _gated(tmp_path, "sleep 60", timeout=1.0)
    started = trio.current_time()
    landed = await queue.land()
    assert landed is not None
    entry, fields = landed
    assert trio.current_time() - started < 30
    assert (entry.status, fields) == ("held", {})
    assert "ran past 1 s" in entry.gate
    assert (tmp_path / "repo" / "a.txt").read_text() == "one\n"


@pytest.mark.slow
async def test_a_land_cancelled_mid_gate_leaves_the_change_queued_and_nothing_applied(tmp_path):
    queue = _gated(tmp_path, "sleep 60", timeout=600)
    with trio.move_on_after(2):
        await queue.land()  # the supervisor stops mid-gate (apply would raise: never reached)
    assert (tmp_path / "repo" / "a.txt").read_text() == "one\n"
    later = _gated_again(tmp_path)
    later.restore()
    assert [(e["key"], e["status"]) for e in later.show()] == [("a1", "queued")]
    assert not list((tmp_path / "session" / "gates").iterdir())  # the gate's tree is removed


def _gated_again(tmp_path: Path) -> IntegrationQueue:
    trees = FakeWorktrees(repo=tmp_path / "repo", snapshots={"a1": None}, holding={"a1"})
    return IntegrationQueue(worktrees=trees, gate="true", root=tmp_path / "session")
