"""``fleet map``: a task template over a work list, one child per row (docs/map.md).

The rows are read here (a file, or ``-`` for stdin; the supervisor may not see the file), sent
with the spec, and the supervisor runs the map; this verb waits for it, drawing a progress line
with ``rich.progress`` when stderr is a terminal. Interrupting it cancels the map, which stays
resumable (``fleet map --resume ID``).
"""

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestrator._errors import UsageError
from orchestrator._schemafile import read_schema_file
from orchestrator.cli._common import call, out
from orchestrator.control._client import WAIT_SLICE

#: How often the progress line is refreshed from the supervisor (seconds).
PROGRESS_SLICE = 1.0


def _read_list(source: str, fmt: str | None) -> list[dict[str, Any]]:
    # Here, not at the top: the batch package brings trio, which a warm verb never loads.
    from orchestrator.batch import parse_rows  # noqa: PLC0415

    if source == "-":
        text = sys.stdin.read()
        where = "stdin"
    else:
        try:
            text = Path(source).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"map: work list {source}: {exc}") from None
        where = source
        if fmt is None and source.endswith((".jsonl", ".ndjson")):
            fmt = "jsonl"
        elif fmt is None and source.endswith(".csv"):
            fmt = "csv"
    return parse_rows(text, fmt=fmt, source=where)


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    template = " ".join(args.task).strip()
    if not template:
        raise UsageError("map: give the task template (words with {column} placeholders)")
    return {
        "template": template,
        "agent": args.agent,
        "model": args.model,
        "role": args.role,
        "schema": read_schema_file(Path(args.schema)) if args.schema else None,
        "dedupe_key": args.dedupe_key,
        "max_items": args.max_items,
        "max_runtime": args.max_runtime,
        "retries": args.retries,
        "out": str(Path(args.out).resolve()) if args.out else None,
    }


def _summary(data: dict[str, Any]) -> str:
    line = (
        f"map {data['map']} {data['state']}: {data['done']}/{data['total']} done, "
        f"{data['failed']} failed"
    )
    if data.get("dropped"):
        line += f", {data['dropped']} repeat(s) dropped"
    if data.get("resumed"):
        line += f", {data['resumed']} done before the resume"
    if data.get("out"):
        line += f" (results in {data['out']})"
    if data["state"] != "done":
        line += f"; fleet map --resume {data['map']} runs the rest"
    return line


def _follow(args: argparse.Namespace, started: dict[str, Any]) -> dict[str, Any]:
    map_id = started["map"]
    if args.json or not sys.stderr.isatty():
        data = started
        while data["state"] == "running":
            data = call(args, "map", {"action": "wait", "map": map_id, "timeout": WAIT_SLICE})
        return data
    from rich.console import Console  # noqa: PLC0415 - only a terminal draws progress
    from rich.progress import (  # noqa: PLC0415
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn(f"map {map_id}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    data = started
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task("map", total=data["total"], counts="")
        while True:
            counts = (
                f"{data['failed']} failed · {data['running']} running · {data['queued']} queued"
                f" · {data['rate']:.2f}/s"
            )
            progress.update(task, completed=data["done"] + data["failed"], counts=counts)
            if data["state"] != "running":
                return data
            data = call(args, "map", {"action": "wait", "map": map_id, "timeout": PROGRESS_SLICE})


def cmd_map(args: argparse.Namespace) -> int:
    if args.resume:
        if args.task or args.rows:
            raise UsageError("map: --resume ID takes no work list or task template")
        started = call(args, "map", {"action": "resume", "map": args.resume})
    else:
        if not args.rows:
            raise UsageError("map: name the work list (a .jsonl or .csv file, or - for stdin)")
        rows = _read_list(args.rows, args.format)
        started = call(args, "map", {"action": "start", "spec": _spec(args), "rows": rows})
    try:
        data = _follow(args, started)
    except KeyboardInterrupt:
        call(args, "map", {"action": "cancel", "map": started["map"]})
        print(
            f"fleet map: cancelled; fleet map --resume {started['map']} runs the rest",
            file=sys.stderr,
        )
        raise
    out(args, data, _summary)
    return 0 if data["state"] == "done" and not data["failed"] else 1


def add_verb(verb: Any) -> None:
    """Register ``fleet map`` with the parser's ``verb`` helper."""
    p = verb("map", cmd_map, "run a task template over a work list: one child per row")
    p.add_argument("rows", nargs="?", help="the work list: a .jsonl or .csv file, or - for stdin")
    p.add_argument("task", nargs="*", help="the task template, with {column} placeholders")
    p.add_argument("--format", choices=["jsonl", "csv"], help="the work list's format")
    p.add_argument("--agent", default="scout", help="the agent each row runs as (default scout)")
    p.add_argument("--model", help="the model of each row's child (as fleet spawn --model)")
    p.add_argument("--role", help="a model role for each row's child")
    p.add_argument("--schema", metavar="FILE", help="a JSON Schema each row's result must satisfy")
    p.add_argument("--dedupe-key", metavar="COLUMN", help="run only the first row of each value")
    p.add_argument("--max-items", type=int, metavar="N", help="run at most N rows (after dedupe)")
    p.add_argument("--max-runtime", type=float, metavar="S", help="stop a row's child after S s")
    p.add_argument("--retries", type=int, default=0, metavar="N", help="retry a failed row N times")
    p.add_argument("--out", metavar="FILE", help="append results and failures here as JSONL")
    p.add_argument("--resume", metavar="ID", help="run the rows of map ID that have no outcome")
