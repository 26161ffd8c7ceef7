"""The supervisor's own Ray node (``address: local``), through the real CLI: a hostile worker's
oversize return is refused on the node in one line; the node outlives the thread that started
it; and when the node is lost, only its children are: the supervisor answers on.

Found by a hostile run: the supervisor died 60 s after its local node did, with every child
(also after a 250 MB return). ``fleet serve`` is the Ray driver here, not this process.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import psutil
import pytest

from tests.e2e.conftest import Fleet, running_fleet
from tests.e2e.test_governance import define

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

HANG = "turns:\n  - steps:\n      - hang: true\n"
#: trio retires an idle worker thread after 10 s; a margin over it.
THREAD_RETIRED_S = 15
#: Ray used to end its driver 60 s after its GCS was lost; a margin over it.
GCS_GIVEN_UP_S = 75


def node_processes(fleet: Fleet) -> list[psutil.Process]:
    """The local Ray node's GCS and raylet that this fleet's supervisor started."""
    found = []
    for process in psutil.process_iter(["name", "environ"]):
        try:
            environ = process.info["environ"] or {}
            if process.info["name"] in {"gcs_server", "raylet"} and environ.get(
                "FLEET_HOME"
            ) == str(fleet.home):
                found.append(process)
        except psutil.Error:
            continue
    return found


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_lost_local_node_costs_only_its_children(tmp_path: Path) -> None:
    env = {"FLEET_SURFACE": "ray", "FLEET_LEASE_S": "3"}
    with running_fleet(tmp_path, prefix="fln-", env=env) as fleet:
        # A hostile worker leaves 300 MB in its checkout (sparse: no disk): its node refuses
        # to send it back, in one line, and nothing reaches the repository.
        define(fleet, "big", backend="command", mode="worktree", tools=["read"])
        fleet.json(
            "spawn",
            "--agent",
            "big",
            "--command",
            "sh -c 'truncate -s 300M big.bin; echo wrote'",
            "x",
        )
        daemon = int((fleet.home / "sessions" / "t" / "supervisor.lock").read_text().strip())
        [note] = fleet.json("wait", "a1", "--timeout", "120", timeout=150)["settled"]
        assert note["report"].strip() == "wrote", note
        [handoff] = fleet.json("stop", "a1", code=1, timeout=150)["handoffs"]
        error = handoff["error"]
        assert "over the 268435456-byte cap" in error, handoff
        assert "\n" not in error
        assert not (fleet.repo / "big.bin").exists()

        # A child hangs on the node; the thread that started the node retires meanwhile.
        hang = fleet.script("hang", HANG)
        fleet.json("spawn", "--model", hang, "hang")
        node = node_processes(fleet)
        assert {p.name() for p in node} == {"gcs_server", "raylet"}, node
        time.sleep(THREAD_RETIRED_S)
        assert all(alive(p) for p in node), "the local node died with the thread that started it"
        assert fleet.json("peek", "a2")["agents"][0]["state"] == "working"

        # The node is lost (OOM, a person): the supervisor lives on past Ray's 60 s.
        for process in node:
            process.kill()
        deadline = time.monotonic() + GCS_GIVEN_UP_S
        while time.monotonic() < deadline:
            assert psutil.pid_exists(daemon), "the supervisor died with its node"
            time.sleep(1)
        assert psutil.Process(daemon).status() != psutil.STATUS_ZOMBIE
        peek = fleet.json("peek")
        assert [a["key"] for a in peek["agents"]] == ["a2"] or peek["agents"] == [], peek
        fleet.run("stop", "a2", timeout=150)
