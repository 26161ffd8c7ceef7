"""The control socket serves the parent, never a child (containment issue, item 3).

A hostile ``command`` child connects to the session's control socket and tries to spawn a
worker, change the mode and shut the supervisor down — with a guessed token, and with the real
control token the test hands it. Sandboxed or not, every attempt is refused (the peer is inside
a child's process tree) and counted, and the parent's own verbs still work afterwards.
"""

import json
import textwrap

import pytest

from tests.security._control_util import (
    control_token,
    hand_over,
    honest_child_works,
    hostile_fleet,
    sandboxed,
    session_root,
    settle,
    spawn_payload,
)

__all__ = ["hostile_fleet"]

pytestmark = pytest.mark.slow

ATTACK = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from pathlib import Path

    import trio

    from orchestrator.control._client import call_async

    handed = json.loads(Path({handed!r}).read_text())


    def verdict(exc):
        text = f"{{type(exc).__name__}}: {{exc}}"
        if "No such file" in text:
            return "absent"  # the sandbox hides the state directory: no socket to reach
        if "unreachable" in text:
            return "refused"  # connected, then closed before the hello was answered
        return text[:60]

    results = {{}}
    ops = [
        ("ping", {{}}),
        ("spawn", {{"requests": [{{"task": "pwn", "agent": "worker"}}]}}),
        ("mode", {{"name": "plan"}}),
        ("shutdown", {{}}),
    ]
    for label, token in (("guessed", "0" * 64), ("real", handed["token"])):
        for op, args in ops:
            try:
                data = trio.run(
                    lambda: call_async(Path(handed["socket"]), token, op, args, timeout=5)
                )
                results[f"{{label}}-{{op}}"] = "ok " + json.dumps(data)
            except Exception as exc:
                results[f"{{label}}-{{op}}"] = verdict(exc)
    # A grandchild that drops the run marker is still inside the child's tree.
    code = (
        "import trio, json, sys; from pathlib import Path;"
        "from orchestrator.control._client import call_async;"
        "h = json.loads(Path(sys.argv[1]).read_text());"
        "print(trio.run(lambda: call_async(Path(h['socket']), h['token'], 'ping', {{}},"
        " timeout=5)))"
    )
    env = {{k: v for k, v in os.environ.items() if k != "FLEET_RUN"}}
    grandchild = subprocess.run(
        [sys.executable, "-c", code, {handed!r}], env=env, capture_output=True, text=True
    )
    results["grandchild-ping"] = "ok" if grandchild.returncode == 0 else verdict(
        Exception(grandchild.stderr)
    )
    print(json.dumps(results))
    """
)


def test_a_child_with_the_real_control_token_is_refused_and_counted(hostile_fleet):
    fleet = hostile_fleet
    before = fleet.json("peek")
    assert before["control"]["refused"] == 0
    socket_path = fleet.paths.control_socket
    handed = hand_over(
        fleet, "control", {"token": control_token(fleet), "socket": str(socket_path)}
    )
    key = spawn_payload(fleet, ATTACK.format(handed=str(handed)))
    note = settle(fleet, key)
    assert note["state"] == "idle", note
    results = json.loads(note["report"])
    assert len(results) == 9, results
    for attempt, outcome in results.items():
        # Refused by the supervisor (the connection is closed before the hello is answered),
        # or, where the sandbox hides the state directory, the socket is not there at all.
        assert outcome in {"refused", "absent"}, (attempt, outcome)
    # The parent's verbs still work, nothing was spawned, the mode is unchanged.
    after = fleet.json("peek")
    assert [agent["key"] for agent in after["agents"]] == [key]
    assert after["mode"] == before["mode"]
    refused = after["control"]["refused"]
    reached = [o for o in results.values() if o == "refused"]
    assert refused == len(reached)
    if not sandboxed(fleet):
        assert refused == 9  # nothing hides the socket from an unsandboxed child: all counted
    if refused:
        rejected = (session_root(fleet) / "logs" / "rejected.jsonl").read_text().splitlines()
        entries = [json.loads(line) for line in rejected]
        refusals = [e for e in entries if e["kind"] == "control-refused"]
        assert len(refusals) == refused
        assert all(e["owner"] == "control" for e in refusals)
        assert all(
            "child pid" in e["args"]["reason"] or "marker" in e["args"]["reason"] for e in refusals
        )
    fleet.json("stop", key)
    honest_child_works(fleet)
    assert fleet.json("peek")["control"]["refused"] == refused  # the parent is never refused
