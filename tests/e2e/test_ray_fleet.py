"""Children on a Ray cluster (three simulated nodes), driven through the real CLI.

The cluster is ``ray.cluster_utils.Cluster`` on this machine, started once for the module; each
test's supervisor joins it as its own driver (``FLEET_RAY_ADDRESS``).
"""

import contextlib
import os
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from ray.cluster_utils import Cluster

from orchestrator.launch._nodeplan import node_root
from tests.e2e.conftest import Fleet, fleet_processes, running_fleet

pytestmark = pytest.mark.slow

WORK = """
turns:
  - steps:
      - tool: read
        args: {path: README.md}
      - reply: "## Summary\\n{{task}}: {{tool:read}}"
"""
WRITER = """
turns:
  - steps:
      - tool: edit
        args: {path: src/app.py, old_text: "return 42", new_text: "return 43"}
      - tool: write
        args: {path: NOTES.md, content: "written on a node\\n"}
      - reply: "## Summary\\nchanged app.py, added NOTES.md"
"""
HANG = "turns:\n  - steps:\n      - hang: true\n"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    for slots in (1, 1, 2):
        c.add_node(num_cpus=1, resources={"agent_slot": slots})
    yield c
    c.shutdown()


@pytest.fixture
def fleet(tmp_path: Path, cluster: Cluster) -> Iterator[Fleet]:
    env = {"FLEET_RAY_ADDRESS": cluster.address, "FLEET_SURFACE": "ray"}
    with running_fleet(tmp_path, env=env) as fleet:
        yield fleet


def node_directory(fleet: Fleet, key: str) -> Path:
    """Child *key*'s node directory, as its log names it."""
    logs = fleet.run("logs", key).stdout
    [line] = [line for line in logs.splitlines() if "node directory " in line]
    node = Path(line.split("node directory ", 1)[1].strip())
    assert str(node.parent) == node_root(), node  # memory, when this machine has room
    assert node.name.startswith(f"fleet-node-t-{key}-"), node
    assert len(node.name) > 30, node  # a random part
    return node


def assert_node_directory(node: Path) -> None:
    """*node* is ours, 0700, not a symlink; its loadout file was gone before the child ran (its
    node read it and handed it to the child as a sealed memfd)."""
    info = node.lstat()
    assert stat.S_ISDIR(info.st_mode), node
    assert info.st_uid == os.getuid(), node
    assert stat.S_IMODE(info.st_mode) == 0o700, oct(info.st_mode)
    assert not (node / "loadout.json").exists()


def assert_nothing_local(fleet: Fleet, key: str) -> None:
    """Nothing of remote child *key* was made under the supervisor's session directory but
    its kept resume context (its transcript, fetched from its node at each turn end)."""
    session = fleet.home / "sessions" / "t"
    assert not (session / "checkouts").exists()
    kept = session / "scratch" / key
    if kept.exists():
        assert [p.name for p in kept.iterdir()] == ["transcript.json"]
        assert stat.S_IMODE(kept.stat().st_mode) == 0o700
    assert not (session / "loadouts" / f"{key}.json").exists()
    assert not (fleet.paths.egress / f"{key}.sock").exists()  # its proxy is its node's
    assert (session / "logs" / f"{key}.log").exists()  # the supervisor's record stays here


#: How a child's run log names its node directory.
NAMED = "node directory "


def _node_dirs(home: Path) -> list[str]:
    """Every node directory the fleet under *home* named in its children's run logs."""
    found: list[str] = []
    for log in home.glob("sessions/*/logs/*.log"):
        with contextlib.suppress(OSError):
            lines = log.read_text(errors="replace").splitlines()
            found += [ln.split(NAMED, 1)[1].strip() for ln in lines if NAMED in ln]
    return found


def child_pids(home: Path) -> list[int]:
    """Live child processes of the fleet under *home*: a ``python -m child`` started with the
    fleet's environment, or a fork of a node host's fork server (whose environment block is
    the server's) working in one of the fleet's node directories."""
    dirs = _node_dirs(home)
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = process.info["cmdline"] or []
            environ = process.info["environ"] or {}
            ours = "child" in cmdline and environ.get("FLEET_HOME") == str(home)
            cwd = process.cwd() if dirs and not ours else ""
            if ours or any(cwd == d or cwd.startswith(f"{d}/") for d in dirs):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def test_children_on_the_cluster_report_back(fleet):
    model = fleet.script("work", WORK)
    for task in ("a", "b", "c", "d"):
        fleet.json("spawn", "--surface", "ray", "--model", model, task)
    settled = fleet.json("wait", "a1", "a2", "a3", "a4", "--all", "--timeout", "120", timeout=150)[
        "settled"
    ]
    assert len(settled) == 4
    for note in settled:
        assert "The answer is 42." in note["report"], note
    peek = fleet.json("peek")["agents"]
    assert {a["surface"] for a in peek} == {"ray"}
    # The sandbox applies on the node as it does locally (bwrap is installed here).
    assert all(a["sandboxed"] for a in peek), peek
    nodes = {key: node_directory(fleet, key) for key in ("a1", "a2", "a3", "a4")}
    for key, node in nodes.items():
        assert_node_directory(node)
        # Each read its node's read-only checkout of the workspace, not the workspace itself.
        checkout = node / "checkout"
        assert (checkout / "README.md").read_text() == (fleet.repo / "README.md").read_text()
        assert not (checkout / "README.md").stat().st_mode & 0o222
        # Its channel rode its node host's one link to the door: it was given no key, no
        # leaf, nothing of TLS at all, and dialled nothing itself.
        assert not (node / "scratch" / "tls").exists(), key
        assert "its channel rides its node host's link" in fleet.run("logs", key).stdout, key
        assert_nothing_local(fleet, key)
    fleet.json("stop", *nodes, timeout=150)
    for node in nodes.values():
        assert not node.exists(), node  # its actor removed it when the child ended


