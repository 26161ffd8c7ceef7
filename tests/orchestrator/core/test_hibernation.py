"""Hibernation's settings and journal records (the processes are tests/faults/test_hibernate.py)."""

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast
from unittest.mock import Mock

import attrs
import orjson
import pytest
import trio

from orchestrator._config import load_config
from orchestrator._errors import UsageError
from orchestrator._records import ChildRecord, State
from orchestrator.core import _hibernation, _revive
from orchestrator.core._capacity import Capacity
from orchestrator.core._hibernation import Hibernation
from orchestrator.core._registry import Registry
from orchestrator.durability import fold, parse_journal
from orchestrator.governance._ownership import LockTable


def test_hibernation_settings_are_read_from_the_config_file_and_checked(tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = load_config(session="s", cwd=tmp_path, home=home)
    assert (config.hibernate_after_s, config.max_retained) == (None, 64)
    (home / "config.yaml").write_text("subagents:\n  hibernate_after_s: 0\n  max_retained: 100\n")
    config = load_config(session="s", cwd=tmp_path, home=home)
    assert (config.hibernate_after_s, config.max_retained) == (0, 100)
    (home / "config.yaml").write_text("subagents:\n  hibernate_after_s: soon\n")
    with pytest.raises(UsageError, match="hibernate_after_s 'soon' must be a number of seconds"):
        load_config(session="s", cwd=tmp_path, home=home)
    (home / "config.yaml").write_text("subagents:\n  max_retained: 0\n")
    with pytest.raises(UsageError, match=r"max_retained 0 must be a whole number in 1\.\.4096"):
        load_config(session="s", cwd=tmp_path, home=home)


def _line(**obj: object) -> bytes:
    return orjson.dumps({"v": 1, "at": 1.5, "key": "a1", **obj}) + b"\n"


def test_a_hibernated_child_is_not_ended_so_a_new_supervisor_can_revive_it() -> None:
    data = b"".join(
        [
            _line(seq=1, kind="spawn", agent="scout", backend="pi"),
            _line(seq=2, kind="settled", state="idle", report="first"),
            _line(seq=3, kind="hibernate", state="hibernated"),
        ]
    )
    [a1] = fold(parse_journal(data).records).values()
    assert a1.state == "hibernated"
    assert not a1.ended
    assert a1.keep
    woke = data + _line(seq=4, kind="wake", state="starting")
    assert fold(parse_journal(woke).records)["a1"].state == "starting"


# -- sleep and wake, up to the relaunch ------------------------------------------------------


@attrs.define(eq=False)
class _Run:
    """An idle, connected run whose process has already gone (nothing to shut down)."""

    record: ChildRecord
    resume_id: str = ""
    turn: None = None
    side_turn: None = None
    finishing: bool = False
    stopping: bool = False
    channel: None = None
    launched: None = None
    connected: trio.Event = attrs.Factory(trio.Event)
    done: trio.Event = attrs.Factory(trio.Event)
    log: SimpleNamespace = attrs.Factory(
        lambda: SimpleNamespace(write=lambda *_: None, flush=lambda: None)
    )

    @property
    def key(self) -> str:
        return self.record.key


@attrs.define(eq=False)
class _Host:
    root: Path
    registry: Registry = attrs.Factory(Registry)
    capacity: Capacity = attrs.Factory(lambda: Capacity(cap=2))
    locks: LockTable = attrs.Factory(LockTable)
    runs: dict[str, Any] = attrs.Factory(dict)
    questions: dict[str, Any] = attrs.Factory(dict)
    journal: Mock = attrs.Factory(Mock)
    notes: Mock = attrs.Factory(Mock)
    spawning: object = None

    @property
    def config(self) -> SimpleNamespace:
        paths = SimpleNamespace(scratch=self.root / "scratch")
        return SimpleNamespace(paths=paths, kill_grace=1.0, drain_timeout=1.0)

    @property
    def worktrees(self) -> SimpleNamespace:
        return SimpleNamespace(snapshots={})

    def run_for(self, key: str) -> Any:
        return self.runs[key]


async def test_a_hibernated_child_wakes_with_the_session_id_its_backend_reported(
    tmp_path, monkeypatch
) -> None:
    # Spawned with no session; Claude Code reported one during its first turn (``resumable``):
    # the wake must resume that session, not start a blank one.
    host = _Host(root=tmp_path)
    session = tmp_path / "scratch" / "a1" / "claude/home/.claude/projects/-repo/u-7.jsonl"
    session.parent.mkdir(parents=True)
    session.write_text("{}\n")
    record = ChildRecord(
        key="a1", name="n", agent="scout", mode="scout", task="t", workspace="/w", backend="claude"
    )
    record.state = State.IDLE
    host.registry.add(record)
    run = _Run(record=record, resume_id="u-7")
    run.connected.set()
    host.runs["a1"] = run
    host.capacity.reserve(1)
    hibernation = Hibernation(sup=cast("Any", host), after_s=0)
    hibernation.spawned(record, {"resume": "", "model": None})
    assert await hibernation.hibernate(cast("Any", run))
    assert record.state is State.HIBERNATED
    woken: list[dict[str, Any]] = []

    async def launch_again(sup, spawning, record, revival):
        woken.append(_revive._loadout_fields(revival))
        host.runs[record.key] = run

    monkeypatch.setattr(_hibernation, "launch_again", launch_again)
    with trio.fail_after(10):
        async with hibernation.awake("a1") as awake:
            assert cast("object", awake) is run
    [fields] = woken
    assert fields["resume"] == "u-7"
    assert fields["restarted"] is True
