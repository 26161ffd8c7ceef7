"""What fleet costs a parent agent on every model request: its tool schemas and instructions.

A parent's model reads fleet's tools on every request, so DESIGN.md §13 caps them: tool
schemas plus the server's instructions ≤ 1,200 tokens (characters ÷ 4), stretch ≤ 800. For
each parent this renders fleet's tools as that parent hands them to its model — Claude Code
(``mcp__fleet__*``, Anthropic ``input_schema``), Codex (Responses function tools in an
``mcp__fleet`` namespace), Gemini CLI (``functionDeclarations`` with ``parametersJsonSchema``),
opencode (OpenAI-style functions named ``fleet_*``) and Pi (the ``fleet_*`` tools its
extension registers from ``fleet tool --list``, read by loading ``pi_extension/fleet.js`` in
Node) — and counts the characters, with the instructions every parent reads (the MCP server's;
the Pi extension's hidden context). The MCP tools are the
very ``types.Tool`` objects ``fleet mcp`` lists, serialized as the SDK sends them.

The second figure of the issue, the parent model requests per delegated task (spawn → settled
report → stop), needs the real parent CLIs against a loopback model:
:func:`requests_per_delegated_task` is where that count goes (``null`` until it is measured).

``--smoke`` checks the shapes and the budget only (a test runs it). The last line printed is
one JSON object: ``{"benchmark", "budget", "stretch", "parents": {name: {"tools", "chars",
"tokens", "within_budget", "requests_per_task"}}, "ok"}``.

Usage: ``python benchmarks/parent_tools.py [--smoke]``
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp_types as types

from orchestrator.parents._tools import INSTRUCTIONS, TOOLS

BUDGET = 1200
STRETCH = 800
PI_EXTENSION = Path(__file__).resolve().parents[1] / "orchestrator/parents/pi_extension/fleet.js"
_PI_TOOLS_JS = """
const m = await import(process.argv[1]);
const tools = [];
const pi = new Proxy({}, {get: (t, k) => k === "registerTool"
  ? (d) => tools.push({name: d.name, description: d.description, parameters: d.parameters})
  : () => {}});
m.default(pi);
console.log(JSON.stringify(tools));
"""


def mcp_tools() -> list[dict[str, Any]]:
    """fleet's tools exactly as ``tools/list`` carries them."""
    listed = [
        types.Tool(name=t.name, description=t.description, input_schema=t.input_schema)
        for t in TOOLS
    ]
    return [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in listed]


def rendered(parent: str, tools: list[dict[str, Any]]) -> list[Any]:
    """*tools* as *parent* hands them to its model."""
    if parent == "claude":
        return [
            {
                "name": f"mcp__fleet__{t['name']}",
                "description": t["description"],
                "input_schema": t["inputSchema"],
            }
            for t in tools
        ]
    if parent == "codex":
        functions = [
            {
                "type": "function",
                "name": t["name"],
                "description": t["description"],
                "strict": False,
                "parameters": t["inputSchema"],
            }
            for t in tools
        ]
        return [{"type": "namespace", "name": "mcp__fleet", "tools": functions}]
    if parent == "gemini":
        return [
            {
                "functionDeclarations": [
                    {
                        "name": t["name"],
                        "description": t["description"],
                        "parametersJsonSchema": t["inputSchema"],
                    }
                    for t in tools
                ]
            }
        ]
    if parent == "opencode":
        return [
            {
                "type": "function",
                "function": {
                    "name": f"fleet_{t['name']}",
                    "description": t["description"],
                    "parameters": t["inputSchema"],
                },
            }
            for t in tools
        ]
    raise ValueError(parent)


def pi_tools() -> list[dict[str, Any]] | None:
    """The tools the Pi extension registers (``None`` without Node)."""
    node = shutil.which("node")
    if node is None:
        return None
    fleet = Path(sys.executable).with_name("fleet")  # the extension lists this fleet's tools
    done = subprocess.run(
        [node, "--input-type=module", "-e", _PI_TOOLS_JS, str(PI_EXTENSION)],
        env={**os.environ, "FLEET_BIN": str(fleet)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    tools: list[dict[str, Any]] = json.loads(done.stdout)
    return tools


def requests_per_delegated_task(parent: str) -> int | None:
    """Parent model requests for one delegated task (spawn → settled report → stop).

    Counted by driving the real *parent* CLI against a loopback model server (the e2e tests
    of the parents); ``None`` here, where no parent CLI runs.
    """
    del parent
    return None


def figure(tools: list[Any], count: int, instructions: str, parent: str) -> dict[str, Any]:
    chars = len(json.dumps(tools, separators=(",", ":"))) + len(instructions)
    tokens = round(chars / 4)
    return {
        "tools": count,
        "chars": chars,
        "tokens": tokens,
        "within_budget": tokens <= BUDGET,
        "requests_per_task": requests_per_delegated_task(parent),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="shapes and budget only")
    args = parser.parse_args()
    tools = mcp_tools()
    parents: dict[str, dict[str, Any]] = {}
    for parent in ("claude", "codex", "gemini", "opencode"):
        parents[parent] = figure(rendered(parent, tools), len(tools), INSTRUCTIONS, parent)
    pi = pi_tools()
    if pi is not None:
        parents["pi"] = figure(pi, len(pi), INSTRUCTIONS, "pi")
    width = max(len(p) for p in parents)
    if not args.smoke:
        print(f"{'parent':<{width}}  tools  chars  tokens (budget {BUDGET}, stretch {STRETCH})")
        for name, row in parents.items():
            mark = "" if row["within_budget"] else "  OVER BUDGET"
            print(
                f"{name:<{width}}  {row['tools']:>5}  {row['chars']:>5}  {row['tokens']:>6}{mark}"
            )
    mcp_ok = all(row["within_budget"] for row in parents.values())
    print(
        json.dumps(
            {
                "benchmark": "parent_tools",
                "budget": BUDGET,
                "stretch": STRETCH,
                "parents": parents,
                "ok": mcp_ok,
            }
        )
    )
    return 0 if mcp_ok else 1


if __name__ == "__main__":
    sys.exit(main())
