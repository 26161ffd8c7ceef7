"""The session journal: its format read back tolerantly, folded to facts, written in batches,
fsynced on state changes, bounded by rotation, and never losing a record to a full disk."""

import contextlib
import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import trio

from orchestrator.durability import (
    JOURNAL_VERSION,
    Journal,
    fold,
    keep_journal,
    last_supervisor,
    parse_journal,
)
from orchestrator.durability._journal import previous


def line(**obj: object) -> bytes:
    return orjson.dumps({"v": 1, "at": 1.5, "key": "a1", **obj}) + b"\n"


SPAWN = line(seq=1, kind="spawn", agent="scout", backend="builtin")


@pytest.mark.parametrize(
    ("data", "kept", "warned"),
    [
        (b"", [], []),
        (SPAWN, [1], []),
        (SPAWN + line(seq=2, kind="state", state="idle"), [1, 2], []),
        (SPAWN + b'{"v": 1, "seq": 2, "at": 1', [1], ["the last line is torn (26 bytes"]),
        (SPAWN + line(seq=2, v=2, kind="state"), [1], ["1 record(s) from seq 2 are journal v2"]),
        (SPAWN + b"not json\n" + line(seq=3, kind="x"), [1, 3], ["1 line(s) are not journal"]),
        (b'{"v": 0, "seq": 1, "at": 1, "kind": "x", "key": ""}\n', [], ["not journal records"]),
        (b'{"v": 1, "seq": "1", "at": 1, "kind": "x", "key": ""}\n', [], ["not journal records"]),
        (b"[1, 2]\n\n", [], ["not journal records (first: line 1)"]),
    ],
)
def test_reading_skips_damage_with_one_line_each(data, kept, warned):
    result = parse_journal(data, where="j")
    assert [r.seq for r in result.records] == kept
    assert len(result.warnings) == len(warned)
    for warning, expected in zip(result.warnings, warned, strict=True):
        assert warning.startswith("j: ")
        assert expected in warning


def test_many_newer_records_are_one_line_naming_every_version():
    data = SPAWN + b"".join(line(seq=n, v=2 + n % 2, kind="state") for n in range(2, 9))
    result = parse_journal(data)
    assert result.newer == 7
    [warning] = result.warnings
    assert "7 record(s) from seq 2 are journal v2, v3" in warning
    assert f"(v{JOURNAL_VERSION})" in warning


def test_a_record_round_trips_through_its_line():
    record = parse_journal(SPAWN).records[0]
    assert record.as_json() == orjson.loads(SPAWN)
    assert orjson.loads(record.line()) == orjson.loads(SPAWN)
    assert record.line().endswith(b"}\n")
    assert record.fields == {"agent": "scout", "backend": "builtin"}


def test_folding_follows_a_child_through_its_life():
    data = b"".join(
        [
            SPAWN,
            line(seq=2, kind="resume", id="/s/a1/transcript.json"),
            line(seq=3, kind="state", state="working"),
            line(seq=4, kind="question", id="q1", text="which file?"),
            line(seq=5, kind="answer", id="q1", text="README"),
            line(seq=6, kind="settled", report="## Summary\nfound it", state="idle"),
            line(seq=7, kind="spawn", key="a2", agent="worker"),
            line(seq=8, kind="handoff", key="a2", state="stopped", remaining=[]),
            line(seq=9, kind="state", key="a9", state="idle"),  # never spawned: ignored
        ]
    )
    facts = fold(parse_journal(data).records)
    assert list(facts) == ["a1", "a2"]
    a1, a2 = facts["a1"], facts["a2"]
    assert (a1.state, a1.resume, a1.question) == ("idle", "/s/a1/transcript.json", None)
    assert a1.report == "## Summary\nfound it"
    assert a1.spawn == {"agent": "scout", "backend": "builtin"}
    assert not a1.ended
    assert a1.keep
    assert a2.ended
    assert not a2.keep


