"""``fleet events`` (the session journal, streamed) and ``fleet revive`` (lost children back)."""

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any, Final

from orchestrator._errors import UsageError
from orchestrator.cli._common import call, out

__all__ = ["cmd_events", "cmd_revive", "event_line"]

#: How long one ``events`` request of ``--follow`` waits for a new record (seconds).
FOLLOW_WAIT: Final = 30.0
_SUMMARY: Final = 100


def _summary(event: Mapping[str, Any]) -> str:
    kind = event["kind"]
    if kind == "spawn":
        text = f"{event.get('agent')} ({event.get('backend')}, {event.get('mode')})"
    elif kind in {"state", "lost", "revived"}:
        text = str(event.get("state", ""))
    elif kind == "settled":
        lines = str(event.get("report") or event.get("error") or "").strip().splitlines()
        text = f"{event.get('state')}: {lines[0] if lines else ''}"
    elif kind in {"question", "answer"}:
        text = f"{event.get('id')}: {event.get('text')}"
    elif kind == "handoff":
        text = str(event.get("state", ""))
    elif kind == "resume":
        text = str(event.get("id", ""))
    elif kind == "locks":
        text = ", ".join(event.get("paths") or []) or "(none)"
    elif kind == "worktree":
        text = str(event.get("path", ""))
    else:
        text = ""
    return text if len(text) <= _SUMMARY else text[: _SUMMARY - 1] + "…"


def event_line(event: Mapping[str, Any]) -> str:
    """One human line: ``12 08:01:02 a1 settled idle: ## Summary``."""
    at = time.strftime("%H:%M:%S", time.localtime(float(event["at"])))
    line = f"{event['seq']} {at} {event['key'] or '-'} {event['kind']}"
    summary = _summary(event)
    return f"{line} {summary}" if summary else line


def _print(args: argparse.Namespace, events: list[dict[str, Any]]) -> None:
    for event in events:
        print(json.dumps(event) if args.json else event_line(event))
    sys.stdout.flush()


def cmd_events(args: argparse.Namespace) -> int:
    if args.since < 0:
        raise UsageError("--since must be a record number >= 0")
    since = args.since
    while True:  # a reply carries at most a few thousand records: ask on from the last one
        data = call(args, "events", {"since": since})
        _print(args, data["events"])
        since = data["events"][-1]["seq"] if data["events"] else since
        if not data["events"] or since >= data["seq"]:
            break
    while args.follow:
        data = call(args, "events", {"since": since, "wait": FOLLOW_WAIT})
        _print(args, data["events"])
        since = data["events"][-1]["seq"] if data["events"] else since
    return 0


def cmd_revive(args: argparse.Namespace) -> int:
    data = call(args, "revive", {"agents": list(args.agents)})
    out(
        args,
        data,
        lambda d: "\n".join(f"{r['key']} {r['name']} revived ({r['state']})" for r in d["revived"]),
    )
    return 0
