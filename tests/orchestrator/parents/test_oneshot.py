"""``fleet tool``: one parent tool call as a command, the Pi extension's way in.

The extension registers exactly the tools ``fleet mcp`` lists (one source), and every call is
checked against the tool's schema before anything runs, with the MCP server's error shapes.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.parents._tools import INSTRUCTIONS, TOOLS, listing

EXTENSION = Path(__file__).parents[3] / "orchestrator/parents/pi_extension/fleet.js"
FLEET = Path(sys.executable).with_name("fleet")
_REGISTERED = """
const m = await import(process.argv[1]);
const tools = [];
const pi = new Proxy({}, {get: (t, k) => k === "registerTool" ? (d) => tools.push(d) : () => {}});
m.default(pi);
console.log(JSON.stringify(tools.map(({name, description, parameters}) =>
  ({name, description, parameters}))));
"""


def fleet_tool(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEET_HOME": str(tmp_path / "home"), "FLEET_SESSION": "t"}
    return subprocess.run(
        [str(FLEET), "tool", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )


def test_the_list_is_the_mcp_servers_tools_and_instructions(tmp_path: Path) -> None:
    done = fleet_tool(tmp_path, "--list")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert listed == json.loads(json.dumps(listing()))
    assert listed["instructions"] == INSTRUCTIONS
    assert [t["name"] for t in listed["tools"]] == [t.name for t in TOOLS]


@pytest.mark.needs("node")
def test_the_pi_extension_registers_exactly_the_mcp_tools(tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node is not None
    done = subprocess.run(
        [node, "--input-type=module", "-e", _REGISTERED, str(EXTENSION)],
        env={**os.environ, "FLEET_BIN": str(FLEET)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    registered = json.loads(done.stdout)
    assert registered == [
        {"name": f"fleet_{t.name}", "description": t.description, "parameters": t.input_schema}
        for t in TOOLS
    ]


@pytest.mark.parametrize(
    ("args", "stdin", "words"),
    [
        (("spawn", '{"task": "look", "budjet": 5}'), "", "spawn: unknown argument budjet"),
        (("spawn", "-"), '{"task": ""}', "spawn: task"),
        (("spawn", "{not json"), "", "not JSON"),
        (("spawn", "[1]"), "", "a JSON object"),
        (("nope", "{}"), "", "nope: no such tool"),
        (("stop", "{}"), "", "stop: 'agents' is a required property"),
    ],
)
def test_a_bad_call_is_refused_before_anything_runs(
    tmp_path: Path, args: tuple[str, ...], stdin: str, words: str
) -> None:
    done = fleet_tool(tmp_path, *args, stdin=stdin)
    assert done.returncode == 2, (done.stdout, done.stderr)
    error = json.loads(done.stdout)["error"]
    assert error["kind"] == "usage"
    assert words in error["message"]
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "home").exists()  # refused before any supervisor started
