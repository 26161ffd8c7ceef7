"""The ``events`` control op: the journal in pages, and a wait for the next record."""

import json
from pathlib import Path
from typing import Any

import pytest
import trio

import ipc
from orchestrator._errors import UsageError
from orchestrator.control._durable import EVENTS_LIMIT, Durability
from orchestrator.durability import Journal
from orchestrator.durability._session import SessionJournal


@pytest.fixture
def durability(tmp_path: Path) -> Durability:
    directory = tmp_path / "s"
    directory.mkdir(mode=0o700)
    journal = Journal.open(directory / "journal.jsonl")
    # The op reads only the journal: no supervisor is needed to page through it.
    return Durability(sup=None, journal=journal, session=SessionJournal(journal))  # type: ignore[arg-type]


async def test_the_journal_comes_in_pages_each_naming_the_newest_seq(durability):
    for n in range(EVENTS_LIMIT + 500):
        durability.journal.append("state", "a1", state=str(n))
    events = durability.ops()["events"]
    first = await events(None, {"since": 0})
    assert len(first["events"]) == EVENTS_LIMIT
    assert first["seq"] == EVENTS_LIMIT + 500
    rest = await events(None, {"since": first["events"][-1]["seq"]})
    assert [e["seq"] for e in rest["events"]] == list(range(EVENTS_LIMIT + 1, EVENTS_LIMIT + 501))


async def test_a_wait_ends_at_the_next_record_or_its_deadline(durability, autojump_clock):
    events = durability.ops()["events"]
    durability.journal.append("spawn", "a1", agent="scout")
    start = trio.current_time()
    assert (await events(None, {"since": 1, "wait": 5}))["events"] == []
    assert trio.current_time() - start == 5

    async def later() -> None:
        await trio.sleep(2)
        durability.journal.append("state", "a1", state="idle")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        start = trio.current_time()
        got = await events(None, {"since": 1, "wait": 30})
    assert [e["kind"] for e in got["events"]] == ["state"]
    assert trio.current_time() - start == 2


@pytest.mark.parametrize("args", [{"since": -1}, {"since": "3"}, {"since": True}, {"wait": -1}])
async def test_a_bad_since_or_wait_is_a_usage_error(durability, args):
    with pytest.raises(UsageError):
        await durability.ops()["events"](None, args)


async def test_large_records_never_make_a_reply_the_frame_refuses(durability):
    durability.journal.append("state", "a1", state="one")
    durability.journal.append("handoff", "a2", task="x" * (900 * 1024), state="stopped")
    for n in range(40):
        durability.journal.append("settled", "a3", report="y" * (60 * 1024), n=n)
    events = durability.ops()["events"]
    seen: list[dict[str, Any]] = []
    since = 0
    while True:
        page = await events(None, {"since": since})
        body = json.dumps(page).encode()
        assert len(body) < ipc.MAX_FRAME - 4096  # room for the envelope
        if not page["events"]:
            break
        seen += page["events"]
        since = page["events"][-1]["seq"]
    assert [e["seq"] for e in seen] == list(range(1, 43))  # every record, in order
    big = seen[1]
    assert big["kind"] == "handoff"
    assert "task" not in big
    assert big["clipped"].startswith("a ")
    assert big["clipped"].endswith("-byte record: too large to send")
    assert seen[2]["report"] == "y" * (60 * 1024)  # the rest arrive whole
