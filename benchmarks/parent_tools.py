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

The second figure, the parent model requests per delegated task (spawn → settled report →
stop), is counted by :func:`requests_per_delegated_task`: the real parent CLI (what ``fleet
install <parent> --project`` wrote, the commands of tests/e2e/test_real_parents.py) runs
against a loopback model (:class:`DelegateOnce`) that spawns one scripted scout, waits until
its report settled (another ``wait`` a result that has not settled yet), stops it and
answers; the figure is the model requests that offered fleet's tools, the answer's included
(four at best: spawn, wait, stop, answer). A parent CLI's side requests that offer no fleet
tool (titles, Claude Code's wait for its MCP servers) are not counted. A parent whose CLI is
not installed, or whose run failed, has ``null`` and ``requests_note`` says why.

``--smoke`` checks the shapes and the budget, and counts the requests of one parent only (Pi,
the cheapest to start; a test runs it); ``--parents`` names the parents to count. The last
line printed is one JSON object: ``{"benchmark", "budget", "stretch", "parents": {name:
{"tools", "chars", "tokens", "within_budget", "requests_per_task"[, "requests_note"]}},
"ok"}``.

Usage: ``python benchmarks/parent_tools.py [--smoke] [--parents claude,pi]``
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import attrs
import mcp_types as types
import trio

from orchestrator.parents._tools import INSTRUCTIONS, TOOLS

# The real parents are started as the e2e tests start them: their helpers live under tests/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests._needs import missing
from tests.e2e.conftest import Fleet, running_fleet
from tests.e2e.test_real_parents import PARENTS, fleet_env, pi_parent
from tests.fakes._agent_clis import open_cli
from tests.fakes.model_server import ModelServer, Request
from tests.fakes.parent_model import WAIT_FOR_SERVERS, fleet_tool, payload

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


#: The parents whose requests are counted, and the one a ``--smoke`` run counts.
COUNTED = ("claude", "codex", "gemini", "opencode", "pi")
SMOKE_COUNTED = ("pi",)
#: One delegated task's ceiling (a loaded box starts a parent CLI slowly).
TASK_CEILING_S = 240
SCOUT = """
turns:
  - steps:
      - tool: read
        args: {path: src/app.py}
      - reply: "## Summary\\nmain() returns 42"
"""
PROMPT = "delegate: have one scout tell what src/app.py's main() returns"


@attrs.define(eq=False)
class DelegateOnce:
    """A parent model that delegates one task: spawn a scout, wait for its report, stop it."""

    scout: str  # the scout's scripted model
    requests: int = 0  # the requests that offered fleet's tools
    answered: bool = False
    trail: list[str] = attrs.field(factory=list)  # the verbs called, in order
    _key: str = ""
    _settled: bool = False
    _pending: str = ""
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def __call__(self, request: Request) -> dict[str, Any]:
        with self._lock:  # a CLI's side requests may run beside its main one
            return self._answer(request)

    def _answer(self, request: Request) -> dict[str, Any]:
        names = request.tool_names()
        if fleet_tool(names, "spawn") is None:  # a side request, or the servers still start
            if WAIT_FOR_SERVERS in names and not self.requests:
                return {"tool_calls": [{"name": WAIT_FOR_SERVERS, "arguments": {}}]}
            return {"text": "fleet parent"}
        if self.answered:  # a late turn (a note after the answer) is not part of the task
            return {"text": "done"}
        self.requests += 1
        results = request.tool_results()
        data = payload(results[-1]) if results and self._pending else None
        if isinstance(data, dict) and self._pending == "spawn":
            self._key = next((a["key"] for a in data.get("agents", [])), "")
        if isinstance(data, dict) and self._pending == "wait":
            self._settled = any(s.get("key") == self._key for s in data.get("settled", []))
        if not self._pending:
            return self._call(names, "spawn", {"task": PROMPT, "model": self.scout})
        if not self._key:
            raise RuntimeError(f"the spawn failed: {results[-1:]}")
        if self._pending in ("spawn", "wait") and not self._settled:
            return self._call(names, "wait", {"agents": [self._key]})
        if self._pending == "wait":
            return self._call(names, "stop", {"agents": [self._key]})
        self.answered = True
        return {"text": "done: main() returns 42"}

    def _call(self, names: list[str], verb: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self._pending = verb
        self.trail.append(verb)
        return {"tool_calls": [{"name": fleet_tool(names, verb), "arguments": arguments}]}


def _run_parent(
    parent: str, fleet: Fleet, srv: ModelServer, model: DelegateOnce, state: Path
) -> None:
    """Run the real *parent* CLI on one prompt to its end."""
    if parent == "pi":
        trio.run(_run_pi, fleet, srv, model, state)
        return
    command = PARENTS[parent](fleet, srv, state)
    result = subprocess.run(
        list(command.argv),
        cwd=command.cwd,
        env={**command.env, **fleet_env(fleet)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=TASK_CEILING_S,
        check=False,
    )
    if result.returncode != 0:
        tail = result.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise RuntimeError(f"{parent} exited {result.returncode}: {' '.join(tail)}")


async def _run_pi(fleet: Fleet, srv: ModelServer, model: DelegateOnce, state: Path) -> None:
    command = pi_parent(fleet, srv, state, "read,fleet_spawn,fleet_wait,fleet_stop")
    with trio.fail_after(TASK_CEILING_S):
        async with open_cli(command, state / "pi.stderr") as pi:
            await pi.send({"type": "prompt", "id": "p1", "message": PROMPT})
            while not model.answered:
                await pi.until(lambda e: e.get("type") == "agent_end")
            code = await pi.finish()
    if code != 0:
        raise RuntimeError(f"pi exited {code}")


def requests_per_delegated_task(parent: str) -> tuple[int | None, str]:
    """Parent model requests for one delegated task (spawn → settled report → stop), and
    why the count is absent when it is.

    The real *parent* CLI against the loopback :class:`DelegateOnce` on a private fleet.
    """
    absent = missing(parent)
    if absent:
        return None, absent
    with tempfile.TemporaryDirectory(prefix="fleet-bpt-") as tmp:
        root = Path(tmp)
        try:
            with running_fleet(root, prefix=f"bpt{parent[:2]}-") as fleet, ModelServer() as srv:
                model = DelegateOnce(scout=fleet.script("scout", SCOUT))
                srv.play("parent", model)
                _run_parent(parent, fleet, srv, model, root / parent)
        except Exception as error:  # one parent's failure is its figure's note, not the run's
            return None, f"failed: {type(error).__name__}: {error}"[:300]
    if not model.answered:
        return None, f"the parent ended before the task did: {model.trail}"
    return model.requests, " ".join(model.trail)


def figure(
    tools: list[Any], count: int, instructions: str, requests: tuple[int | None, str] | None
) -> dict[str, Any]:
    chars = len(json.dumps(tools, separators=(",", ":"))) + len(instructions)
    tokens = round(chars / 4)
    row: dict[str, Any] = {
        "tools": count,
        "chars": chars,
        "tokens": tokens,
        "within_budget": tokens <= BUDGET,
    }
    counted, note = requests if requests is not None else (None, "not counted in this run")
    row["requests_per_task"] = counted
    row["requests_note"] = note
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="shapes, budget, Pi's requests")
    parser.add_argument(
        "--parents", help=f"the parents whose requests to count (default: {','.join(COUNTED)})"
    )
    args = parser.parse_args()
    counted = SMOKE_COUNTED if args.smoke else COUNTED
    if args.parents:
        counted = tuple(p for p in args.parents.split(",") if p)
        unknown = sorted(set(counted) - set(COUNTED))
        if unknown:
            parser.error(f"unknown parents {unknown}; known: {', '.join(COUNTED)}")

    def requests(parent: str) -> tuple[int | None, str] | None:
        return requests_per_delegated_task(parent) if parent in counted else None

    tools = mcp_tools()
    parents: dict[str, dict[str, Any]] = {}
    for parent in ("claude", "codex", "gemini", "opencode"):
        rows = rendered(parent, tools)
        parents[parent] = figure(rows, len(tools), INSTRUCTIONS, requests(parent))
    pi = pi_tools()
    if pi is not None:
        parents["pi"] = figure(pi, len(pi), INSTRUCTIONS, requests("pi"))
    width = max(len(p) for p in parents)
    if not args.smoke:
        print(
            f"{'parent':<{width}}  tools  chars  tokens  requests/task"
            f"  (budget {BUDGET} tokens, stretch {STRETCH})"
        )
        for name, row in parents.items():
            mark = "" if row["within_budget"] else "  OVER BUDGET"
            count = row["requests_per_task"]
            shown = f"{count:>13}" if count is not None else f"{'-':>13}"
            print(
                f"{name:<{width}}  {row['tools']:>5}  {row['chars']:>5}  {row['tokens']:>6}"
                f"  {shown}  {row['requests_note']}{mark}"
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