def test_an_unsandboxed_remote_child_also_lives_in_its_node_directory(tmp_path, cluster):
    env = {"FLEET_RAY_ADDRESS": cluster.address, "FLEET_SURFACE": "ray"}
    env |= {"FLEET_SANDBOX": "off", "FLEET_ALLOW_UNSANDBOXED": "1"}
    with running_fleet(tmp_path, env=env) as fleet:
        model = fleet.script("work", WORK)
        fleet.json("spawn", "--surface", "ray", "--model", model, "a")
        [note] = fleet.json("wait", "a1", "--timeout", "120", timeout=150)["settled"]
        assert "The answer is 42." in note["report"], note
        [agent] = fleet.json("peek")["agents"]
        assert agent["sandboxed"] is False, agent
        node = node_directory(fleet, "a1")
        assert_node_directory(node)
        assert (node / "checkout" / "README.md").exists()
        assert_nothing_local(fleet, "a1")
        fleet.json("stop", "a1", timeout=150)
        assert not node.exists(), node


def test_the_supervisor_ending_takes_every_remote_child_with_it(tmp_path, cluster):
    env = {"FLEET_RAY_ADDRESS": cluster.address, "FLEET_SURFACE": "ray"}
    with running_fleet(tmp_path, env=env) as fleet:
        model = fleet.script("hang", HANG)
        for task in ("x", "y"):
            fleet.json("spawn", "--surface", "ray", "--model", model, task)
        deadline = time.monotonic() + 90
        while len(child_pids(fleet.home)) < 2:
            assert time.monotonic() < deadline, "the children never started"
            time.sleep(0.2)
        pids = child_pids(fleet.home)
        fleet.run("serve", "--stop", timeout=90)
        deadline = time.monotonic() + 30
        while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
            assert time.monotonic() < deadline, f"remote children outlived the supervisor: {pids}"
            time.sleep(0.2)


def test_a_workers_changes_come_back_from_its_node_and_apply(fleet):
    model = fleet.script("writer", WRITER)
    [agent] = fleet.json("spawn", "--surface", "ray", "--agent", "worker", "--model", model, "w")[
        "agents"
    ]
    assert agent["mode"] == "worktree"
    [note] = fleet.json("wait", "a1", "--timeout", "120", timeout=150)["settled"]
    assert note["error"] == "", note
    # The child worked in the node's checkout of the snapshot bundle, not the local worktree.
    worktree = fleet.home / "sessions" / "t" / "worktrees" / "a1"
    node = node_directory(fleet, "a1")
    assert_node_directory(node)
    checkout = node / "checkout"
    assert (checkout / "NOTES.md").read_text() == "written on a node\n"
    assert not (checkout / ".git").exists()  # its Git dir is the node's, out of its view
    assert not (worktree / "NOTES.md").exists()
    assert_nothing_local(fleet, "a1")
    assert (fleet.repo / "src" / "app.py").read_text() == "def main():\n    return 42\n"
    [handoff] = fleet.json("stop", "a1", timeout=150)["handoffs"]
    assert handoff["error"] == "", handoff
    assert sorted(handoff["applied"]) == ["NOTES.md", "src/app.py"]
    assert (fleet.repo / "src" / "app.py").read_text() == "def main():\n    return 43\n"
    assert (fleet.repo / "NOTES.md").read_text() == "written on a node\n"
    assert not worktree.exists()
    assert not node.exists(), node  # gone after bring_back
    assert_nothing_local(fleet, "a1")


def test_a_remote_child_whose_supervisor_goes_silent_stops_within_its_lease(tmp_path, cluster):
    env = {"FLEET_RAY_ADDRESS": cluster.address, "FLEET_SURFACE": "ray", "FLEET_LEASE_S": "3"}
    with running_fleet(tmp_path, env=env) as fleet:
        model = fleet.script("hang", HANG)
        fleet.json("spawn", "--surface", "ray", "--agent", "worker", "--model", model, "hold")
        deadline = time.monotonic() + 90
        while fleet.json("peek")["agents"][0]["state"] != "working":
            assert time.monotonic() < deadline, "the child never started its turn"
            time.sleep(0.2)
        pids = child_pids(fleet.home)  # the sandbox and the child in it
        [supervisor] = [
            p
            for p in fleet_processes(fleet.home)
            if p.cmdline()[2:5] == ["-m", "orchestrator", "serve"]
        ]
        # Frozen, not gone: the TCP connection stays up, only the renewals stop.
        supervisor.send_signal(signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            while any(
                psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids
            ):
                assert time.monotonic() - stopped < 3 + 5, "the child outlived its lease"
                time.sleep(0.1)
        finally:
            supervisor.send_signal(signal.SIGCONT)
        [note] = fleet.json("wait", "a1", "--timeout", "60", code=1, timeout=90)["settled"]
        assert note["state"] == "failed", note
        logs = fleet.run("logs", "a1").stdout
        assert "lease expired: no word from the supervisor for 3 s" in logs, logs
        # Its locks went only with it: the worktree is kept, nothing was copied back.
        assert (fleet.repo / "src" / "app.py").read_text() == "def main():\n    return 42\n"
