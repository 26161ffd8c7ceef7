"""A map's out file: one JSON line per finished row, appended as rows finish.

The ledger (:class:`orchestrator.durability.MapBook`) is written first and is the record; the
out file is the user's copy. :func:`reconcile_out` repairs it on a resume: a torn last line is
cut and every ledger outcome the out file lacks is appended, so each row is there exactly once.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from orchestrator.durability import MapState

__all__ = ["append_out", "out_line", "reconcile_out"]


def out_line(map_id: str, row: int, key: str, outcome: Mapping[str, Any]) -> bytes:
    shown = {"map": map_id, "row": row, "key": key}
    shown |= {k: v for k, v in outcome.items() if k not in {"row", "v", "seq", "at", "kind"}}
    return orjson.dumps(shown) + b"\n"


def append_out(path: Path, line: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(line)


def reconcile_out(path: Path, state: MapState) -> None:
    """Append to the out file every ledger outcome it lacks (a crash between the two writes)."""
    present: set[int] = set()
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        text = b""
    lines = text.split(b"\n")
    if lines and lines[-1]:
        # A torn last line: cut it, its row is written again below if the ledger has it.
        with path.open("r+b") as handle:
            handle.truncate(len(text) - len(lines[-1]))
        lines.pop()
    for line in lines:
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if (
            isinstance(entry, dict)
            and entry.get("map") == state.id
            and isinstance(entry.get("row"), int)
        ):
            present.add(entry["row"])
    keys = {row["id"]: row["key"] for row in state.spec["rows"]}
    missing = [
        out_line(state.id, row, keys.get(row, str(row)), outcome)
        for row, outcome in sorted(state.outcomes.items())
        if row not in present
    ]
    if missing:
        append_out(path, b"".join(missing))
