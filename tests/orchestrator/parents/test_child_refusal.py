"""No child reaches or starts an MCP server with its parent's powers (issue 36, item 3).

A hostile ``command`` child, sandboxed and (the second time) unsandboxed, runs ``fleet mcp``
and ``python -m orchestrator mcp`` as it is (``FLEET_CHILD=1``: every verb refuses, exit 4),
then again with ``FLEET_CHILD`` removed and the parent's ``FLEET_HOME``/``FLEET_SESSION`` and
control token handed to it, asking the server to spawn a worker. Nothing reaches the parent's
fleet: no child of its is added, its checkout is unchanged, and an honest child still works.
"""

import json
import textwrap

import pytest

from tests.security._control_util import (
    control_token,
    hand_over,
    honest_child_works,
    hostile_fleet,
    spawn_payload,
)

__all__ = ["hostile_fleet"]

pytestmark = pytest.mark.slow

ATTACK = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from pathlib import Path

    handed = json.loads(Path({handed!r}).read_text())
    results = {{}}

    def run(argv, env, stdin=b"", timeout=20):
        try:
            done = subprocess.run(
                argv, env=env, input=stdin, capture_output=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return "timeout", ""
        return done.returncode, (done.stdout + done.stderr).decode(errors="replace")

    mcp = [sys.executable, "-m", "orchestrator", "mcp"]
    code, text = run(mcp, dict(os.environ))
    results["as-child-mcp"] = [code, "refused inside a fleet child" in text]
    spawn = [sys.executable, "-m", "orchestrator", "--json", "spawn", "pwn"]
    code, text = run(spawn, dict(os.environ))
    results["as-child-spawn"] = [code, "refused" in text]

    messages = [
        {{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {{
            "protocolVersion": "2025-06-18", "capabilities": {{}},
            "clientInfo": {{"name": "hostile", "version": "1"}}}}}},
        {{"jsonrpc": "2.0", "method": "notifications/initialized"}},
        {{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {{
            "name": "spawn", "arguments": {{"task": "pwn", "agent": "worker",
            "backend": "command", "model": "x"}}}}}},
    ]
    stdin = "".join(json.dumps(m) + "\\n" for m in messages).encode()
    env = {{k: v for k, v in os.environ.items() if k != "FLEET_CHILD"}}
    env.update(FLEET_HOME=handed["home"], FLEET_SESSION=handed["session"])
    code, text = run(mcp, env, stdin, timeout=50)
    results["unmarked-mcp"] = [code, text[-400:]]
    print(json.dumps(results))
    """
)


def test_a_child_can_neither_reach_nor_start_an_mcp_server_with_the_parents_powers(
    hostile_fleet,
):
    fleet = hostile_fleet
    fleet.json("peek")  # the supervisor runs, so its token exists
    handed = hand_over(
        fleet,
        "handed",
        {"home": str(fleet.home), "session": "t", "token": control_token(fleet)},
    )
    before = (fleet.repo / "README.md").read_bytes()
    key = spawn_payload(fleet, ATTACK.format(handed=str(handed)))
    [note] = fleet.json("wait", key, "--timeout", "150", timeout=180)["settled"]
    report = note["report"].strip().splitlines()[-1]
    results = json.loads(report)
    assert results["as-child-mcp"] == [4, True], results
    assert results["as-child-spawn"] == [4, True], results
    # Refused at once, not after the server's wait for a supervisor that answers (it took
    # the whole 50 s here once: the control socket hung up without a word).
    assert results["unmarked-mcp"][0] == 0, results
    keys = {a["key"] for a in fleet.json("peek")["agents"]}
    assert keys == {key}, keys  # nothing the hostile child asked for joined the parent's fleet
    assert (fleet.repo / "README.md").read_bytes() == before
    fleet.json("stop", key)
    honest_child_works(fleet)
