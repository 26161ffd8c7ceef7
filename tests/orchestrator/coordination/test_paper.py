"""The discussion paper: replies, cursors, bounds, corruption, the lock, and real concurrency."""

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator._errors import Refused
from orchestrator.coordination import _paper
from orchestrator.coordination._paper import Paper, PaperError

REPO = Path(__file__).resolve().parents[3]
CEILING = 10


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "paper.json"


@pytest.fixture
def paper(path: Path) -> Paper:
    return Paper(path)


async def on_file(path: Path) -> Any:
    return json.loads(await trio.Path(path).read_bytes())


async def test_ask_replies_with_the_new_id_only(paper: Paper) -> None:
    with trio.fail_after(CEILING):
        assert await paper.ask("a1", "Where is the retry budget configured?") == "d1"
        assert await paper.ask("a1", "And who reads it?", to="a2") == "d2"


async def test_answer_goes_to_the_asker_and_reply_never_echoes_its_text(
    paper: Paper, path: Path
) -> None:
    with trio.fail_after(CEILING):
        await paper.ask("a1", "Where is the retry budget configured?", to="a2")
        reply = await paper.answer("a2", "d1", "In ipc/_channel.py, DEFAULT_DEADLINE.")
        assert reply.splitlines()[0] == "d2"
        assert "DEFAULT_DEADLINE" not in reply
        entry = (await on_file(path))["entries"][1]
        assert (entry["kind"], entry["author"], entry["to"], entry["question"]) == (
            "answer",
            "a2",
            "a1",
            "d1",
        )


@pytest.mark.parametrize(
    ("question", "cause"),
    [("d9", "d9 is not on the paper"), ("d2", "d2 is an answer"), ("x1", "'x1' is not an entry")],
)
async def test_answer_to_anything_but_a_retained_question_writes_nothing(
    paper: Paper, path: Path, question: str, cause: str
) -> None:
    with trio.fail_after(CEILING):
        await paper.ask("a1", "q?")
        await paper.answer("a2", "d1", "yes")
        before = await trio.Path(path).read_bytes()
        with pytest.raises(PaperError, match=cause) as caught:
            await paper.answer("a2", question, "an answer")
        assert "\n" not in str(caught.value)
        assert caught.value.path == path
        assert isinstance(caught.value, Refused)
        assert (caught.value.kind, caught.value.exit_code) == ("refused", 4)
        assert (await trio.Path(path).read_bytes()) == before
        assert (await paper.ask("a1", "the lock was released")).split("\n")[0] == "d3"


async def test_answer_to_an_evicted_question_is_refused(paper: Paper) -> None:
    with trio.fail_after(CEILING):
        for n in range(65):
            await paper.ask("a1", f"q{n}")
        with pytest.raises(
            PaperError,
            match=r"^paper answer by a2: d1 is not on the paper: evicted or never asked \(list",
        ):
            await paper.answer("a2", "d1", "too late")


async def test_text_of_1600_chars_is_kept_and_1601_refused_without_writing(
    paper: Paper, path: Path
) -> None:
    with trio.fail_after(CEILING):
        with pytest.raises(PaperError) as caught:
            await paper.ask("a1", "x" * 1601)
        message = str(caught.value)
        assert "1601 chars, over the 1600-char limit" in message
        assert "nothing written" in message
        assert "\n" not in message
        assert not (await trio.Path(path).exists())
        assert await paper.ask("a1", "x" * 1600) == "d1"
        assert (await on_file(path))["entries"][0]["text"] == "x" * 1600


@pytest.mark.parametrize("text", ["", "  \n\t", "bad \ud800 surrogate"])
async def test_empty_or_unencodable_text_is_refused(paper: Paper, path: Path, text: str) -> None:
    with trio.fail_after(CEILING), pytest.raises(PaperError, match="nothing written"):
        await paper.ask("a1", text)
    assert not (await trio.Path(path).exists())


@pytest.mark.parametrize(("author", "to"), [("", None), ("a 1", None), ("a1", "x" * 65)])
async def test_author_and_addressee_must_be_agent_names(
    paper: Paper, author: str, to: str | None
) -> None:
    with trio.fail_after(CEILING), pytest.raises(PaperError, match="is not an agent name"):
        await paper.ask(author, "q?", to=to)


