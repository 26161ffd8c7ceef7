"""``fleet diff``, ``fleet accept``, ``fleet revert`` and ``fleet apply``: reviewing children's
changes and landing the ones kept in a worktree.

Paths are sent as the user typed them with the current directory, so the supervisor reads them
as the user sees them.
"""

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any

from orchestrator._config import repo_root
from orchestrator._errors import UsageError
from orchestrator.cli import _render
from orchestrator.cli._common import call, out


@functools.cache
def _root() -> Path:
    return repo_root(Path.cwd())


def shown(path: str) -> str:
    """A repository path (relative or absolute) as the user types it from here."""
    return os.path.relpath(_root() / path)


def _targets(args: argparse.Namespace) -> dict[str, Any]:
    return {"targets": list(args.targets), "cwd": str(Path.cwd())}


def _diff_text(data: dict[str, Any]) -> str:
    parts = []
    for f in data["files"]:
        if f.get("held"):
            # Text before a "diff --git" line is skipped by git apply: the output stays a patch.
            parts.append(
                f"# held: {shown(f['path'])}: {f['held']} (lands only with fleet apply "
                f"{f['owner']} {shown(f['path'])})"
            )
        elif f.get("pending"):
            parts.append(f"# pending: {shown(f['path'])} (fleet apply {f['owner']} lands it)")
        parts.append(f["diff"].rstrip("\n"))
    return "\n".join(parts) or "no changes"


def cmd_diff(args: argparse.Namespace) -> int:
    data = call(args, "diff", _targets(args) | {"context": args.context})
    out(args, data, _diff_text)
    return 0


def cmd_accept(args: argparse.Namespace) -> int:
    data = call(args, "accept", _targets(args))
    out(
        args,
        data,
        lambda d: "\n".join(f"accepted {f['path']}" for f in d["files"]) or "nothing to accept",
    )
    return 0


def cmd_revert(args: argparse.Namespace) -> int:
    if not args.yes:
        if args.json or not sys.stdin.isatty():
            raise UsageError("revert rewrites your files: confirm with --yes")
        preview = call(args, "diff", _targets(args) | {"context": 3})
        paths = [f["path"] for f in preview["files"] if not f.get("pending")]
        if not paths:
            print("nothing to revert")
            return 0
        print("revert " + ", ".join(paths) + "? [y/N] ", end="", flush=True)
        if sys.stdin.readline().strip().lower() not in {"y", "yes"}:
            print("not reverted")
            return 0
    data = call(args, "revert", _targets(args))
    out(
        args,
        data,
        lambda d: (
            "\n".join(
                f"{f['status']} {f['path']}" + (f": {f['error']}" if f.get("error") else "")
                for f in d["files"]
            )
            or "nothing to revert"
        ),
    )
    return 1 if any(f["status"] == "failed" for f in data["files"]) else 0


def cmd_apply(args: argparse.Namespace) -> int:
    payload = {"agent": args.agent, "paths": list(args.paths), "cwd": str(Path.cwd())}
    data = call(args, "apply", payload)
    out(args, data, lambda d: _render.handoff_text(d["handoffs"], shown))
    failed = any(h.get("conflicts") or h.get("error") for h in data["handoffs"])
    return 1 if failed else 0
