"""A map's work list: rows read from JSONL or CSV, deduplicated, capped, and a task template
filled from each row's columns.

Pure and synchronous. Every row is checked before anything runs: a template placeholder a row
lacks is one :class:`UsageError` naming the column and the row, so a map never launches half a
batch and then stops on row 137.
"""

import csv
import io
import json
import string
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from orchestrator._errors import UsageError

__all__ = ["MAX_ROWS", "Row", "fill", "parse_rows", "placeholders", "select_rows"]

#: The most rows one map takes (Claude Code's workflows stop at 4,096 items too).
MAX_ROWS: Final = 4096
#: The longest filled task, in characters (a row must not smuggle a novel into a prompt).
MAX_TASK: Final = 32_000


@attrs.frozen(kw_only=True)
class Row:
    """One row to run: its position in the work list (1-based), its key, its filled task."""

    id: int
    key: str
    task: str


def parse_rows(
    text: str, *, fmt: str | None = None, source: str = "work list"
) -> list[dict[str, Any]]:
    """The rows of *text*: JSONL (one JSON object a line) or CSV with a header row.

    *fmt* is ``"jsonl"`` or ``"csv"``; ``None`` guesses from the first non-blank character
    (``{`` is JSONL). Blank lines are skipped; anything else that is not a row is an error
    naming its line.
    """
    stripped = text.lstrip()
    kind = fmt or ("jsonl" if stripped.startswith("{") else "csv")
    if kind == "jsonl":
        rows: list[dict[str, Any]] = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"map: {source} line {number} is not JSON ({exc.msg})") from None
            if not isinstance(value, dict):
                raise UsageError(f"map: {source} line {number} is not a JSON object")
            rows.append(value)
        return rows
    if kind != "csv":
        raise UsageError(f"map: work-list format {kind!r} is not jsonl or csv")
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise UsageError(f"map: {source} is empty (a CSV needs a header row)")
    rows = []
    for record in reader:
        if None in record:
            raise UsageError(
                f"map: {source} line {reader.line_num} has more fields than the header"
            )
        rows.append(dict(record))
    return rows


def placeholders(template: str) -> list[str]:
    """The ``{column}`` names *template* uses, in order; ``{{`` and ``}}`` are literal braces."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise UsageError(
            f"map: task template: {exc} (write {{{{ and }}}} for literal braces)"
        ) from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name or spec or conversion or not name.replace("_", "a").replace("-", "a").isalnum():
            raise UsageError(
                f"map: task template placeholder {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} is not a plain {{column}} "
                "(write {{ and }} for literal braces)"
            )
        names.append(name)
    return names


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def fill(template: str, row: Mapping[str, Any], number: int) -> str:
    """*template* with each ``{column}`` replaced by *row*'s value (non-strings as JSON)."""
    out = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        if name not in row:
            raise UsageError(
                f"map: row {number} has no column {name!r} (the task template uses {{{name}}}; "
                f"the row has {', '.join(map(repr, row)) or 'no columns'})"
            )
        out.append(_text(row[name]))
    task = "".join(out)
    if not task.strip():
        raise UsageError(f"map: row {number} fills the task template with nothing")
    if len(task) > MAX_TASK:
        raise UsageError(f"map: row {number}'s task is {len(task)} characters (at most {MAX_TASK})")
    return task


def select_rows(
    rows: Sequence[Mapping[str, Any]],
    template: str,
    *,
    dedupe_key: str | None = None,
    max_items: int | None = None,
) -> tuple[list[Row], int]:
    """The rows to run and how many repeats were dropped.

    A row's key is its *dedupe_key* column (a row without it is an error), else its position.
    Only the first row of each key runs; *max_items* counts the rows kept, after dedupe.
    """
    if max_items is not None and max_items < 1:
        raise UsageError(f"map: --max-items {max_items} must be at least 1")
    placeholders(template)
    if not template.strip():
        raise UsageError("map: the task template is empty")
    seen: set[str] = set()
    kept: list[Row] = []
    dropped = 0
    for number, row in enumerate(rows, 1):
        if dedupe_key is None:
            key = str(number)
        elif dedupe_key in row:
            key = _text(row[dedupe_key])
        else:
            raise UsageError(f"map: row {number} has no column {dedupe_key!r} (--dedupe-key)")
        if key in seen:
            dropped += 1
            continue
        seen.add(key)
        kept.append(Row(id=number, key=key, task=fill(template, row, number)))
        if max_items is not None and len(kept) >= max_items:
            break
    if len(kept) > MAX_ROWS:
        raise UsageError(f"map: {len(kept)} rows is more than {MAX_ROWS} (use --max-items)")
    return kept, dropped