async def test_reply_attaches_news_that_concerns_the_caller_and_advances_its_cursor(
    paper: Paper,
) -> None:
    with trio.fail_after(CEILING):
        await paper.ask("a1", "Which lane caps workers?", to="a2")
        reply = await paper.ask("a2", "Is the cap per session?", to="a1")
        assert reply == "d2\nd1 a1 asks a2: Which lane caps workers?"
        assert (await paper.list("a2")).text == "No new entries (latest d2)."
        # An answer to a1's question and a question addressed to a1: both concern a1.
        await paper.answer("a2", "d1", "The default lane, capacity 3.")
        reply = await paper.answer("a1", "d2", "Yes, per session.")
        assert reply == (
            "d4\nd3 a2 answers d1: The default lane, capacity 3.\n"
            "d2 a2 asks a1: Is the cap per session?"
        )
        assert (await paper.list("a1")).text == "No new entries (latest d4)."


async def test_reply_with_news_for_others_counts_it_and_keeps_the_cursor(paper: Paper) -> None:
    with trio.fail_after(CEILING):
        await paper.ask("a3", "Anyone seen flaky sockets?")
        assert await paper.ask("a1", "q?") == "d2 (1 new entry; list to read)"
        await paper.ask("a2", "Is the cap per session?", to="a1")
        assert await paper.ask("a1", "q2?") == "d4 (2 new entries; list to read)"
        listed = await paper.list("a1")
        assert [entry.id for entry in listed.entries] == ["d3", "d1"]


async def test_reply_attaches_at_most_1000_chars(paper: Paper) -> None:
    with trio.fail_after(CEILING):
        prefix = len("d1 a2 asks a1: ")
        await paper.ask("a2", "x" * (1000 - prefix), to="a1")
        assert len((await paper.ask("a1", "fits")).split("\n")[1]) == 1000
        await paper.ask("a2", "x" * (1001 - prefix), to="a1")
        assert await paper.ask("a1", "too long") == "d4 (1 new entry; list to read)"
        assert [entry.id for entry in (await paper.list("a1")).entries] == ["d3"]


async def test_list_shows_unseen_entries_by_others_newest_first_then_nothing(
    paper: Paper,
) -> None:
    with trio.fail_after(CEILING):
        await paper.ask("a2", "first")
        await paper.ask("a1", "mine")
        await paper.ask("a3", "third", to="a2")
        listed = await paper.list("a1")
        assert listed.text == "d3 a3 asks a2: third\nd1 a2 asks everyone: first"
        assert [entry.id for entry in listed.entries] == ["d3", "d1"]
        assert (listed.omitted, listed.latest) == (0, "d3")
        again = await paper.list("a1")
        assert again.text == "No new entries (latest d3)."
        assert (again.entries, again.omitted, again.latest) == ((), 0, "d3")


async def test_list_of_an_empty_paper_says_latest_d0_and_creates_nothing(
    paper: Paper, path: Path
) -> None:
    with trio.fail_after(CEILING):
        assert (await paper.list("a1")).text == "No new entries (latest d0)."
    assert not (await trio.Path(path).exists())


async def test_list_clips_each_entry_to_400_chars_but_returns_it_whole(paper: Paper) -> None:
    with trio.fail_after(CEILING):
        await paper.ask("a2", "y" * 1600)
        listed = await paper.list("a1")
        assert len(listed.text) == 400
        assert listed.text.startswith("d1 a2 asks everyone: yyy")
        assert listed.text.endswith("y…")
        assert listed.entries[0].text == "y" * 1600


async def test_list_fits_4000_chars_and_says_how_many_older_it_omitted(paper: Paper) -> None:
    with trio.fail_after(CEILING):
        for n in range(20):
            await paper.ask("a2", f"{n} " + "z" * 1000)
        listed = await paper.list("a1")
        lines = listed.text.split("\n")
        assert [entry.id for entry in listed.entries] == [f"d{n}" for n in range(20, 11, -1)]
        assert listed.omitted == 11
        assert lines[-1] == "(11 older entries omitted, d1..d11; read a thread: question=dN)"
        assert all(len(line) == 400 for line in lines[:-1])
        assert len(listed.text) <= 4000 < len(listed.text) + 401  # one more line would not fit
        assert (await paper.list("a1")).text == "No new entries (latest d20)."


