import trio

from orchestrator._records import ChildRecord, State, clip
from orchestrator.core._notes import Notes


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
