import itertools
import json
import os
import re
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.governance._diagnostics import LogPathError, RejectLog, RunLog
from orchestrator.governance._redaction import REDACTED, Redactor, SecretSet

TOKEN = "3f" * 32  # 64 hex characters, the shape of a real per-child token
SESSION_KEY = bytes(range(200, 232))
MARKER = re.compile(rb"^\[\xe2\x80\xa6 (\d+) bytes dropped \xe2\x80\xa6\]\n")


def _log(tmp_path: Path, *, record_output: bool = False, cap: int = 1 << 20) -> RunLog:
    path = tmp_path / "sessions" / "s1" / "logs" / "a1.log"
    return RunLog(
        path,
        secrets=[TOKEN, SESSION_KEY],
        transport="process",
        record_output=record_output,
        cap=cap,
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_log_directory_is_0700_and_file_is_0600(tmp_path: Path) -> None:
    log = _log(tmp_path)
    assert _mode(log.path.parent) == 0o700
    assert _mode(log.path) == 0o600
    assert log.path.read_bytes() == b""


def test_an_existing_loose_directory_and_file_are_tightened(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    os.chmod(logs, 0o755)  # noqa: S103 - the loose mode under test
    (logs / "a1.log").write_bytes(b"earlier\n")
    os.chmod(logs / "a1.log", 0o644)
    log = RunLog(logs / "a1.log", secrets=[], transport="process")
    assert (_mode(logs), _mode(log.path)) == (0o700, 0o600)
    assert log.path.read_bytes() == b"earlier\n"


def test_a_symlink_at_the_log_path_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"precious\n")
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    (logs / "a1.log").symlink_to(target)
    (logs / "a2.log").symlink_to(tmp_path / "missing")
    for name in ("a1.log", "a2.log"):
        with pytest.raises(LogPathError, match="symlink") as caught:
            RunLog(logs / name, secrets=[], transport="process")
        assert caught.value.path == logs / name
        assert "\n" not in str(caught.value)
    assert target.read_bytes() == b"precious\n"
    assert not (tmp_path / "missing").exists()


def test_a_symlinked_log_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "logs").symlink_to(real)
    with pytest.raises(LogPathError, match="directory"):
        RunLog(tmp_path / "logs" / "a1.log", secrets=[], transport="process")
    assert list(real.iterdir()) == []


