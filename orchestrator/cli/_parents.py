"""``fleet mcp``, ``fleet install`` and ``fleet uninstall``: fleet inside a parent agent.

The MCP server and the installers live in :mod:`orchestrator.parents`, imported on use: the
MCP SDK is heavy and every other verb starts without it.
"""

import argparse
import os
from pathlib import Path
from typing import Literal

from orchestrator._errors import UsageError
from orchestrator.cli._common import call, config_of, out


def cmd_mcp(args: argparse.Namespace) -> int:
    from orchestrator.control._daemon_client import (  # noqa: PLC0415
        PARENT_EXIT_S,
        PARENT_EXIT_VARIABLE,
    )
    from orchestrator.parents._mcp import run  # noqa: PLC0415

    # The supervisor this server starts on demand (it inherits our environment) ends a short
    # grace after the parent went away, once it holds no child.
    os.environ.setdefault(PARENT_EXIT_VARIABLE, str(PARENT_EXIT_S))
    settings = {"max_subagents": args.max_subagents, "lane": args.lane}
    run(config_of(args), settings=settings)
    return 0


def cmd_tool(args: argparse.Namespace) -> int:
    """One parent tool call (the Pi extension's): its JSON result on stdout, or the error as
    ``{"error": {"kind", "message"}}`` with the error's exit code; ``--list`` lists the tools."""
    import json  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from orchestrator._errors import FleetError  # noqa: PLC0415
    from orchestrator.control._daemon_client import (  # noqa: PLC0415
        PARENT_EXIT_S,
        PARENT_EXIT_VARIABLE,
    )
    from orchestrator.parents._oneshot import arguments_of, run_tool  # noqa: PLC0415
    from orchestrator.parents._tools import listing  # noqa: PLC0415

    if args.list:
        print(json.dumps(listing(), ensure_ascii=False))
        return 0
    if not args.name:
        raise UsageError("tool: name a tool, or --list")
    os.environ.setdefault(PARENT_EXIT_VARIABLE, str(PARENT_EXIT_S))
    text = sys.stdin.read() if args.arguments == "-" else args.arguments
    try:
        result = run_tool(
            lambda op, payload: call(args, op, payload), args.name, arguments_of(text)
        )
    except FleetError as exc:
        message = " ".join(str(exc).split())
        print(json.dumps({"error": {"kind": exc.kind, "message": message}}, ensure_ascii=False))
        print(f"fleet tool: {message}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(result, ensure_ascii=False))
    return 0


def _changed(lines: list[str]) -> list[dict[str, str]]:
    rows = []
    for line in lines:
        if line.startswith("note: "):
            continue
        if line.endswith(" already up to date"):
            rows.append({"path": line.removesuffix(" already up to date"), "action": "unchanged"})
        elif line.endswith(" not installed"):
            rows.append({"path": line.removesuffix(" not installed"), "action": "unchanged"})
        else:
            action, _, path = line.partition(" ")
            rows.append({"path": path, "action": action})
    return rows


def _installer_run(args: argparse.Namespace, *, remove: bool) -> int:
    from orchestrator.parents._install import INSTALLERS, trust_note  # noqa: PLC0415

    installer = INSTALLERS.get(args.parent)
    if installer is None:
        raise UsageError(f"{args.parent}: no such parent (one of {', '.join(INSTALLERS)})")
    scope: Literal["project", "user"] = "user" if args.user else "project"
    home, project = Path.home(), Path.cwd()
    action = installer.uninstall if remove else installer.install
    lines = action(scope, home=home, project=project)
    note = None if remove else trust_note(args.parent, scope, project)
    if note:
        lines.append(note)
    data = {"parent": args.parent, "changed": _changed(lines), "notes": [note] if note else []}
    out(args, data, lambda _: "\n".join(lines))
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    return _installer_run(args, remove=False)


def cmd_uninstall(args: argparse.Namespace) -> int:
    return _installer_run(args, remove=True)


def add_verbs(verb: "VerbFactory") -> None:
    verb("mcp", cmd_mcp, "an MCP server on stdio for a parent agent (the verbs as tools)")
    p = verb("tool", cmd_tool, "one call of a parent tool (fleet mcp's), for a parent extension")
    p.add_argument("name", nargs="?", help="the tool (fleet tool --list shows them)")
    p.add_argument("arguments", nargs="?", default="", help="a JSON object, or - for stdin")
    p.add_argument("--list", action="store_true", help="the tools and instructions, as JSON")
    for name, func, help_text in (
        ("install", cmd_install, "register fleet in a parent agent's configuration"),
        ("uninstall", cmd_uninstall, "remove what fleet install added"),
    ):
        p = verb(name, func, help_text)
        p.add_argument("parent", choices=["claude", "codex", "gemini", "opencode", "pi"])
        where = p.add_mutually_exclusive_group()
        where.add_argument("--project", action="store_true", help="this project (default)")
        where.add_argument("--user", action="store_true", help="your user configuration")


TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    VerbFactory = Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser]
