"""A Ray node lost mid-turn, seen through the real CLI: its worker fails once, its locks and
its capacity are given back (the locks only once its lease is out), and nothing of it runs on.

The cluster is ``ray.cluster_utils.Cluster`` on this machine: a head node with no
``agent_slot`` (no child can run there) and one node with one slot, whose raylet the test kills.
"""

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from ray.cluster_utils import Cluster

from tests.e2e.conftest import Fleet, running_fleet
from tests.e2e.test_governance import define
from tests.e2e.test_ray_fleet import child_pids, node_directory

pytestmark = pytest.mark.slow

#: Writes under src/ (taking its declared lock at that first write), then hangs mid-turn.
HOLD = """
turns:
  - steps:
      - tool: write
        args: {path: src/held.txt, content: "mine\\n"}
      - hang: true
"""
#: Writes the same file (locking it at that write: it declares no ownership), then reports.
QUICK = """
turns:
  - steps:
      - tool: write
        args: {path: src/held.txt, content: "mine now\\n"}
      - reply: "## Summary\\nheld src"
"""
LEASE_S = 3


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    yield c
    c.shutdown()


def peek_until(fleet: Fleet, predicate: Any, within: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        peek: dict[str, Any] = fleet.json("peek", "--locks")
        if predicate(peek):
            return peek
        assert time.monotonic() < deadline, f"{what}: {peek}"
        time.sleep(0.2)


def test_a_lost_node_fails_its_worker_once_and_gives_back_locks_and_capacity(
    tmp_path: Path, cluster: Cluster
) -> None:
    doomed = cluster.add_node(num_cpus=1, resources={"agent_slot": 1})
    cluster.wait_for_nodes()
    env = {
        "FLEET_RAY_ADDRESS": cluster.address,
        "FLEET_SURFACE": "ray",
        "FLEET_LEASE_S": str(LEASE_S),
    }
    with running_fleet(tmp_path, env=env) as fleet:
        tools = ["read", "write"]
        hold, quick = fleet.script("hold", HOLD), fleet.script("quick", QUICK)
        define(fleet, "holder", mode="worktree", tools=tools, ownership=["src/**"], model=hold)
        define(fleet, "next", mode="worktree", tools=tools, model=quick)  # owns what it writes
        fleet.json("spawn", "--agent", "holder", "hold src")
        repo = fleet.repo.resolve()
        peek_until(
            fleet,
            lambda p: (
                p["agents"][0]["state"] == "working" and p["locks"] == {"a1": [f"{repo}/src/**"]}
            ),
            90,
            "the worker never started its turn on the node",
        )
        pids = child_pids(fleet.home)
        assert pids, "no child process on the node"

        # The node's raylet dies mid-turn, with no graceful drain.
        lost_at = time.monotonic()
        cluster.remove_node(doomed, allow_graceful=False)

        [note] = fleet.json("wait", "a1", "--timeout", "90", code=1, timeout=120)["settled"]
        assert note["state"] == "failed", note
        # No process of it runs on: PR_SET_PDEATHSIG took the child with its actor's worker.
        deadline = time.monotonic() + 30
        while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
            assert time.monotonic() < deadline, f"the lost node's child outlived it: {pids}"
            time.sleep(0.2)
        # Its locks were handed on only once its lease had run out, and then they were.
        peek = peek_until(fleet, lambda p: p["locks"] == {}, 30, "the locks were never given back")
        assert time.monotonic() - lost_at >= LEASE_S - 0.5
        assert peek["agents"] == [], peek  # retired: it holds no slot of the fleet
        # Failed exactly once: one handoff in the journal, and it says failed.
        events = [json.loads(x) for x in fleet.run("events", "--json").stdout.splitlines()]
        mine = [e for e in events if e["key"] == "a1"]
        [handoff] = [e for e in mine if e["kind"] == "handoff"]
        assert handoff["state"] == "failed", handoff
        assert [e["kind"] for e in mine].count("settled") <= 1, mine
        # Nothing came back from the node: the repository is as it was.
        assert (fleet.repo / "src" / "app.py").read_text() == "def main():\n    return 42\n"

        # Its capacity is free again: a new node's slot takes the next writer of the same paths.
        cluster.add_node(num_cpus=1, resources={"agent_slot": 1})
        cluster.wait_for_nodes()
        fleet.json("spawn", "--agent", "next", "hold src again")
        [note] = fleet.json("wait", "a2", "--timeout", "90", timeout=120)["settled"]
        assert note["report"] == "## Summary\nheld src", note
        peek = fleet.json("peek", "--locks")
        # The path it wrote in its node's checkout is locked as the repository's path.
        assert peek["locks"] == {"a2": [f"{repo}/src/held.txt"]}, peek
        [handoff] = fleet.json("stop", "a2", timeout=150)["handoffs"]
        assert handoff["applied"] == ["src/held.txt"], json.dumps(handoff)
        assert (fleet.repo / "src" / "held.txt").read_text() == "mine now\n"
        # The lost node's directory went with its node on a real cluster; here every
        # simulated node shares this machine's /dev/shm, where nothing can sweep it.
        shutil.rmtree(node_directory(fleet, "a1"), ignore_errors=True)