async def test_since_rereads_every_author_without_moving_the_cursor(paper: Paper) -> None:
    with trio.fail_after(CEILING):
        await paper.ask("a1", "mine")
        await paper.ask("a2", "yours")
        await paper.ask("a3", "theirs")
        whole = await paper.list("a1", since="d0")
        assert [entry.id for entry in whole.entries] == ["d3", "d2", "d1"]
        after = await paper.list("a1", since="d2")
        assert after.text == "d3 a3 asks everyone: theirs"
        nothing = await paper.list("a1", since="d3")
        assert nothing.text == "No entries after d3 (latest d3)."
        unseen = await paper.list("a1")
        assert [entry.id for entry in unseen.entries] == ["d3", "d2"]


async def test_question_reads_one_thread_whole_oldest_first_without_moving_the_cursor(
    paper: Paper,
) -> None:
    with trio.fail_after(CEILING):
        await paper.ask("a1", "q" * 1600, to="a2")
        await paper.ask("a3", "unrelated")
        await paper.answer("a2", "d1", "a" * 1600)
        await paper.answer("a3", "d1", "me too")
        thread = await paper.list("a1", question="d1")
        assert [entry.id for entry in thread.entries] == ["d1", "d3", "d4"]
        assert thread.text.split("\n") == [
            "d1 a1 asks a2: " + "q" * 1600,
            "d3 a2 answers d1: " + "a" * 1600,
            "d4 a3 answers d1: me too",
        ]
        assert [entry.id for entry in (await paper.list("a1")).entries] == ["d4", "d3", "d2"]


@pytest.mark.parametrize(
    ("since", "question", "match"),
    [
        ("d1", "d1", "since= and question= given together"),
        ("x", None, "'x' is not an entry id"),
        ("d", None, "'d' is not an entry id"),
        (None, "d0", "'d0' is not an entry id"),
        (None, "d7", "d7 is not on the paper"),
        (None, "d2", "d2 is an answer"),
    ],
)
async def test_list_refuses_bad_selectors(
    paper: Paper, since: str | None, question: str | None, match: str
) -> None:
    with trio.fail_after(CEILING):
        await paper.ask("a1", "q?")
        await paper.answer("a2", "d1", "a")
        with pytest.raises(PaperError, match=match):
            await paper.list("a1", since=since, question=question)


async def test_keeps_the_newest_64_entries_and_ids_keep_increasing(
    paper: Paper, path: Path
) -> None:
    with trio.fail_after(CEILING):
        for n in range(70):
            await paper.ask("a2", f"q{n}")
        ids = [entry["id"] for entry in (await on_file(path))["entries"]]
        assert ids == [f"d{n}" for n in range(7, 71)]
        assert await paper.ask("a2", "next") == "d71"
        assert (await paper.list("a1")).latest == "d71"


async def test_file_stays_within_64_kib_evicting_the_oldest_first(paper: Paper, path: Path) -> None:
    with trio.fail_after(CEILING):
        for _ in range(40):
            await paper.ask("a2", "€" * 1600)  # 4800 bytes of UTF-8 each
        size = (await trio.Path(path).stat()).st_size
        kept = [entry["id"] for entry in (await on_file(path))["entries"]]
        one_entry = len(
            json.dumps((await on_file(path))["entries"][0], ensure_ascii=False).encode()
        )
        assert size <= 64 * 1024 < size + one_entry + 1  # no entry evicted needlessly
        assert kept == [f"d{n}" for n in range(41 - len(kept), 41)]
        assert len(kept) == 13


async def test_file_is_compact_utf8_json_0600_beside_a_separate_0600_lock(
    paper: Paper, path: Path
) -> None:
    with trio.fail_after(CEILING):
        await paper.ask("a1", "Grüße €")
    data = await trio.Path(path).read_bytes()
    assert "Grüße €".encode() in data
    assert b", " not in data
    assert b'": ' not in data
    assert (await trio.Path(path).stat()).st_mode & 0o777 == 0o600
    lock = path.with_name("paper.json.lock")
    assert (await trio.Path(lock).stat()).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["paper.json", "paper.json.lock"]


VALID_ENTRY = {
    "id": "d1",
    "kind": "question",
    "author": "a1",
    "to": None,
    "question": None,
    "text": "q?",
    "at": 1.5,
}


def sheet(**changes: object) -> bytes:
    fields = {"format": "fleet-paper/1", "paper": "ab12", "last": 1, "entries": [VALID_ENTRY]}
    return json.dumps(fields | changes).encode()


