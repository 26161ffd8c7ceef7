"""Settle notifications: the parent never has to poll.

Each settled turn (or failure, or question) leaves one note. ``wait`` hands out every note that
is ready in one coalesced batch; each note carries the child's peek line and its report clipped
to 1200 characters.
"""

import math
from collections.abc import AsyncIterator, Collection
from typing import Any

import attrs
import trio

from orchestrator._records import ACTIVE, REPORT_CLIP, ChildRecord, clip


def _note(record: ChildRecord, *, report: str, error: str) -> dict[str, Any]:
    """The one place a note is built: its report is always clipped (``REPORT_CLIP``)."""
    note = {
        "key": record.key,
        "name": record.name,
        "state": str(record.state),
        "peek": record.peek_line(),
        "report": clip(report),
        "clipped": len(report) > REPORT_CLIP,
        "error": error,
        "observed": dict(record.observed),
    } | ({"incomplete": record.incomplete} if record.incomplete else {})
    return record.with_result(note)


@attrs.define(eq=False)
class Notes:
    """The queue of settle notes and the waiters on it."""

    pending: list[dict[str, Any]] = attrs.Factory(list)
    _changed: trio.Event = attrs.Factory(trio.Event)

    def push(
        self,
        record: ChildRecord,
        *,
        report: str = "",
        error: str = "",
        question: tuple[str, str] | None = None,
        failure: bool = False,
    ) -> None:
        note = _note(record, report=report, error=error)
        if question is not None:
            note["question"] = {"id": question[0], "text": question[1]}
        if failure and record.failure is not None:
            note["failure"] = record.failure
        self.pending.append(note)
        self.changed()

    def changed(self) -> None:
        """Wake every waiter (a note arrived or a child's state moved)."""
        self._changed.set()
        self._changed = trio.Event()

    def take(self, keys: Collection[str] = ()) -> list[dict[str, Any]]:
        """Remove and return the pending notes (for *keys* only, when given)."""
        taken = [n for n in self.pending if not keys or n["key"] in keys]
        self.pending = [n for n in self.pending if n not in taken]
        return taken

    async def wait(
        self,
        records: dict[str, ChildRecord],
        keys: Collection[str] = (),
        *,
        every: bool = False,
        timeout: float = math.inf,  # noqa: ASYNC109 - fleet wait --timeout
    ) -> list[dict[str, Any]] | None:
        """Wait until one (or, with *every*, each named) child settles; ``None`` on timeout.

        With no *keys*: returns pending notes at once, an empty list when no child is active,
        else the next batch. A named child that is not active counts as settled now.
        """
        with trio.move_on_after(timeout):
            while True:
                event = self._changed
                ready = self._ready(records, keys, every=every)
                if ready is not None:
                    return ready
                await event.wait()
        return None

    def _ready(
        self, records: dict[str, ChildRecord], keys: Collection[str], *, every: bool
    ) -> list[dict[str, Any]] | None:
        if not keys:
            if self.pending:
                return self.take()
            if not any(r.state in ACTIVE or r.queued for r in records.values()):
                return []
            return None
        settled = {
            key
            for key in keys
            if key not in records
            or (records[key].state not in ACTIVE and not records[key].queued)
            or any(n["key"] == key for n in self.pending)
        }
        if (every and settled != set(keys)) or not settled:
            return None
        notes = self.take(settled)
        noted = {n["key"] for n in notes}
        for key in settled - noted:
            record = records.get(key)
            if record is not None:
                notes.append(_note(record, report=record.report, error=record.error))
        return notes

    async def stream(self, records: dict[str, ChildRecord]) -> AsyncIterator[list[dict[str, Any]]]:
        """Every batch of notes, forever (the embeddable API's notification iterator)."""
        while True:
            event = self._changed
            if self.pending:
                yield self.take()
                continue
            await event.wait()