def test_a_child_record_stands_for_all_before_it():
    data = SPAWN + line(seq=2, kind="settled", report="r", state="idle")
    before = fold(parse_journal(data).records)["a1"]
    compacted = line(seq=3, kind="child", **before.as_fields())
    after = fold(parse_journal(compacted).records)["a1"]
    assert after.as_fields() == before.as_fields()


def test_unresolved_worktrees_are_kept_and_lost_children_revive():
    data = SPAWN + line(seq=2, kind="handoff", state="failed", remaining=["worktree kept"])
    facts = fold(parse_journal(data).records)["a1"]
    assert facts.ended
    assert facts.keep
    data += line(seq=3, kind="lost", state="lost") + line(seq=4, kind="revived", state="idle")
    facts = fold(parse_journal(data).records)["a1"]
    assert (facts.state, facts.handoff, facts.ended) == ("idle", None, False)


def test_a_resolved_worktree_is_dropped_and_the_pid_is_folded():
    data = SPAWN + line(seq=2, kind="pid", pid=4242)
    data += line(seq=3, kind="handoff", state="stopped", remaining=["worktree kept"])
    facts = fold(parse_journal(data).records)["a1"]
    assert facts.pid == 4242
    assert facts.unresolved
    assert facts.keep
    resolved = data + line(seq=4, kind="resolved")
    facts = fold(parse_journal(resolved).records)["a1"]
    assert not facts.unresolved
    assert not facts.keep  # rotation drops it, and no later supervisor adopts it
    # A child record carries both (what rotation writes).
    compacted = line(seq=5, kind="child", **facts.as_fields())
    after = fold(parse_journal(compacted).records)["a1"]
    assert (after.pid, after.resolved, after.keep) == (4242, True, False)


def test_the_last_supervisor_record_says_stopped_or_died():
    serve = line(seq=1, kind="serve", key="", pid=7)
    assert last_supervisor(parse_journal(b"").records) is None
    died = last_supervisor(parse_journal(serve + SPAWN.replace(b'"seq":1', b'"seq":2')).records)
    assert died is not None
    assert (died.kind, died.fields["pid"]) == ("serve", 7)
    clean = line(seq=3, kind="shutdown", key="", pid=7, clean=True)
    stopped = last_supervisor(parse_journal(serve + clean).records)
    assert stopped is not None
    assert stopped.kind == "shutdown"
    # A child's record of the same kind name is not the supervisor's.
    assert last_supervisor(parse_journal(line(seq=1, kind="serve", pid=1)).records) is None


# -- the writer ---------------------------------------------------------------------------------


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "session"
    directory.mkdir(mode=0o700)
    return directory


def test_the_journal_is_private_and_numbers_records_across_reopenings(state_dir):
    path = state_dir / "journal.jsonl"
    journal = Journal.open(path)
    assert journal.append("spawn", "a1", agent="scout") == 1
    assert journal.append("state", "a1", durable=True, state="idle") == 2
    assert not path.exists() or path.read_bytes() == b""  # buffered until flushed
    assert journal.flush()
    journal.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = Journal.open(path)
    assert again.seq == 2
    assert again.facts["a1"].state == "idle"
    assert again.append("state", "a1", state="working") == 3
    again.close()
    assert [r["seq"] for r in Journal.open(path).since(0)] == [1, 2, 3]


def test_a_torn_line_is_warned_once_and_cut_so_the_next_record_stands_alone(state_dir):
    path = state_dir / "journal.jsonl"
    path.write_bytes(SPAWN + b'{"v": 1, "seq": 2, "at"')
    warnings: list[str] = []
    journal = Journal.open(path, warn=warnings.append)
    assert len(warnings) == 1
    assert "torn" in warnings[0]
    journal.append("state", "a1", durable=True, state="idle")
    journal.close()
    warnings.clear()
    reopened = Journal.open(path, warn=warnings.append)
    assert warnings == []
    assert [r.seq for r in reopened.found.records] == [1, 2]


