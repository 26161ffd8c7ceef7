"""``fleet diff``, ``fleet accept`` and ``fleet revert``: reviewing what children copied back."""

import argparse
import sys

from orchestrator._errors import UsageError
from orchestrator.cli._common import call, out


def cmd_diff(args: argparse.Namespace) -> int:
    data = call(args, "diff", {"targets": list(args.targets), "context": args.context})
    out(
        args,
        data,
        lambda d: "\n".join(f["diff"].rstrip("\n") for f in d["files"]) or "no applied changes",
    )
    return 0


def cmd_accept(args: argparse.Namespace) -> int:
    data = call(args, "accept", {"targets": list(args.targets)})
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
        preview = call(args, "diff", {"targets": list(args.targets), "context": 3})
        paths = [f["path"] for f in preview["files"]]
        if not paths:
            print("nothing to revert")
            return 0
        print("revert " + ", ".join(paths) + "? [y/N] ", end="", flush=True)
        if sys.stdin.readline().strip().lower() not in {"y", "yes"}:
            print("not reverted")
            return 0
    data = call(args, "revert", {"targets": list(args.targets)})
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
