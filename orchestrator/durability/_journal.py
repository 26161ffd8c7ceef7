"""The session journal: ``journal.jsonl``, appended by one supervisor, read by the next.

:meth:`Journal.append` only buffers (it runs on the event loop); :meth:`Journal.flush` writes
the buffer in one ``write`` on an ``O_APPEND`` descriptor and fsyncs when a *durable* record (a
state change) is among it. :func:`keep_journal` is the task that flushes: at once after a
durable record, else every :data:`FLUSH_INTERVAL`, in a worker thread.

A write that fails (a full disk) leaves the file as it was — a partial write is cut back — and
keeps every record in memory, retried on each flush, with one warning per outage: nothing is
lost while the supervisor lives. Past :attr:`Journal.cap_bytes` the file rotates: the old one
becomes ``journal.1.jsonl`` and the new one starts with one ``child`` record per child a later
supervisor still needs (live, lost, or with an unresolved worktree), so the journal stays
bounded and never forgets a child it may have to revive.
"""

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs
import trio

import ipc
from orchestrator.durability._format import (
    SUPERVISOR_KINDS,
    ChildFacts,
    JournalRecord,
    ReadResult,
    apply,
    fold,
    last_supervisor,
    parse_journal,
)

__all__ = ["CAP_BYTES", "FLUSH_INTERVAL", "Journal", "keep_journal"]

log = logging.getLogger(__name__)

#: Rotate past this size (bytes).
CAP_BYTES: Final = 8 << 20
#: Buffered records are written at least this often (seconds).
FLUSH_INTERVAL: Final = 0.2
#: Records ``fleet events`` serves from memory without reading the file.
RECENT: Final = 4096


def previous(path: Path) -> Path:
    """Where a rotated journal goes (``journal.1.jsonl`` beside ``journal.jsonl``)."""
    return path.with_name(f"{path.stem}.1{path.suffix}")


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