@pytest.mark.parametrize(
    "corrupt",
    [
        b"",
        b"not json",
        b'{"format": "fleet-paper/1", "paper": "ab", "last": 1, "entries": [',
        b"[]",
        b"\xff\xfe",
        b"[" * 100_000,
        sheet(format="fleet-paper/2"),
        sheet(extra=1),
        sheet(last="1"),
        sheet(last=0),
        sheet(paper=""),
        sheet(entries=[VALID_ENTRY | {"kind": "note"}]),
        sheet(entries=[VALID_ENTRY | {"at": "now"}]),
        sheet(entries=[VALID_ENTRY | {"text": "x" * 1601}]),
        sheet(entries=[VALID_ENTRY | {"question": "d1"}]),
        sheet(entries=[VALID_ENTRY, VALID_ENTRY]),
        sheet(entries=[VALID_ENTRY | {"text": "\ud800"}]),
        sheet(entries=[VALID_ENTRY | {"id": f"d{n}"} for n in range(1, 66)], last=65),
        b'{"padding": "' + b"x" * (64 * 1024) + b'"}',
    ],
)
async def test_corrupt_file_reads_as_empty_and_is_kept_aside_on_the_next_write(
    paper: Paper, path: Path, corrupt: bytes
) -> None:
    await trio.Path(path).write_bytes(corrupt)
    with trio.fail_after(CEILING):
        assert (await paper.list("a1")).text == "No new entries (latest d0)."
        assert (await trio.Path(path).read_bytes()) == corrupt
        assert await paper.ask("a1", "fresh start") == "d1"
    assert (await trio.Path(path.with_name("paper.json.corrupt")).read_bytes()) == corrupt
    assert [entry["text"] for entry in (await on_file(path))["entries"]] == ["fresh start"]


