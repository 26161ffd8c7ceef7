"""``fleet land`` and ``fleet queue``: the integration queue (docs/worktrees.md)."""

import argparse
from typing import Any

from orchestrator.cli._common import call, out


def _entry_line(entry: dict[str, Any]) -> str:
    line = f"{entry['key']} {entry['status']}"
    if entry["reason"]:
        line += f": {entry['reason']}"
    if entry["landed"]:
        line += f" ({len(entry['landed'])} file(s))"
    if entry["held_files"]:
        names = ", ".join(h["path"] for h in entry["held_files"])
        line += f"; held, land only by name (fleet apply {entry['key']} PATH): {names}"
    return line


def _queue_text(queue: list[dict[str, Any]]) -> str:
    return "\n".join(_entry_line(e) for e in queue) if queue else "the queue is empty"


def _land_text(data: dict[str, Any]) -> str:
    entry = data["entry"]
    if entry is None:
        return "nothing queued (fleet stop AGENT --hold queues a worker's change)"
    lines = [_entry_line(entry)]
    if entry["gate"]:
        lines.append("gate output (tail):")
        lines.append(entry["gate"].rstrip())
    if data.get("resolver"):
        lines.append(f"handed to {data['resolver']} to resolve")
    return "\n".join(lines)


def cmd_land(args: argparse.Namespace) -> int:
    data = call(args, "land", {"agent": args.agent, "resolve": args.resolve})
    out(args, data, _land_text)
    entry = data["entry"]
    return 1 if entry is not None and entry["status"] != "landed" else 0


def cmd_queue(args: argparse.Namespace) -> int:
    data = call(args, "queue", {})
    out(args, data, lambda d: _queue_text(d["queue"]))
    return 0


def add_verbs(verb: Any) -> None:
    p = verb("land", cmd_land, "land the next held change behind the conflict check and gate")
    p.add_argument("agent", nargs="?", help="this change (default: the first queued)")
    p.add_argument(
        "--resolve", action="store_true", help="hand a change left held to a resolver worker"
    )
    verb("queue", cmd_queue, "the integration queue: held changes and why")
