"""What core reports becomes journal records: durable, deduplicated, clipped, foldable."""

from pathlib import Path

import pytest

import ipc
from orchestrator._records import REPORT_CLIP, ChildRecord, State
from orchestrator.durability import Journal, fold
from orchestrator.durability._session import SessionJournal


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    directory = tmp_path / "s"
    directory.mkdir(mode=0o700)
    return Journal.open(directory / "journal.jsonl")


def _record(**overrides: object) -> ChildRecord:
    fields: dict[str, object] = {
        "key": "a1",
        "name": "scout-1",
        "agent": "scout",
        "mode": "scout",
        "task": "map it",
        "workspace": "/repo",
        "backend": "builtin",
    }
    return ChildRecord(**{**fields, **overrides})  # type: ignore[arg-type]


def test_a_spawn_records_its_loadout_and_resume_id_before_anything_else(journal):
    session = SessionJournal(journal)
    model = ipc.ModelSpec(kind="openai", name="m", base_url="http://h/v1")
    fields = {"backend": "builtin", "model": model, "ownership": ["src/**"], "resume": "/t.json"}
    session.spawned(_record(), fields)
    records = journal.since(0)
    assert [r["kind"] for r in records] == ["spawn", "resume"]
    spawn = records[0]
    assert spawn["model"] == {
        "kind": "openai",
        "script": "",
        "base_url": "http://h/v1",
        "name": "m",
        "api_key_env": "",
    }
    assert spawn["ownership"] == ["src/**"]
    assert spawn["loadout"]["resume"] == "/t.json"
    assert records[1]["id"] == "/t.json"
    assert journal.wake.is_set()  # durable: the keeper writes it at once


def test_states_and_locks_are_written_only_when_they_change(journal):
    session = SessionJournal(journal)
    record = _record()
    session.spawned(record, {"backend": "builtin"})
    session.changed(record)  # still starting
    record.state = State.WORKING
    session.changed(record)
    session.observe([record], {"a1": ("/repo/x",)})
    session.observe([record], {"a1": ("/repo/x",)})
    record.state = State.IDLE
    session.observe([record], {"a1": ("/repo/x", "/repo/y")})
    kinds = [(r["kind"], r.get("state") or r.get("paths")) for r in journal.since(0)]
    assert kinds == [
        ("spawn", None),
        ("state", "working"),
        ("locks", ["/repo/x"]),
        ("state", "idle"),
        ("locks", ["/repo/x", "/repo/y"]),
    ]
    assert fold([*journal.found.records]) == {}  # nothing was there before
    assert journal.facts["a1"].spawn["locks"] == ["/repo/x", "/repo/y"]


def test_reports_are_clipped_as_wait_clips_them_and_a_handoff_ends_the_child(journal):
    session = SessionJournal(journal)
    record = _record()
    session.spawned(record, {"backend": "builtin"})
    record.state = State.IDLE
    session.settled(record, report="r" * 5000, error="")
    session.asked("a1", "q1", "which?")
    session.answered("a1", "q1", "this")
    record.state = State.STOPPED
    session.handed_off(record)
    settled, question, answer, handoff = journal.since(1)
    assert len(settled["report"]) == REPORT_CLIP
    assert (question["id"], answer["text"]) == ("q1", "this")
    assert (handoff["key"], handoff["state"], handoff["task"]) == ("a1", "stopped", "map it")
    facts = journal.facts["a1"]
    assert facts.ended
    assert facts.question is None
    assert not facts.keep
