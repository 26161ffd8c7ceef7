"""The verbs that drive children: spawn, wait, steer, pause, resume, ask, answer, stop,
discard, logs. Each is one control request (``wait`` a loop of bounded slices); exit codes as
``docs/cli.md`` says — a failed turn or a failed copy-back is never 0.
"""

import argparse
import json
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator._errors import TimedOut, UsageError
from orchestrator._schemafile import read_schema_file
from orchestrator.cli import _render
from orchestrator.cli._common import call, joined, out
from orchestrator.cli._outcome import WaitTimedOut, note_failed
from orchestrator.cli._review import shown
from orchestrator.control._client import WAIT_SLICE


def cmd_spawn(args: argparse.Namespace) -> int:
    if args.batch:
        try:
            requests = json.loads(Path(args.batch).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"batch file {args.batch}: {exc}") from None
        if not isinstance(requests, list):
            raise UsageError(f"batch file {args.batch}: must hold a JSON list of tasks")
    else:
        request: dict[str, Any] = {"task": joined(args.task, "the task"), "agent": args.agent}
        for key in ("mode", "name", "backend", "model", "surface", "role"):
            if getattr(args, key):
                request[key] = getattr(args, key)
        if args.budget:
            from orchestrator._records import budget_from_text  # noqa: PLC0415 - warm verbs

            request["budget"] = budget_from_text(args.budget)
        if args.command:
            try:
                request["command"] = shlex.split(args.command)
            except ValueError as exc:
                raise UsageError(f"--command {args.command!r}: {exc}") from None
        requests = [request]
    if args.schema:
        # Read here (the supervisor may not see the file), checked as a schema at spawn; a
        # batch entry's own schema wins.
        schema = read_schema_file(Path(args.schema))
        requests = [{"schema": schema, **r} if isinstance(r, dict) else r for r in requests]
    data = call(args, "spawn", {"requests": requests})
    failed = [a for a in data["agents"] if a.get("state") == "failed"]
    if failed:  # failed at launch (a worker outside a git repository, ...): exit 1, say why
        message = "; ".join(f"{a['key']} failed at launch: {a.get('error', '')}" for a in failed)
        if args.json:
            print(json.dumps(data | {"error": {"kind": "failed", "message": message}}))
        else:
            print("\n".join(_render.spawned_line(a) for a in data["agents"]))
        print(f"fleet spawn: {message}", file=sys.stderr)
        return 1
    if args.wait:
        keys = [a["key"] for a in data["agents"]]
        return _wait(args, keys, every=True, timeout=None)
    out(args, data, lambda d: "\n".join(_render.spawned_line(a) for a in d["agents"]))
    return 0


def _wait(args: argparse.Namespace, keys: list[str], *, every: bool, timeout: float | None) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        remaining = WAIT_SLICE if deadline is None else max(0.0, deadline - time.monotonic())
        slice_ = min(WAIT_SLICE, remaining)
        payload = {"agents": keys, "all": every, "timeout": slice_, "progress": True}
        try:
            data = call(args, "wait", payload)
        except TimedOut:  # a supervisor from before progress rows
            data = {"timed_out": True}
        if not data.get("timed_out"):
            break
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimedOut(
                f"nothing settled within {timeout:g} s (try again, or fleet peek)", data
            )
    out(args, data, lambda d: _render.settled_text(d["settled"]))
    return 1 if any(note_failed(n) for n in data["settled"]) else 0


def cmd_wait(args: argparse.Namespace) -> int:
    return _wait(args, list(args.agents), every=args.all, timeout=args.timeout)


def cmd_steer(args: argparse.Namespace) -> int:
    data = call(args, "steer", {"agent": args.agent, "text": joined(args.text, "the steer")})
    out(args, data, lambda d: f"{d['key']} {d['state']}: steered")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    data = call(args, "pause", {"agent": args.agent})
    out(
        args,
        data,
        lambda d: f"{d['key']} {d['state']}" + ("" if d["settled"] else " (not settled yet)"),
    )
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    data = call(args, "resume", {"agent": args.agent, "text": joined(args.text, "the prompt")})
    out(args, data, lambda d: f"{d['key']} {d['state']}")
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
    data = call(args, "ask", {"agent": args.agent, "text": joined(args.text, "the question")})
    out(args, data, lambda d: d["answer"])
    return 0


def cmd_answer(args: argparse.Namespace) -> int:
    data = call(
        args, "answer", {"question": args.question, "text": joined(args.text, "the answer")}
    )
    out(args, data, lambda d: f"answered {d['question']} ({d['key']})")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    if not args.agents and not args.all:
        raise UsageError("name at least one agent, or pass --all")
    payload = {"agents": list(args.agents), "all": args.all}
    if args.hold:
        payload["hold"] = True
    data = call(args, "stop", payload)
    out(args, data, lambda d: _render.handoff_text(d["handoffs"], shown) or "no live children")
    return 1 if any(stop_failed(h) for h in data["handoffs"]) else 0


def stop_failed(handoff: Mapping[str, Any]) -> bool:
    """Whether a stop's handoff is a failure: the child failed, or its worktree was not
    resolved (conflicts, or a copy-back that failed and applied nothing)."""
    return bool(
        handoff["state"] == "failed"
        or handoff.get("conflicts")
        or (handoff.get("error") and handoff.get("remaining"))
    )


def cmd_discard(args: argparse.Namespace) -> int:
    data = call(args, "discard", {"agent": args.agent})
    out(args, data, lambda d: f"{d['key']} discarded")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    data = call(args, "logs", {"agent": args.agent, "tail": args.tail})
    out(args, data, lambda d: f"{d['path']}\n{d['tail']}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    part = "transcript" if args.transcript else "report"
    data = call(args, "report", {"agent": args.agent, "part": part, "offset": args.offset})
    out(args, data, _report_text)
    return 0


def _report_text(data: Mapping[str, Any]) -> str:
    more, flag = data["next_offset"], " --transcript" if data["part"] == "transcript" else ""
    tail = f"\n(more: fleet report {data['key']}{flag} --offset {more})" if more is not None else ""
    return str(data["text"]).rstrip("\n") + tail