@attrs.define(eq=False)
class Journal:
    """The writer of one session's journal. Create it with :meth:`open`."""

    path: Path
    cap_bytes: int = CAP_BYTES
    warn: Callable[[str], None] = log.warning
    facts: dict[str, ChildFacts] = attrs.Factory(dict)
    #: What the journal held when this supervisor opened it (the previous one's records).
    found: ReadResult = attrs.Factory(lambda: ReadResult(records=()))
    #: The newest ``serve``/``shutdown`` record (a rotation carries it over).
    supervisor: JournalRecord | None = None
    _seq: int = 0
    _size: int = 0
    _fd: int = -1
    _buffer: list[JournalRecord] = attrs.Factory(list)
    _sync: bool = False
    _failing: bool = False
    _lock: threading.Lock = attrs.Factory(threading.Lock)
    #: One flush at a time (the keeper's thread, or ``since`` on the event loop).
    _writing: threading.Lock = attrs.Factory(threading.Lock)
    _recent: collections.deque[JournalRecord] = attrs.Factory(
        lambda: collections.deque(maxlen=RECENT)
    )
    wake: trio.Event = attrs.Factory(trio.Event)
    #: Set (and replaced) by every append: what ``fleet events --follow`` waits on.
    grown: trio.Event = attrs.Factory(trio.Event)

    @classmethod
    def open(
        cls, path: Path, *, cap_bytes: int = CAP_BYTES, warn: Callable[[str], None] = log.warning
    ) -> "Journal":
        """Open (creating, 0600) the journal at *path* and read what it already holds.

        Each kind of damage found (a torn last line, records of a newer version) is reported
        once through *warn*; a torn last line is cut off so the next record starts on its own.
        """
        data = _read(path)
        if data is None:  # a rotation that crashed between its two renames
            data = _read(previous(path))
            if data is not None:
                os.replace(previous(path), path)
        found = parse_journal(data or b"", where=f"journal {path}")
        for line in found.warnings:
            warn(line)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        os.fchmod(fd, 0o600)
        size = len(data or b"") - found.torn
        if found.torn:
            os.ftruncate(fd, size)
        journal = cls(path=path, cap_bytes=cap_bytes, warn=warn, found=found)
        journal._fd, journal._size = fd, size
        journal._seq = max((r.seq for r in found.records), default=0)
        journal.facts = fold(found.records)
        journal.supervisor = last_supervisor(found.records)
        return journal

    @property
    def seq(self) -> int:
        """The newest record's sequence number (0: none yet)."""
        return self._seq

    def append(self, kind: str, key: str = "", *, durable: bool = False, **fields: Any) -> int:
        """Buffer one record and return its ``seq``; *durable* ones are fsynced when written."""
        with self._lock:
            self._seq += 1
            record = JournalRecord(
                seq=self._seq, at=round(time.time(), 3), kind=kind, key=key, fields=fields
            )
            self._buffer.append(record)
            self._sync = self._sync or durable
            self._recent.append(record)
            apply(self.facts, record)
            if key == "" and kind in SUPERVISOR_KINDS:
                self.supervisor = record
        if durable:
            self.wake.set()
        self.grown.set()
        self.grown = trio.Event()
        return record.seq

    def flush(self) -> bool:
        """Write what is buffered (blocking); ``False`` when the disk refused it (kept)."""
        with self._writing:
            return self._flush()

    def _flush(self) -> bool:
        with self._lock:
            records, sync = list(self._buffer), self._sync
        if not records or self._fd < 0:
            return True
        data = b"".join(record.line() for record in records)
        try:
            self._write(data, sync=sync)
        except OSError as exc:
            if not self._failing:
                self.warn(
                    f"journal {self.path} not written ({exc.strerror or exc}); "
                    f"{len(records)} record(s) kept in memory and retried"
                )
            self._failing = True
            return False
        if self._failing:
            self.warn(f"journal {self.path} is written again")
        self._failing = False
        with self._lock:
            del self._buffer[: len(records)]
            self._sync = self._sync and bool(self._buffer)
            # Under the lock, with nothing buffered: no record can fall between the old file
            # and the new one's compacted records (a busy journal rotates at a later flush).
            if self._size > self.cap_bytes and not self._buffer:
                self._rotate()
        return True

    def _write(self, data: bytes, *, sync: bool) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
            if sync:
                os.fsync(self._fd)
        except OSError:
            # All or nothing: a half-written batch would leave a torn line mid-file.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)

    def _rotate(self) -> None:
        """Start a new file holding one ``child`` record per child still needed (called with
        the lock held and the buffer empty)."""
        kept = [facts for facts in self.facts.values() if facts.keep]
        records = []
        was = self.supervisor
        if self.supervisor is not None:
            self._seq += 1
            self.supervisor = attrs.evolve(self.supervisor, seq=self._seq)
            records.append(self.supervisor)
        for facts in kept:
            self._seq += 1
            records.append(
                JournalRecord(
                    seq=self._seq,
                    at=round(time.time(), 3),
                    kind="child",
                    key=facts.key,
                    fields=facts.as_fields(),
                )
            )
        data = b"".join(record.line() for record in records)
        fresh = self.path.with_name(f"{self.path.stem}.next{self.path.suffix}")
        try:
            ipc.write_private(fresh, data)
            os.replace(self.path, previous(self.path))
            os.replace(fresh, self.path)
        except OSError as exc:
            self._seq -= len(records)  # none of them was written
            self.supervisor = was
            self.warn(f"journal {self.path} not rotated ({exc.strerror or exc}); it grows on")
            return
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path, flags)
        os.close(self._fd)
        self._fd, self._size = fd, len(data)
        self.facts = {facts.key: facts for facts in kept}
        self._recent.extend(records)

    @property
    def pending(self) -> bool:
        """Whether records wait to be written."""
        return bool(self._buffer)

    def since(self, seq: int) -> list[dict[str, Any]]:
        """Every record after *seq*, oldest first, as ``fleet events --json`` prints them
        (blocking when it must read the files: call it from a thread)."""
        with self._lock:  # appends go on meanwhile, on the event loop
            recent = list(self._recent)
        if recent and recent[0].seq <= seq + 1:
            return [r.as_json() for r in recent if r.seq > seq]
        return [r.as_json() for r in self._on_disk() if r.seq > seq]

    def _on_disk(self) -> Iterator[JournalRecord]:
        self.flush()
        seen = 0
        for path in (previous(self.path), self.path):
            data = _read(path) or b""
            for record in parse_journal(data).records:
                if record.seq > seen:
                    seen = record.seq
                    yield record
        with self._lock:
            unwritten = list(self._buffer)  # not written yet (a full disk)
        yield from (record for record in unwritten if record.seq > seen)

    def close(self) -> None:
        self.flush()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


async def keep_journal(journal: Journal, interval: float = FLUSH_INTERVAL) -> None:
    """Flush *journal* at once after a durable record, else every *interval*, forever."""
    while True:
        with trio.move_on_after(interval):
            await journal.wake.wait()
        journal.wake = trio.Event()
        if journal.pending:
            await trio.to_thread.run_sync(journal.flush)