async def test_a_symlink_at_the_path_is_neither_read_nor_written_through(
    paper: Paper, path: Path, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere.json"
    await trio.Path(target).write_bytes(sheet())
    await trio.Path(path).symlink_to(target)
    with trio.fail_after(CEILING):
        assert (await paper.list("a1")).text == "No new entries (latest d0)."
        assert await paper.ask("a1", "q?") == "d1"
    assert (await trio.Path(target).read_bytes()) == sheet()
    assert not (await trio.Path(path).is_symlink())


async def test_a_fifo_at_the_path_does_not_hang_and_is_moved_aside(
    paper: Paper, path: Path
) -> None:
    os.mkfifo(path)
    with trio.fail_after(CEILING):
        assert (await paper.list("a1")).text == "No new entries (latest d0)."
        assert await paper.ask("a1", "q?") == "d1"
    assert (await on_file(path))["last"] == 1


async def test_a_missing_session_directory_is_a_one_line_error(tmp_path: Path) -> None:
    paper = Paper(tmp_path / "gone" / "paper.json")
    with trio.fail_after(CEILING):
        assert (await paper.list("a1")).text == "No new entries (latest d0)."
        with pytest.raises(PaperError, match=r"^paper lock: .*No such file or directory \(check"):
            await paper.ask("a1", "q?")


async def test_a_failed_write_is_a_one_line_error_and_leaves_the_file_alone(
    paper: Paper, path: Path
) -> None:
    # A directory at the paper path is corrupt, but the one at .corrupt cannot be replaced by it.
    for directory in (path, path.with_name("paper.json.corrupt")):
        await trio.Path(directory / "keep").mkdir(parents=True)
    with trio.fail_after(CEILING):
        with pytest.raises(PaperError, match=r"^paper ask by a1: .*: Directory not empty \(") as e:
            await paper.ask("a1", "q?")
        assert "\n" not in str(e.value)
    assert await trio.Path(path / "keep").is_dir()


async def test_a_valid_file_is_read_back_by_a_new_instance(paper: Paper, path: Path) -> None:
    await trio.Path(path).write_bytes(sheet())
    with trio.fail_after(CEILING):
        assert (await paper.list("a2")).text == "d1 a1 asks everyone: q?"
        assert await Paper(path).ask("a2", "continues") == "d2 (1 new entry; list to read)"
    assert [entry["id"] for entry in (await on_file(path))["entries"]] == ["d1", "d2"]
    assert (await on_file(path))["paper"] == "ab12"


async def test_cursors_belong_to_each_instance_and_each_reader(paper: Paper, path: Path) -> None:
    with trio.fail_after(CEILING):
        await paper.ask("a1", "q?")
        assert len((await paper.list("a2")).entries) == 1
        assert len((await paper.list("a3")).entries) == 1
        assert len((await Paper(path).list("a2")).entries) == 1
        assert (await paper.list("a2")).text == "No new entries (latest d1)."


async def test_cursors_start_over_when_the_file_is_recreated(paper: Paper, path: Path) -> None:
    with trio.fail_after(CEILING):
        for n in range(3):
            await paper.ask("a2", f"old {n}")
        assert len((await paper.list("a1")).entries) == 3
        await trio.Path(path).unlink()
        assert await paper.ask("a2", "new paper") == "d1"
        assert [entry.text for entry in (await paper.list("a1")).entries] == ["new paper"]


#: The writers' patience in the tests of lost entries: the one-second bound has its own test
#: (virtual clock); on a loaded machine a writer's turn with the lock can take longer.
PATIENT = 60.0


async def test_concurrent_tasks_in_one_process_lose_no_entry(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_paper, "LOCK_PATIENCE", PATIENT)

    async def writer(name: str) -> None:
        own = Paper(path)
        for n in range(8):
            await own.ask(name, f"{name} {n}")

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            for k in range(6):
                nursery.start_soon(writer, f"w{k}")
    entries = (await on_file(path))["entries"]
    assert [entry["id"] for entry in entries] == [f"d{n}" for n in range(1, 49)]
    assert sorted(entry["text"] for entry in entries) == sorted(
        f"w{k} {n}" for k in range(6) for n in range(8)
    )


async def test_the_lock_wait_yields_and_gives_up_at_exactly_one_second(
    paper: Paper, path: Path, autojump_clock: trio.abc.Clock
) -> None:
    fd = os.open(path.with_name("paper.json.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(PaperError, match=r"^paper busy: .* \(retry\)$"):
            await paper.ask("a1", "q?")
        assert trio.current_time() == 1.0
    finally:
        os.close(fd)
    assert not (await trio.Path(path).exists())
    assert await paper.ask("a1", "q?") == "d1"


HOLDER = """
import fcntl, sys
lock = open(sys.argv[1], "a")
fcntl.flock(lock, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


async def test_a_lock_held_by_another_process_makes_the_writer_give_up_after_about_1_s(
    paper: Paper, path: Path
) -> None:
    lock = path.with_name("paper.json.lock")
    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await trio.sleep(0.05)
            ticks += 1

    try:
        with trio.fail_after(CEILING):
            assert holder.stdout is not None
            said = b""
            while not said.endswith(b"\n"):
                said += await holder.stdout.receive_some()
            assert said == b"locked\n"
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tick)
                started = time.monotonic()
                with pytest.raises(PaperError, match=r"^paper busy: .* \(retry\)$"):
                    await paper.ask("a1", "q?")
                waited = time.monotonic() - started
                nursery.cancel_scope.cancel()
    finally:
        holder.kill()
        await holder.wait()
    assert 0.95 <= waited < 2.0
    assert ticks >= 10  # the event loop kept running while the writer waited
    assert not (await trio.Path(path).exists())


WRITER = """
import sys
import trio
from pathlib import Path
from typing import Any
from orchestrator.coordination import _paper
from orchestrator.coordination._paper import Paper

_paper.LOCK_PATIENCE = 60.0  # see PATIENT

async def main():
    paper = Paper(Path(sys.argv[1]))
    for n in range(int(sys.argv[3])):
        await paper.ask(sys.argv[2], f"{sys.argv[2]} {n}")

trio.run(main)
"""


@pytest.mark.slow
async def test_writers_in_four_processes_lose_no_entry_and_the_file_stays_valid(
    path: Path,
) -> None:
    writers, asks = 4, 30
    reads = 0

    async def write(name: str) -> None:
        argv = [sys.executable, "-c", WRITER, str(path), name, str(asks)]
        await trio.run_process(argv, cwd=REPO)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for k in range(writers):
                nursery.start_soon(write, f"p{k}")
            while len(nursery.child_tasks) > 0:
                try:
                    data = await trio.Path(path).read_bytes()
                except FileNotFoundError:
                    data = b""
                if data:
                    assert len(data) <= 64 * 1024
                    assert json.loads(data)["format"] == "fleet-paper/1"
                    reads += 1
                await trio.sleep(0.001)
    content = await on_file(path)
    numbers = [int(entry["id"][1:]) for entry in content["entries"]]
    assert content["last"] == writers * asks
    assert numbers == list(range(writers * asks - 63, writers * asks + 1))
    assert reads > 10
