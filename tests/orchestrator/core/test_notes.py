import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from orchestrator._config import Config
from orchestrator._records import REPORT_CLIP, ChildRecord, State, clip
from orchestrator.core._notes import Notes
from orchestrator.core._supervisor import SpawnRequest, open_supervisor

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def _record(key: str, state: State = State.WORKING) -> ChildRecord:
    return ChildRecord(
        key=key,
        name=f"n{key}",
        agent="scout",
        mode="scout",
        task="t",
        workspace="/",
        backend="builtin",
        state=state,
    )


async def test_wait_without_names_returns_at_once_when_nothing_works():
    notes = Notes()
    assert await notes.wait({"a1": _record("a1", State.IDLE)}) == []


async def test_notes_that_settle_together_come_back_as_one_batch(autojump_clock):
    notes = Notes()
    records = {k: _record(k) for k in ("a1", "a2")}

    async def settle() -> None:
        await trio.sleep(1)
        for record in records.values():
            record.state = State.IDLE
            notes.push(record, report=f"report {record.key}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(settle)
        batch = await notes.wait(records)
    assert [n["key"] for n in batch or []] == ["a1", "a2"]
    assert notes.pending == []
    assert trio.current_time() == 1


async def test_wait_all_waits_for_every_named_child(autojump_clock):
    notes = Notes()
    records = {k: _record(k) for k in ("a1", "a2")}

    async def settle(key: str, delay: float) -> None:
        await trio.sleep(delay)
        records[key].state = State.IDLE
        notes.push(records[key], report=key)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(settle, "a1", 1)
        nursery.start_soon(settle, "a2", 3)
        batch = await notes.wait(records, ["a1", "a2"], every=True)
    assert sorted(n["key"] for n in batch or []) == ["a1", "a2"]
    assert trio.current_time() == 3


async def test_a_named_child_that_is_not_working_counts_as_settled_now():
    notes = Notes()
    record = _record("a1", State.PAUSED)
    record.report = "x" * 5000
    [note] = await notes.wait({"a1": record}, ["a1"]) or []
    assert note["state"] == "paused"
    assert len(note["report"]) == 1200
    assert note["report"] == clip("x" * 5000)


async def test_wait_times_out_with_none(autojump_clock):
    notes = Notes()
    assert await notes.wait({"a1": _record("a1")}, ["a1"], timeout=2.5) is None
    assert trio.current_time() == 2.5


def test_a_question_note_names_the_question():
    notes = Notes()
    record = _record("a1", State.WAITING)
    notes.push(record, question=("q1", "Which db?"))
    [note] = notes.take()
    assert note["question"] == {"id": "q1", "text": "Which db?"}
    assert note["peek"] == "a1 na1 waiting — starting"


# -- through a real child ----------------------------------------------------------------------

LONG_REPORT = "".join(f"line {n:04} of a long report\n" for n in range(200))  # 5,000+ chars


@pytest.fixture
def fleet_config(tmp_path: Path) -> Iterator[Config]:
    """A real repository, a scripted model replying LONG_REPORT, a short private FLEET_HOME."""
    # Socket paths must stay short (sun_path), so FLEET_HOME is not under pytest's tmp_path.
    home = Path(tempfile.mkdtemp(prefix="fno-", dir="/tmp"))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("# sample\n")
    git_env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=repo, env=git_env, check=True, capture_output=True)
    script = tmp_path / "long.yaml"
    script.write_text(json.dumps({"turns": [{"steps": [{"reply": LONG_REPORT}]}]}))
    try:
        yield Config(
            home=home,
            session="t",
            workspace=repo,
            agents_scope="project",
            model=f"scripted:{script}",
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)


async def until(condition: Callable[[], bool]) -> None:
    while True:
        if condition():
            return
        await trio.sleep(0.02)


async def test_a_real_childs_long_report_is_clipped_in_its_note_and_its_handoff(fleet_config):
    assert len(LONG_REPORT) > 5000
    with trio.fail_after(30):
        async with open_supervisor(fleet_config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="report at length")])
            # The note is built when the turn settles; the wait then finds it pending.
            await until(lambda: any(n["key"] == record.key for n in sup.notes.pending))
            [note] = await sup.wait([record.key])
            assert note["state"] == "idle"
            assert note["report"] == clip(LONG_REPORT)
            assert len(note["report"]) == REPORT_CLIP
            # A wait for a child already settled builds its note from the record: clipped too.
            [again] = await sup.wait([record.key])
            assert again["report"] == clip(LONG_REPORT)
            [handoff] = await sup.stop([record.key])
            assert handoff["last"] == clip(LONG_REPORT)
