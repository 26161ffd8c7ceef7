"""The supervisor daemon itself is SIGKILLed: its children go, the next start says so.

Driven through the real ``fleet`` CLI: a scout and a worker (in its worktree) are working when
``fleet serve`` is killed. Every child exits (IPC EOF, or its sandbox dying with its parent);
the next command starts a new supervisor that finds the dead one's registry snapshot, warns
once, lists the stale children in ``fleet peek --json``, keeps their logs and the worker's
worktree, and lets ``fleet stop`` copy that worktree back.
"""

import json
import os
import signal
import time
from typing import Any

import pytest

pytestmark = pytest.mark.slow

HANG = """
turns:
  - steps:
      - say: "working"
      - hang: true
"""

WRITE_AND_HANG = """
turns:
  - steps:
      - tool: write
        args: {path: src/app.py, content: "def main():\\n    return 43\\n"}
      - say: "wrote"
      - hang: true
"""


def peek(faults) -> dict[str, Any]:
    result = faults.cli("peek", "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_a_killed_supervisors_children_exit_and_the_next_start_reports_them(faults) -> None:
    session = faults.home / "sessions" / "t"
    scout = faults.cli("spawn", "--model", faults.script("hang", HANG), "look", "--json")
    assert scout.returncode == 0, scout.stderr
    worker = faults.cli(
        "spawn",
        "--agent",
        "worker",
        "--model",
        faults.script("write", WRITE_AND_HANG),
        "change it",
        "--json",
    )
    assert worker.returncode == 0, worker.stderr
    deadline = time.monotonic() + 30
    activities: dict[str, str] = {}
    while activities != {"a1": "working", "a2": "wrote"} and time.monotonic() < deadline:
        activities = {a["key"]: a["activity"] for a in peek(faults)["agents"]}
        time.sleep(0.2)
    assert activities == {"a1": "working", "a2": "wrote"}
    time.sleep(0.6)  # the registry snapshot is written within its throttle interval
    daemon = int((session / "supervisor.lock").read_text().strip())
    children = [p for p in faults.processes() if p.pid != daemon]
    assert children

    os.kill(daemon, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while faults.processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert faults.processes() == []

    worktree = session / "worktrees" / "a2"
    assert (worktree / "src" / "app.py").read_text() == "def main():\n    return 43\n"
    assert (faults.repo / "src" / "app.py").read_text() == "def main():\n    return 42\n"

    first = faults.cli("peek", "--json")
    assert first.returncode == 0, first.stderr
    [warning] = first.stderr.strip().splitlines()
    assert warning.startswith("fleet: warning: ")
    assert f"(pid {daemon}) died" in warning
    assert "a1 (scout, working)" in warning
    assert "a2 (worker, working)" in warning
    stale = {c["key"]: c for c in json.loads(first.stdout)["stale"]}
    assert set(stale) == {"a1", "a2"}
    assert stale["a1"]["log"] == str(session / "logs" / "a1.log")
    assert (session / "logs" / "a1.log").exists()
    assert stale["a1"]["recoverable"] is False
    assert stale["a2"]["recoverable"] is True
    assert stale["a2"]["worktree"] == str(worktree)
    assert all(c["running"] is False for c in stale.values())
    # The warning is shown once: later commands reuse the new supervisor quietly.
    again = faults.cli("peek", "--json")
    assert again.stderr == ""
    assert json.loads(again.stdout)["stale"] == list(stale.values())

    # New children do not reuse the dead ones' keys (their logs and worktree are kept).
    spawned = faults.cli("spawn", "--model", faults.script("hang", HANG), "again", "--json")
    assert json.loads(spawned.stdout)["agents"][0]["key"] == "a3"
    # The kept worktree is recoverable: stopping the stale worker copies its change back.
    stopped = faults.cli("stop", "a2", "--json")
    [handoff] = json.loads(stopped.stdout)["handoffs"]
    assert handoff["applied"] == ["src/app.py"], handoff
    assert (faults.repo / "src" / "app.py").read_text() == "def main():\n    return 43\n"
