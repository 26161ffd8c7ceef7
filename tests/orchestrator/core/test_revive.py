"""Whether a lost child's backend can resume it: one line saying why not, per backend."""

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import attrs
import pytest

from orchestrator._errors import Refused
from orchestrator.core import _revive
from orchestrator.core._capacity import Capacity
from orchestrator.core._registry import Registry
from orchestrator.core._revive import Revival, revive, why_not
from orchestrator.governance._ownership import LockTable
from orchestrator.launch import _context


def _revival(backend: str, resume: str, surface: str = "process") -> Revival:
    return Revival(
        key="a1",
        name="n",
        agent="scout",
        mode="scout",
        task="t",
        backend=backend,
        surface=surface,
        loadout={"resume": resume},
    )


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}\n")
    return path


@pytest.mark.parametrize(
    ("backend", "made", "resume", "reason"),
    [
        ("builtin", "transcript.json", "{scratch}/transcript.json", ""),
        (
            "builtin",
            None,
            "{scratch}/transcript.json",
            "its transcript {scratch}/transcript.json is gone",
        ),
        ("builtin", None, "", "its transcript (none) is gone"),
        ("pi", "pi-session.jsonl", "{scratch}/pi-session.jsonl", ""),
        ("pi", None, "{scratch}/pi-session.jsonl", "its Pi session file"),
        ("claude", "claude/home/.claude/projects/-repo/u-1.jsonl", "u-1", ""),
        (
            "claude",
            "claude/home/.claude/projects/-repo/u-2.jsonl",
            "u-1",
            "its Claude Code session u-1 is not in",
        ),
        ("codex", "codex/config/codex/sessions/2026/12/03/rollout-x-t-9.jsonl", "t-9", ""),
        ("codex", None, "t-9", "its Codex thread t-9 is not in"),
        ("command", None, "", "the command backend cannot be revived"),
    ],
)
def test_each_backend_says_whether_it_can_resume(tmp_path, backend, made, resume, reason):
    scratch = tmp_path / "a1"
    if made:
        _touch(scratch / made)
    found = why_not(_revival(backend, resume.format(scratch=scratch)), scratch)
    assert (found == "") == (reason == "")
    assert reason.format(scratch=scratch) in found
    assert "\n" not in found


def test_a_remote_child_is_revived_from_the_context_kept_on_the_supervisors_side(tmp_path):
    scratch = tmp_path / "a1"
    revival = _revival("builtin", str(scratch / "transcript.json"), surface="ray")
    gone = f"its transcript {scratch}/transcript.json is gone; it cannot be revived"
    assert why_not(revival, scratch) == gone
    _context.keep(str(scratch), {"transcript.json": b"{}"}, _context.wants("builtin", ""))
    assert why_not(revival, scratch) == ""
    # Over the cap at a later turn end: nothing is kept and the one line says why.
    _context.refuse(str(scratch), f"{_context.over(_context.CAP)}; it cannot be revived")
    assert not (scratch / "transcript.json").exists()
    assert why_not(revival, scratch) == (
        f"its context (transcript or session files) is over the {_context.CAP}-byte cap; it "
        "cannot be revived"
    )
    # A local child never has such a line: its own scratch is its context.
    assert why_not(attrs.evolve(revival, surface="process"), scratch).startswith("its transcript")


# -- revive itself, up to its launch ---------------------------------------------------------


@attrs.define
class _Host:
    """What revive reads of the supervisor before the child launches again."""

    root: Path
    registry: Registry = attrs.Factory(Registry)
    capacity: Capacity = attrs.Factory(lambda: Capacity(cap=4))
    spawned: list[str] = attrs.Factory(list)

    @property
    def config(self) -> SimpleNamespace:
        paths = SimpleNamespace(scratch=self.root / "scratch")
        return SimpleNamespace(paths=paths, workspace=self.root / "ws")

    @property
    def spend(self) -> SimpleNamespace:
        return SimpleNamespace(check_turn=lambda *_: None, revived=lambda *_: None)

    @property
    def worktrees(self) -> SimpleNamespace:
        return SimpleNamespace(snapshots={})

    @property
    def hibernation(self) -> SimpleNamespace:
        return SimpleNamespace(spawned=lambda record, *_: self.spawned.append(record.key))

    def launcher_for(self, surface: str) -> None:
        return None


def _real(path: Path) -> str:
    return os.path.realpath(path)


@pytest.fixture
def lost(tmp_path: Path) -> tuple[_Host, Revival]:
    host = _Host(root=tmp_path)
    (tmp_path / "ws" / "src").mkdir(parents=True)
    transcript = _touch(tmp_path / "scratch" / "a1" / "transcript.json")
    revival = attrs.evolve(
        _revival("builtin", str(transcript)), mode="write", locks=("src/app.py",)
    )
    return host, revival


async def test_revive_takes_the_lost_childs_locks_back_before_it_launches(lost, monkeypatch):
    host, revival = lost
    locks = LockTable()
    held_at_launch: list[dict[str, tuple[str, ...]]] = []

    async def launch_again(sup, spawning, record, revival):
        held_at_launch.append(locks.snapshot())
        return SimpleNamespace(record=record)

    monkeypatch.setattr(_revive, "launch_again", launch_again)
    held = {"a1": (_real(host.config.workspace / "src" / "app.py"),)}
    record = await revive(cast("Any", host), cast("Any", None), locks, revival)
    assert record.key == "a1"
    assert held_at_launch == [held]
    assert locks.snapshot() == held
    assert host.spawned == ["a1"]


async def test_a_revive_whose_locks_are_held_now_is_refused_and_takes_nothing(lost, monkeypatch):
    host, revival = lost
    locks = LockTable()
    locks.acquire("a2", ["src/**"], root=host.config.workspace)

    async def launch_again(sup, spawning, record, revival):
        raise AssertionError("launched without its locks")

    monkeypatch.setattr(_revive, "launch_again", launch_again)
    with pytest.raises(Refused, match=r"its ownership of src/app\.py is now held by a2; stop a2"):
        await revive(cast("Any", host), cast("Any", None), locks, revival)
    assert list(locks.snapshot()) == ["a2"]
    assert "a1" not in host.registry.records
    assert host.capacity.used == 0
