"""The discussion paper: one bounded JSON file of terse questions and answers per parent session.

``ask`` (optionally addressed to one agent) and ``answer`` (to a question id) reply with the new
id only, never echoing the text; ``list`` shows a reader what it has not seen, newest first and
bounded, so the paper never becomes a second transcript. The file keeps a bounded number of
entries (:mod:`._paper_file` sets the limits): the oldest go first and ids keep
increasing.

A write is read-modify-write under ``flock`` on a separate ``<paper>.lock`` (locking the file we
``os.replace`` would serialize nothing), polled with ``trio.sleep`` so waiting yields to the event
loop, then an atomic rewrite. Reads take no lock: a reader sees the old file or the new one.

Read cursors (the highest id a reader has been shown) live in the ``Paper`` instance: per
process, keyed by reader, and tied to one incarnation of the file, so they start over when a
missing or corrupt file is recreated and ids restart at d1. A corrupt file reads as empty; the
next write keeps its bytes as ``<paper>.corrupt``. A file that cannot be *opened* (permissions,
I/O) raises ``PaperError`` instead, so a valid paper is never replaced because a read failed.
"""

import contextlib
import fcntl
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Final, Literal, NoReturn, TypeVar

import attrs
import trio

from orchestrator._errors import Refused
from orchestrator.coordination._paper_file import (
    AGENT_NAME,
    ENTRY_ID,
    MAX_TEXT,
    Entry,
    Sheet,
    pack_sheet,
    read_sheet,
    text_fault,
    write_atomic,
)

#: The parent's name on the paper (children write under their keys, ``a1``...).
PARENT: Final = "parent"
LIST_BUDGET: Final = 4000
LIST_CLIP: Final = 400
ATTACH_BUDGET: Final = 1000
LOCK_PATIENCE: Final = 1.0
# Short enough that a writer holding the lock for one fsync costs a waiter little, long enough
# that a busy paper does not spin the event loop.
_LOCK_POLL: Final = 0.005
_T = TypeVar("_T")


class PaperError(Refused):
    """A paper operation was refused (bad input, unknown question, busy lock) or failed.

    The message is one line ending in what to do; ``path`` is the paper file concerned. It is a
    ``Refused`` so the control API and the CLI report it like any refusal (exit code 4).
    """

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = path


@attrs.frozen(kw_only=True)
class ListResult:
    """What ``Paper.list`` found; ``text`` is the rendering a child or the CLI shows."""

    entries: tuple[Entry, ...]
    omitted: int
    latest: str
    text: str


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _entries(count: int) -> str:
    return "entry" if count == 1 else "entries"


def _omission(older: Sequence[Entry]) -> str:
    """The note standing in for ``older`` (newest first) entries a list left out."""
    if not older:
        return ""
    span = f"{older[-1].id}..{older[0].id}"
    return (
        f"({len(older)} older {_entries(len(older))} omitted, {span}; read a thread: question=dN)"
    )


def _page(chosen: Sequence[Entry], latest: str) -> ListResult:
    """Newest first, each line clipped, as many as fit ``LIST_BUDGET`` with the omission note."""
    newest_first = chosen[::-1]
    lines: list[str] = []
    size = -1  # the first line needs no separating newline
    note = ""
    for index, entry in enumerate(newest_first):
        line = _clip(entry.render(), LIST_CLIP)
        candidate = _omission(newest_first[index + 1 :])
        if size + 1 + len(line) + len(candidate) + bool(candidate) > LIST_BUDGET:
            break
        lines.append(line)
        size += 1 + len(line)
        note = candidate
    shown = newest_first[: len(lines)]
    return ListResult(
        entries=tuple(shown),
        omitted=len(chosen) - len(shown),
        latest=latest,
        text="\n".join([*lines, note] if note else lines),
    )


