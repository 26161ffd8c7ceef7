"""``fleet discuss``, ``fleet vote`` and ``fleet brief``: coordinating without flooding context."""

import argparse
import json
from pathlib import Path

from orchestrator._errors import UsageError
from orchestrator.cli import _render
from orchestrator.cli._common import call, joined, out
from orchestrator.control._client import WAIT_SLICE


def cmd_discuss(args: argparse.Namespace) -> int:
    if args.action == "ask":
        payload = {"action": "ask", "text": joined(args.text, "the question"), "to": args.to}
    elif args.action == "answer":
        text = joined(args.text, "the answer")
        payload = {"action": "answer", "question": args.question, "text": text}
    else:
        payload = {"action": "list", "since": args.since, "question": args.question}
    data = call(args, "discuss", payload)
    out(args, data, lambda d: d["text"])
    return 0


def cmd_vote(args: argparse.Namespace) -> int:
    if args.abort:
        data = call(args, "vote", {"action": "abort"})
        out(args, data, _render.render_outcome)
        return 0
    if not args.options:
        raise UsageError("pass --options FILE with the round request (or --abort)")
    try:
        request = json.loads(Path(args.options).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"options file {args.options}: {exc}") from None
    agents = [a.strip() for a in args.agents.split(",") if a.strip()] if args.agents else []
    started = call(
        args,
        "vote",
        {
            "action": "start",
            "request": request,
            "agents": agents,
            "voters": args.voters,
            "deadline": args.deadline,
            "model": args.model,
        },
    )
    wait = {"action": "wait", "round": started["round"], "timeout": WAIT_SLICE}
    try:
        data = call(args, "vote", wait)
        while data["status"] == "running":
            data = call(args, "vote", wait)
    except KeyboardInterrupt:
        # Interrupting fleet vote invalidates its round: a partial tally is never shown.
        call(args, "vote", {"action": "abort", "round": started["round"]})
        raise
    out(args, data, _render.render_outcome)
    return 1 if data["status"] == "failed" else 0


def cmd_brief(args: argparse.Namespace) -> int:
    data = call(args, "brief", {})
    out(args, data, lambda d: d["text"])
    return 0