def test_a_newer_record_is_kept_in_the_file(state_dir):
    path = state_dir / "journal.jsonl"
    newer = line(seq=2, v=JOURNAL_VERSION + 1, kind="state", state="idle")
    path.write_bytes(SPAWN + newer)
    warnings: list[str] = []
    journal = Journal.open(path, warn=warnings.append)
    assert len(warnings) == 1
    assert journal.seq == 1
    assert journal.facts["a1"].state == "starting"
    journal.close()
    assert newer in path.read_bytes()  # nothing lost: a newer fleet still reads it


def test_rotation_keeps_only_what_later_supervisors_need(state_dir):
    path = state_dir / "journal.jsonl"
    journal = Journal.open(path, cap_bytes=4096)
    journal.append("spawn", "a1", agent="scout")
    journal.append("spawn", "a2", agent="worker")
    journal.append("handoff", "a2", state="stopped", remaining=[])
    journal.append("spawn", "a3", agent="worker")
    journal.append("handoff", "a3", state="failed", remaining=["worktree kept"])
    journal.append("serve", pid=99)
    for n in range(200):
        journal.append("state", "a1", state="working" if n % 2 else "idle")
        journal.flush()
    journal.close()
    assert path.stat().st_size < 4096
    assert previous(path).exists()
    reopened = Journal.open(path)
    assert set(reopened.facts) == {"a1", "a3"}
    assert reopened.facts["a1"].state == "working"
    assert reopened.facts["a1"].spawn == {"agent": "scout"}
    assert reopened.seq > 200  # numbering goes on across the rotation
    serving = reopened.supervisor  # the supervisor's own record survives rotation
    assert serving is not None
    assert (serving.kind, serving.fields["pid"]) == ("serve", 99)
    seqs = [r["seq"] for r in reopened.since(0)]
    assert seqs == sorted(set(seqs))


def test_a_rotation_cut_between_its_renames_loses_nothing(state_dir):
    path = state_dir / "journal.jsonl"
    journal = Journal.open(path)
    journal.append("spawn", "a1", agent="scout")
    journal.close()
    os.replace(path, previous(path))  # the crash: the new file never took its place
    assert Journal.open(path).facts["a1"].spawn == {"agent": "scout"}


async def test_the_keeper_writes_a_durable_record_at_once(state_dir):
    path = state_dir / "journal.jsonl"
    journal = Journal.open(path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_journal, journal, 30.0)
        journal.append("spawn", "a1", durable=True, agent="scout")
        with trio.fail_after(10):
            while b'"spawn"' not in path.read_bytes():  # noqa: ASYNC110 - a thread writes it
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    journal.close()


# -- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def tiny_fs() -> Iterator[Path]:
    """A 64 KiB tmpfs of our own, to fill (as tests/faults/test_full_disk.py does)."""
    mount = Path(tempfile.mkdtemp(prefix="flj-full-", dir="/tmp"))
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)], check=True
    )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        with contextlib.suppress(OSError):
            mount.rmdir()


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_keeps_every_record_and_writes_them_once_space_returns(tiny_fs):
    path = tiny_fs / "journal.jsonl"
    warnings: list[str] = []
    journal = Journal.open(path, warn=warnings.append)
    journal.append("spawn", "a1", durable=True, agent="scout")
    assert journal.flush()
    filler = _fill(tiny_fs)
    for n in range(50):
        journal.append("settled", "a1", durable=True, report="x" * 200, state="idle", n=n)
    assert not journal.flush()
    assert not journal.flush()
    assert len(warnings) == 1
    assert "No space left on device" in warnings[0]
    assert "51" not in warnings[0]  # it counts the held records, not the seq
    assert parse_journal(path.read_bytes()).warnings == ()  # no half-written line
    assert [r["seq"] for r in journal.since(0)] == list(range(1, 52))  # still served
    filler.unlink()
    assert journal.flush()
    assert warnings[1].endswith("is written again")
    journal.close()
    assert [r.seq for r in parse_journal(path.read_bytes()).records] == list(range(1, 52))
