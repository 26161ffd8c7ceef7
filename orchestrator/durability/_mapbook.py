"""A map's ledger: ``maps/<id>.jsonl`` in the session directory, the record a resumed map reads.

The same versioned record lines as the session journal (:mod:`._format`), two kinds:

- ``map`` (first line): the map's spec — template, agent, schema, caps, out file — and its
  selected rows (id, key, task), so ``fleet map --resume ID`` needs nothing but the id;
- ``row``: one row's final outcome (``status`` ``done`` or ``failed``, its ``result`` or
  ``error``, ``usage``, ``attempts``, the child ``child`` that ran it), written and fsynced
  *before* the row counts as finished anywhere else (the out file, progress), so a row in the
  out file is always in the ledger.

A resumed map runs exactly the rows without a ``row`` record; a torn last line (a crash mid
write) is no record. Writes are synchronous and meant for a worker thread.
"""

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import orjson

import ipc
from orchestrator._errors import NotFound, UsageError
from orchestrator.durability._format import JournalRecord, parse_journal

__all__ = ["MapBook", "MapState"]


@attrs.frozen(kw_only=True)
class MapState:
    """What a ledger holds: the spec and the outcome of each finished row, by row id."""

    id: str
    spec: Mapping[str, Any]
    outcomes: Mapping[int, Mapping[str, Any]]
    warnings: tuple[str, ...] = ()


@attrs.define(eq=False)
class MapBook:
    """The ledgers of one session's maps (a directory, 0700; each file 0600)."""

    root: Path
    _seq: dict[str, int] = attrs.Factory(dict)

    def path(self, map_id: str) -> Path:
        if not map_id.startswith("m") or not map_id[1:].isdigit():
            raise UsageError(f"map: {map_id!r} is not a map id (m1, m2, ...)")
        return self.root / f"{map_id}.jsonl"

    def new_id(self) -> str:
        """The next unused id (``m1``, ``m2``, ... over every map this session kept)."""
        ipc.ensure_private_dir(self.root)
        taken = [int(p.stem[1:]) for p in self.root.glob("m*.jsonl") if p.stem[1:].isdigit()]
        return f"m{max(taken, default=0) + 1}"

    def begin(self, map_id: str, spec: Mapping[str, Any]) -> None:
        """Write *map_id*'s first record; refuses an id that exists."""
        ipc.ensure_private_dir(self.root)
        fd = os.open(self.path(map_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        try:
            os.write(fd, self._line(map_id, "map", spec))
            os.fsync(fd)
        finally:
            os.close(fd)

    def finished(self, map_id: str, row: int, outcome: Mapping[str, Any]) -> None:
        """Record row *row*'s final outcome, durably, before anyone else hears of it."""
        fd = os.open(self.path(map_id), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, self._line(map_id, "row", {**outcome, "row": row}))
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self, map_id: str) -> MapState:
        path = self.path(map_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise NotFound(f"map: no map {map_id} in this session (see {self.root})") from None
        found = parse_journal(data, where=str(path))
        if found.torn:
            # A crash cut the last line short: cut it off so the next record starts clean.
            os.truncate(path, len(data) - found.torn)
        spec: Mapping[str, Any] | None = None
        outcomes: dict[int, Mapping[str, Any]] = {}
        for record in found.records:
            if record.kind == "map" and spec is None:
                spec = record.fields
            elif record.kind == "row" and isinstance(record.fields.get("row"), int):
                # The first final outcome of a row is the one: a row never finishes twice.
                outcomes.setdefault(record.fields["row"], record.fields)
        if spec is None:
            raise NotFound(f"map: {path} has no map record (it cannot be resumed)")
        self._seq[map_id] = max((r.seq for r in found.records), default=0)
        return MapState(id=map_id, spec=spec, outcomes=outcomes, warnings=found.warnings)

    def _line(self, map_id: str, kind: str, fields: Mapping[str, Any]) -> bytes:
        seq = self._seq.get(map_id, 0) + 1
        self._seq[map_id] = seq
        record = JournalRecord(seq=seq, at=time.time(), kind=kind, key=map_id, fields=fields)
        return orjson.dumps(record.as_json()) + b"\n"