def test_a_healthy_run_writes_no_child_output(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.write("launched pid 42")
    log.output("stdout", b"hello from the child\n")
    log.output("stderr", b"a warning\n")
    text = log.path.read_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z launched pid 42\n", text)
    assert log.tail == "hello from the child\na warning\n"


def test_recording_persists_redacted_output(tmp_path: Path) -> None:
    log = _log(tmp_path, record_output=True)
    log.output("stdout", b"token=" + TOKEN.encode() + b" done\n" + b"." * 100)
    data = log.path.read_bytes()
    assert data.startswith(b"token=[redacted] done\n")
    assert TOKEN.encode() not in data


def test_write_escapes_newlines_and_redacts(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.write(f"two\nlines with {TOKEN} and {SESSION_KEY.hex()}")
    line = log.path.read_text()
    assert line.endswith(" two\\nlines with [redacted] and [redacted]\n")
    assert line.count("\n") == 1


@pytest.mark.parametrize("split", range(1, 64))
def test_a_token_split_across_two_chunks_is_redacted(tmp_path: Path, split: int) -> None:
    log = _log(tmp_path, record_output=True)
    stream = b"before " + TOKEN.encode() + b" after\n"
    at = len(b"before ") + split
    log.output("stdout", stream[:at])
    log.output("stdout", stream[at:])
    log.fail("exited", "child exited with code 1")
    assert log.tail == "before [redacted] after\n"
    assert TOKEN.encode() not in log.path.read_bytes()
    assert b"before [redacted] after\n" in log.path.read_bytes()


def test_every_form_of_the_session_key_is_redacted(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.output("stdout", b"raw:" + SESSION_KEY + b" hex:" + SESSION_KEY.hex().encode())
    log.output("stdout", b" HEX:" + SESSION_KEY.hex().upper().encode() + b"\n")
    report = log.fail("protocol", "bad frame")
    assert report.tail == "raw:[redacted] hex:[redacted] HEX:[redacted]\n"


def test_interleaved_streams_keep_their_own_split_secret(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.output("stdout", b"out " + TOKEN[:40].encode())
    log.output("stderr", b"err line\n")
    log.output("stdout", TOKEN[40:].encode() + b" end\n")
    report = log.fail("exited", "code 1")
    assert TOKEN not in report.tail
    assert "out [redacted] end\n" in report.tail
    assert "err line\n" in report.tail


def test_a_stream_cut_off_mid_secret_hides_the_fragment(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.output("stdout", b"printing " + TOKEN[:20].encode())
    report = log.fail("killed", "child killed by SIGKILL")
    assert report.tail == "printing [redacted]"
    assert TOKEN[:20] not in log.path.read_text()


_FILLER = st.text(alphabet="xyz \n", max_size=40)
_SECRET = st.sampled_from([TOKEN.encode(), SESSION_KEY, SESSION_KEY.hex().encode()])


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.tuples(_FILLER, _SECRET), max_size=6),
    end=_FILLER,
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=8),
)
def test_redaction_does_not_depend_on_how_the_stream_is_chunked(
    pieces: list[tuple[str, bytes]], end: str, cuts: list[int]
) -> None:
    stream = b"".join(filler.encode() + secret for filler, secret in pieces) + end.encode()
    expected = b"".join(filler.encode() + REDACTED for filler, _ in pieces) + end.encode()
    redactor = Redactor(SecretSet([TOKEN, SESSION_KEY]))
    bounds = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    out = b"".join(redactor.feed(stream[a:b]) for a, b in itertools.pairwise(bounds))
    assert out + redactor.flush() == expected


def test_failure_is_reported_once_with_transport_log_error_and_tail(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.output("stdout", b"last words\n")
    first = log.fail("idle", f"idle budget of 600000 ms ran out ({TOKEN})")
    assert not first.already_reported
    assert (first.kind, first.transport, first.log_path) == ("idle", "process", log.path)
    assert first.error == "idle budget of 600000 ms ran out ([redacted])"
    assert first.tail == "last words\n"
    second = log.fail("killed", "child killed by SIGTERM")
    assert second.already_reported
    assert (second.kind, second.error, second.tail) == ("idle", first.error, first.tail)
    text = log.path.read_text()
    assert text.count("--- recent output ---\nlast words\n--- end of output ---\n") == 1
    assert "failed (idle) over process: idle budget of 600000 ms ran out ([redacted])" in text
    assert "also classified as killed: child killed by SIGTERM" in text


def test_output_after_a_failure_is_persisted(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.fail("exited", "child exited with code 3")
    assert "(no output)" in log.path.read_text()
    log.output("stderr", b"x" * 100 + b" drained after the failure")
    assert b"xxx" in log.path.read_bytes()
    assert b"drained" not in log.path.read_bytes()  # held back: it might begin a secret
    log.flush()
    assert log.path.read_bytes().endswith(b"x drained after the failure")


def test_flush_completes_recorded_output_of_a_run_that_ended_well(tmp_path: Path) -> None:
    log = _log(tmp_path, record_output=True)
    log.output("stdout", b"all done\n")
    assert log.path.read_bytes() == b""
    log.flush()
    log.flush()
    assert log.path.read_bytes() == b"all done\n"


def test_the_live_tail_shows_held_back_output_but_no_secret_beginning(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.output("stdout", b"working\n")
    assert log.tail == "working\n"
    log.output("stdout", b"key " + TOKEN[:5].encode())
    assert log.tail == "working\nkey "
    log.output("stdout", TOKEN[5:].encode() + b"!\n")
    assert log.tail == "working\nkey [redacted]!\n"


def test_fail_refuses_an_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="use one of"):
        _log(tmp_path).fail("bored", "nothing")


def test_tail_keeps_the_newest_8_kib(tmp_path: Path) -> None:
    log = _log(tmp_path)
    data = bytes(i % 251 % 26 + 97 for i in range(20_000))
    for start in range(0, len(data), 3_000):
        log.output("stdout", data[start : start + 3_000])
    log.fail("exited", "code 1")
    assert log.tail == data[-8192:].decode()


def test_repr_shows_no_secret(tmp_path: Path) -> None:
    log = _log(tmp_path)
    assert TOKEN not in repr(log)
    assert SESSION_KEY.hex() not in repr(log)
    assert "secrets" not in repr(log)


@pytest.mark.parametrize("via", ["write", "output"])
def test_a_5_mib_flood_stays_under_1_mib_keeps_the_newest_and_hides_the_token(
    tmp_path: Path, via: str
) -> None:
    log = _log(tmp_path, record_output=True)
    token = TOKEN.encode()
    stream = bytearray()
    persisted = 0  # what the file would hold without a cap
    number = 0
    while len(stream) < 5 << 20:
        if via == "write":
            line = f"line {number:08d} {TOKEN} {'.' * 900}"
            log.write(line)
            stream += line.encode()
            persisted += len("2000-01-01T00:00:00.000Z ") + len(line) - 64 + len(REDACTED) + 1
            number += 1
        else:
            # Each chunk ends inside a token that the next chunk completes.
            lines = b"".join(b"line %08d %s\n" % (number + i, token) for i in range(500))
            chunk = token[32:] + b"\n" + lines + token[:32]
            log.output("stdout", chunk)
            stream += chunk
            number += 500
        assert log.path.stat().st_size <= 1 << 20
    if via == "output":
        log.flush()  # the stream ends inside a token: its first half is hidden too
        persisted = len(bytes(stream).replace(token, REDACTED)[:-32] + REDACTED)
    data = log.path.read_bytes()
    assert len(data) <= 1 << 20
    assert token not in data
    assert token[:32] not in data
    assert token[32:] not in data
    assert b"line %08d [redacted]" % (number - 1) in data
    found = MARKER.match(data)
    assert found is not None
    kept = data[found.end() :]
    assert int(found.group(1)) + len(kept) == persisted
    assert re.match(rb"(\S+ )?line \d{8} \[redacted\][ .]*\n", kept)  # starts on a whole line


def test_compaction_keeps_the_newest_whole_lines_under_a_small_cap(tmp_path: Path) -> None:
    log = _log(tmp_path, record_output=True, cap=4096)
    sent = b"".join(b"chunk %04d .........\n" % i for i in range(400))
    for start in range(0, len(sent), 21):
        log.output("stdout", sent[start : start + 21])
    log.flush()
    data = log.path.read_bytes()
    found = MARKER.match(data)
    assert found is not None
    kept = data[found.end() :]
    assert int(found.group(1)) + len(kept) == len(sent)
    assert sent.endswith(kept)
    assert kept.startswith(b"chunk ")
    assert len(data) <= 4096


def test_reject_log_records_redacted_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "rejects.jsonl"
    rejects = RejectLog(path, secrets=[TOKEN, SESSION_KEY])
    rejects.record("policy", "a1", {"tool": "bash", "argv": ["echo", TOKEN], "n": 3, "ok": None})
    rejects.record("lock-conflict", "a2", {"paths": ("src/**",), "why": object()})
    rejects.record("dropped-frame", f"x{TOKEN}", {f"key {TOKEN}": {"deep": [TOKEN]}})
    lines = path.read_text().splitlines()
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700
    records = [json.loads(line) for line in lines]
    assert [r["kind"] for r in records] == ["policy", "lock-conflict", "dropped-frame"]
    assert records[0]["args"] == {
        "tool": "bash",
        "argv": ["echo", "[redacted]"],
        "n": 3,
        "ok": None,
    }
    assert records[1]["args"]["paths"] == ["src/**"]
    assert records[1]["args"]["why"].startswith("<object object at")
    assert records[2]["owner"] == "x[redacted]"
    assert records[2]["args"] == {"key [redacted]": {"deep": ["[redacted]"]}}
    assert TOKEN not in path.read_text()


def test_reject_log_clips_huge_args_and_stays_parseable_under_its_cap(tmp_path: Path) -> None:
    path = tmp_path / "rejects.jsonl"
    rejects = RejectLog(path, secrets=[TOKEN], cap=65536)
    for i in range(200):
        rejects.record("dropped-frame", "a1", {"i": i, "body": "z" * 20_000 + TOKEN})
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert path.stat().st_size <= 65536
    assert records[0]["kind"] == "dropped"
    assert records[0]["bytes"] > 0
    assert records[-1]["args"]["bytes"] > 20_000
    assert records[-1]["args"]["clipped"].startswith('{"i": 199, "body": "zzz')
    assert TOKEN not in path.read_text()


def test_reject_log_refuses_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "rejects.jsonl").symlink_to(tmp_path / "target")
    with pytest.raises(LogPathError):
        RejectLog(tmp_path / "rejects.jsonl", secrets=[])


def test_a_secret_added_later_is_redacted_in_every_existing_log_and_tail(tmp_path: Path) -> None:
    shared = SecretSet([SESSION_KEY])
    first = RunLog(tmp_path / "a1.log", secrets=shared, transport="process", record_output=True)
    other = RejectLog(tmp_path / "rejected.jsonl", secrets=shared)
    sibling = "9c" * 32
    first.output("stdout", f"early {sibling}\n".encode())  # not yet a secret: kept in the file
    shared.add(sibling)  # a new child's token is issued
    assert sibling not in first.tail  # the tail is scrubbed again on every read
    first.output("stdout", f"late {sibling} {SESSION_KEY.hex()}\n".encode())
    first.write(f"line {sibling}")
    first.flush()
    text = first.path.read_text()
    assert text.count(sibling) == 1
    assert "late [redacted] [redacted]" in text
    assert " line [redacted]" in text
    other.record("policy", "a1", {"why": f"quoted {sibling}"})
    assert sibling not in other.path.read_text()
    report = first.fail("exited", f"exit 1 after printing {sibling}")
    assert sibling not in report.error
    assert sibling not in report.tail


def test_the_secret_set_scrubs_nested_values_and_keeps_other_leaves() -> None:
    shared = SecretSet([TOKEN, SESSION_KEY])
    value = {"a": [TOKEN, {TOKEN: 1, "n": None, "ok": True}], "hex": SESSION_KEY.hex().upper()}
    assert shared.scrub_value(value) == {
        "a": ["[redacted]", {"[redacted]": 1, "n": None, "ok": True}],
        "hex": "[redacted]",
    }
    assert shared.scrub("nothing here") == "nothing here"
    before = shared.version
    shared.add(TOKEN)
    shared.add("")
    assert shared.version == before  # adding a known or empty secret changes nothing
