"""Helpers for the control-socket and redaction suites: a real fleet under the real CLI, and
hostile ``command`` children whose Python payload the test writes."""

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Fleet, running_fleet

SESSION = "t"


@pytest.fixture(params=["sandboxed", "unsandboxed"])
def hostile_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    """A fleet whose hostile children run sandboxed or, the second time, unsandboxed."""
    env = {"FLEET_REJECT_LOG": "1"}
    if request.param == "unsandboxed":
        env["FLEET_SANDBOX"] = "off"
        env["FLEET_ALLOW_UNSANDBOXED"] = "1"
    with running_fleet(tmp_path, prefix="fls-", session=SESSION, env=env) as fleet:
        yield fleet


def session_root(fleet: Fleet) -> Path:
    return fleet.home / "sessions" / SESSION


def control_token(fleet: Fleet) -> str:
    """The real control token (the supervisor must be running)."""
    return fleet.paths.control_token.read_text().strip()


def hand_over(fleet: Fleet, name: str, secrets: dict[str, Any]) -> Path:
    """Put *secrets* where a hostile child can read them: a file in its workspace."""
    path = fleet.repo / f"{name}.json"
    path.write_text(json.dumps(secrets))
    return path


def spawn_payload(fleet: Fleet, payload: str, *, task: str = "task") -> str:
    """Spawn a ``command`` child running the Python *payload*; its stdout is its report."""
    command = shlex.join([sys.executable, "-c", payload])
    args = ["spawn", "--backend", "command", "--command", command]
    if fleet.env.get("FLEET_SANDBOX") == "off":
        args.append("--allow-unsandboxed")
    data = fleet.json(*args, task)
    return str(data["agents"][0]["key"])


def settle(fleet: Fleet, key: str) -> dict[str, Any]:
    [note] = fleet.json("wait", key, "--timeout", "60")["settled"]
    return dict(note)


def sandboxed(fleet: Fleet) -> bool:
    return fleet.env.get("FLEET_SANDBOX") != "off"


def honest_child_works(fleet: Fleet) -> None:
    """The fleet still serves an honest child: spawned, settled with its report, stopped."""
    key = spawn_payload(fleet, "print('honest ' + input())", task="work")
    note = settle(fleet, key)
    assert note["state"] == "idle", note
    assert note["report"].strip() == "honest work"
    [handoff] = fleet.json("stop", key)["handoffs"]
    assert handoff["state"] == "stopped"