@attrs.define(eq=False)
class Paper:
    """The discussion paper at ``path``, with this process's read cursors.

    Every write opens its own lock descriptor: ``flock`` excludes other open file descriptions,
    so concurrent tasks of one process are serialized exactly like other processes.
    """

    path: Path
    _cursors: dict[str, tuple[str, int]] = attrs.field(init=False, factory=dict)

    async def ask(self, author: str, text: str, *, to: str | None = None) -> str:
        """Append a question (to one agent, or everyone); return its id plus any news for it."""
        self._check("ask", author, to)
        return await self._append(author, text, to, None)

    async def answer(self, author: str, question: str, text: str) -> str:
        """Append an answer to question ``question``; return its id plus any news for it."""
        self._check("answer", author, entry=question)
        return await self._append(author, text, None, question)

    async def list(
        self, reader: str, *, since: str | None = None, question: str | None = None
    ) -> ListResult:
        """Unseen entries by others (advancing ``reader``'s cursor), or a reread.

        ``since="dN"`` rereads every entry after dN (``d0``: the whole paper) and ``question="dN"``
        reads one thread whole, oldest first; neither moves the cursor.
        """
        self._check("list", reader, entry=question)
        if since is not None and question is not None:
            self._refuse("list", "since= and question= given together", "pass one of them")
        if since is not None and since != "d0":
            self._check("list", entry=since)
        sheet, _ = await self._io("list", lambda: read_sheet(self.path))
        latest = f"d{sheet.last}"
        if question is not None:
            asked = self._question(sheet, question, "list")
            thread = (asked, *(e for e in sheet.entries if e.question == question))
            text = "\n".join(entry.render() for entry in thread)
            return ListResult(entries=thread, omitted=0, latest=latest, text=text)
        if since is not None:
            chosen = [entry for entry in sheet.entries if entry.number > int(since[1:])]
            empty = f"No entries after {since} (latest {latest})."
        else:
            seen = self._seen(reader, sheet)
            self._advance(reader, sheet)
            chosen = [e for e in sheet.entries if e.number > seen and e.author != reader]
            empty = f"No new entries (latest {latest})."
        if not chosen:
            return ListResult(entries=(), omitted=0, latest=latest, text=empty)
        return _page(chosen, latest)

    async def _append(self, author: str, text: str, to: str | None, question: str | None) -> str:
        operation = f"{'ask' if question is None else 'answer'} by {author}"
        if (cause := text_fault(text)) is not None:
            hint = f"write a terse entry of 1-{MAX_TEXT} chars; split longer ones"
            self._refuse(operation, f"{cause}, nothing written", hint)
        async with self._locked():
            sheet, corrupt = await self._io(operation, lambda: read_sheet(self.path))
            if question is not None:  # checked under the lock: a writer may just have evicted it
                to = self._question(sheet, question, operation).author
            number = sheet.last + 1
            kind: Literal["question", "answer"] = "question" if question is None else "answer"
            entry = Entry(
                id=f"d{number}",
                kind=kind,
                author=author,
                to=to,
                question=question,
                text=text,
                at=time.time(),
            )
            paper = sheet.paper or secrets.token_hex(8)
            grown = attrs.evolve(sheet, paper=paper, last=number, entries=(*sheet.entries, entry))
            sheet, data = pack_sheet(grown)
            await self._io(operation, lambda: write_atomic(self.path, data, set_aside=corrupt))
            # Still under the lock, so a concurrent call by the same reader sees our cursor.
            return self._reply(author, sheet, entry)

    def _reply(self, reader: str, sheet: Sheet, entry: Entry) -> str:
        seen = self._seen(reader, sheet)
        unseen = [e for e in sheet.entries if e.number > seen and e.author != reader]
        if not unseen:
            self._advance(reader, sheet)
            return entry.id
        block = "\n".join(e.render() for e in reversed(unseen))
        if len(block) <= ATTACH_BUDGET and all(e.to == reader for e in unseen):
            self._advance(reader, sheet)
            return f"{entry.id}\n{block}"
        return f"{entry.id} ({len(unseen)} new {_entries(len(unseen))}; list to read)"

    def _seen(self, reader: str, sheet: Sheet) -> int:
        paper, number = self._cursors.get(reader, ("", 0))
        return number if paper == sheet.paper else 0

    def _advance(self, reader: str, sheet: Sheet) -> None:
        # max: a list that read an older snapshot must not move the cursor back.
        self._cursors[reader] = (sheet.paper, max(sheet.last, self._seen(reader, sheet)))

    def _question(self, sheet: Sheet, question: str, operation: str) -> Entry:
        asked = sheet.find(question)
        hint = "list to see current question ids"
        if asked is None:
            self._refuse(operation, f"{question} is not on the paper: evicted or never asked", hint)
        if asked.kind != "question":
            self._refuse(operation, f"{question} is an answer, not a question", hint)
        return asked

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        lock = self.path.with_name(f"{self.path.name}.lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            self._refuse("lock", f"{lock}: {exc.strerror}", "check the session directory")
        try:
            deadline = trio.current_time() + LOCK_PATIENCE
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    now = trio.current_time()
                    if now >= deadline:
                        held = f"{self.path} stayed locked by another writer"
                        self._refuse("busy", f"{held} for {LOCK_PATIENCE:g} s", "retry")
                    await trio.sleep_until(min(now + _LOCK_POLL, deadline))
            yield
        finally:
            os.close(fd)  # closing the only descriptor of this open file drops the flock

    def _check(self, operation: str, *names: str | None, entry: str | None = None) -> None:
        for name in names:
            if name is not None and AGENT_NAME.fullmatch(name) is None:
                hint = "use 1-64 letters, digits, '_', '.', '@', ':' or '-'"
                self._refuse(operation, f"{name[:80]!r} is not an agent name", hint)
        if entry is not None and ENTRY_ID.fullmatch(entry) is None:
            self._refuse(operation, f"{entry[:80]!r} is not an entry id", "pass one like d7")

    async def _io(self, operation: str, work: Callable[[], _T]) -> _T:
        try:
            return await trio.to_thread.run_sync(work)
        except OSError as exc:
            where = exc.filename if isinstance(exc.filename, str) else self.path
            self._refuse(operation, f"{where}: {exc.strerror}", "check the session directory")

    def _refuse(self, operation: str, cause: str, hint: str) -> NoReturn:
        raise PaperError(f"paper {operation}: {cause} ({hint})", path=self.path)
