"""A remote child comes back on another node with its context, through the real CLI.

Two turns of a builtin child on a Ray node settle (the loopback scripted model server answers
them); its supervisor is SIGKILLed mid-turn (Ray ends its actor, the child dies with it) and its
node is lost too, so nothing of it is left on any node. A new node joins; ``fleet revive`` brings
the child back there, and its next request carries the two earlier turns: the transcript the
supervisor fetched from the first node at each turn end, shipped into the new node directory.

The cluster is ``ray.cluster_utils.Cluster`` on this machine: a head with no ``agent_slot`` (no
child can run there) and one node of one slot at a time, so where the child runs is known.
"""

import contextlib
import json
import os
import signal
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import Cluster

from child.backends._base import RESTARTED
from orchestrator._trees import remove_tree
from tests.e2e.conftest import Fleet, running_fleet
from tests.e2e.test_governance import define
from tests.e2e.test_ray_fleet import child_pids
from tests.fakes._agent_clis import NPM_BIN
from tests.fakes.model_server import ModelServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    yield c
    c.shutdown()


def _until(check: Callable[[], object], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _state(fleet: Fleet) -> str:
    agents = fleet.json("peek", "a1")["agents"]
    return str(agents[0]["state"]) if agents else ""


def _sweep(fleet: Fleet, key: str = "a1") -> None:
    """Remove the node directories *key* had: the lost node's are left on this machine (a lost
    node keeps its directories until its own clean-up, docs/scale-out.md)."""
    with contextlib.suppress(OSError):
        for path in _node_dirs(fleet, key):
            if Path(path).name.startswith(f"fleet-node-t-{key}-"):
                remove_tree(path)


def _node_dirs(fleet: Fleet, key: str = "a1") -> list[str]:
    log = (fleet.paths.logs / f"{key}.log").read_text()
    return [line.split("node directory ", 1)[1] for line in log.splitlines() if "node dir" in line]


@pytest.mark.parametrize("host", ["actor", "host"])
def test_a_remote_child_lost_with_its_node_is_revived_on_another_with_its_context(
    tmp_path: Path, cluster: Cluster, host: str
) -> None:
    first = cluster.add_node(num_cpus=1, resources={"agent_slot": 1})
    cluster.wait_for_nodes()
    env = {
        "FLEET_RAY_ADDRESS": cluster.address,
        "FLEET_SURFACE": "ray",
        "FLEET_RAY_NODE_HOST": "1" if host == "host" else "0",
    }
    with ModelServer() as srv, running_fleet(tmp_path, env=env) as fleet:
        try:
            srv.script(
                "c1",
                [
                    {"text": "## Summary\nfirst"},
                    {"text": "## Summary\nsecond"},
                    {"stall": True, "text": "partial"},
                    {"text": "## Summary\nafter the revive"},
                ],
            )
            model = f"openai:fake-model@{srv.base_url('c1')}/v1"
            fleet.json("spawn", "--model", model, "--name", "mapper", "turn one", timeout=180)
            [note] = fleet.json("wait", "a1", "--timeout", "150", timeout=180)["settled"]
            assert note["report"] == "## Summary\nfirst", note
            fleet.json("resume", "a1", "turn two")
            [note] = fleet.json("wait", "a1", "--timeout", "90", timeout=120)["settled"]
            assert note["report"] == "## Summary\nsecond", note
            # Kept on the supervisor's side by the time the turn settled: in the child's own
            # place in the state directory, private.
            kept = fleet.paths.scratch / "a1" / "transcript.json"
            assert "turn two" in kept.read_text()
            assert stat.S_IMODE(kept.stat().st_mode) == 0o600
            assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
            fleet.json("resume", "a1", "turn three")
            third = "the third turn never reached the model"
            _until(lambda: len(srv.requests("c1")) == 3, 60, third)

            # The supervisor dies mid-turn; Ray ends its actors and the child with them.
            daemon = int((fleet.paths.root / "supervisor.lock").read_text().strip())
            os.kill(daemon, signal.SIGKILL)
            _until(lambda: not child_pids(fleet.home), 60, "the child outlived its supervisor")
            # Its node is lost too: nothing of the child is left on any node.
            [before] = _node_dirs(fleet)
            cluster.remove_node(first, allow_graceful=False)
            cluster.add_node(num_cpus=1, resources={"agent_slot": 1})
            cluster.wait_for_nodes()

            peek = fleet.run("peek", "--json", timeout=120)
            assert peek.returncode == 0, peek.stderr
            assert "fleet revive a1 brings them back with their context" in peek.stderr
            [lost] = json.loads(peek.stdout)["stale"]
            assert (lost["key"], lost["state"], lost["revivable"]) == ("a1", "lost", True), lost

            revived = fleet.json("revive", "a1", timeout=180)
            assert revived["revived"][0]["name"] == "mapper"
            _until(lambda: _state(fleet) == "idle", 150, "the revived child never came back idle")
            after = _node_dirs(fleet)[-1]
            assert after != before
            log = (fleet.paths.logs / "a1.log").read_text()
            assert "context restored on its node (1 file(s))" in log
            fleet.json("resume", "a1", "turn four")
            [note] = fleet.json("wait", "a1", "--timeout", "90", timeout=120)["settled"]
            assert note["report"] == "## Summary\nafter the revive", note

            fourth = srv.requests("c1")[3].body
            texts = [m["content"] for m in fourth["messages"] if m["role"] in {"user", "assistant"}]
            assert texts[:4] == ["turn one", "## Summary\nfirst", "turn two", "## Summary\nsecond"]
            assert texts[4] == f"{RESTARTED}\nturn four"  # the lost third turn was never saved
            fleet.json("stop", "a1", timeout=150)
            # Handed off: nothing can resume it now, and its kept context is gone.
            assert not (fleet.paths.scratch / "a1").exists()
        finally:
            _sweep(fleet)


#: Per agent CLI: its binary's variable, the model it talks to, and its request's texts.
CLIS = {
    "pi": ("FLEET_PI_BIN", "openai:fake-model@{base}/v1", {}),
    "claude": (
        "FLEET_CLAUDE_BIN",
        "anthropic:claude-fake@{base}",
        {"ANTHROPIC_API_KEY": "sk-ant-scripted"},
    ),
    "codex": ("FLEET_CODEX_BIN", "openai:fake-model@{base}/v1", {"OPENAI_API_KEY": "sk-scripted"}),
}


def _why_not_revivable(fleet: Fleet, lost: list[dict[str, Any]]) -> str:
    """Each lost child's state and reason, and what the supervisor kept of it (its files)."""
    lines = []
    for entry in lost:
        place = fleet.paths.scratch / entry["key"]
        kept = sorted(str(p.relative_to(place)) for p in place.rglob("*")) if place.is_dir() else []
        beside = sorted(p.name for p in place.parent.glob(f".{entry['key']}.*"))
        lines.append(
            f"{entry['key']} {entry['state']}: {entry.get('revive')!r}; kept {kept}; "
            f"beside it {beside}"
        )
    return "\n".join(lines)


def _kept_text(fleet: Fleet, key: str) -> str:
    """Every file of the context the supervisor keeps for *key*, as text."""
    place = fleet.paths.scratch / key
    try:
        return "".join(p.read_text(errors="replace") for p in place.rglob("*") if p.is_file())
    except OSError:  # swapped for a newer copy meanwhile
        return ""


def _texts(body: dict[str, object]) -> list[str]:
    """Every message's text, in order (content blocks flattened; Codex sends ``input``)."""
    texts = []
    for message in body.get("messages") or body.get("input") or []:  # type: ignore[attr-defined]
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
        texts.append(str(content))
    return texts


@pytest.mark.needs("pi")
@pytest.mark.needs("claude")
@pytest.mark.needs("codex")
def test_remote_agent_cli_children_are_revived_on_another_node_with_their_sessions(
    tmp_path: Path, cluster: Cluster
) -> None:
    """One child of each agent CLI, side by side on one node (a1 Pi, a2 Claude Code, a3
    Codex): each resumes on the new node from the session the supervisor kept of it."""
    first = cluster.add_node(num_cpus=1, resources={"agent_slot": len(CLIS)})
    cluster.wait_for_nodes()
    env = {"FLEET_RAY_ADDRESS": cluster.address, "FLEET_SURFACE": "ray", "FLEET_RAY_NODE_HOST": "1"}
    for backend, (variable, _, extra) in CLIS.items():
        env |= {variable: str(NPM_BIN / backend), **extra}
    keys = {backend: f"a{n}" for n, backend in enumerate(CLIS, 1)}
    with ModelServer() as srv, running_fleet(tmp_path, env=env) as fleet:

        def api(backend: str) -> list[Any]:
            return [r for r in srv.requests(backend) if r.api]

        def each(*argv: str, timeout: float = 120) -> dict[str, Any]:
            """``fleet ARGV[0] KEY ARGV[1:]`` for every child; the settled notes by backend."""
            return {b: fleet.json(argv[0], k, *argv[1:], timeout=timeout) for b, k in keys.items()}

        def reports(wait: float) -> dict[str, str]:
            settled = each("wait", "--timeout", str(wait), timeout=wait + 30)
            return {b: note["settled"][0]["report"] for b, note in settled.items()}

        try:
            for backend, (_, model, _) in CLIS.items():
                srv.script(
                    backend,
                    [
                        {"text": "## Summary\nfirst"},
                        {"text": "## Summary\nsecond"},
                        {"stall": True, "text": "partial"},
                        {"text": "## Summary\nafter the revive"},
                    ],
                )
                spec = model.format(base=srv.base_url(backend))
                fleet.json("spawn", "--backend", backend, "--model", spec, "turn one", timeout=180)
            assert reports(150) == dict.fromkeys(CLIS, "## Summary\nfirst")
            each("resume", "turn two")
            assert reports(90) == dict.fromkeys(CLIS, "## Summary\nsecond")
            each("resume", "turn three")
            _until(lambda: all(len(api(b)) == 3 for b in CLIS), 60, "a third turn never came")
            daemon = int((fleet.paths.root / "supervisor.lock").read_text().strip())
            # An agent CLI writes its session when it sees fit: the supervisor fetches it again a
            # second or so after the turn ended, and the copy holds the second turn by then.
            _until(
                lambda: all("turn two" in _kept_text(fleet, k) for k in keys.values()),
                30,
                "turn two never reached a child's copy",
            )
            os.kill(daemon, signal.SIGKILL)
            _until(lambda: not child_pids(fleet.home), 60, "a child outlived its supervisor")
            cluster.remove_node(first, allow_graceful=False)
            cluster.add_node(num_cpus=1, resources={"agent_slot": len(CLIS)})
            cluster.wait_for_nodes()

            lost = fleet.json("peek", timeout=120)["stale"]
            assert sorted((s["key"], s["state"], s["revivable"]) for s in lost) == [
                (key, "lost", True) for key in sorted(keys.values())
            ], _why_not_revivable(fleet, lost)
            each("resume", "turn four", timeout=180)  # revives each first
            assert reports(150) == dict.fromkeys(CLIS, "## Summary\nafter the revive")
            for backend in CLIS:
                texts = _texts(api(backend)[-1].body)
                joined = "\n".join(texts)
                for earlier in ("turn one", "## Summary\nfirst", "turn two", "## Summary\nsecond"):
                    assert earlier in joined, (backend, texts)
                assert f"{RESTARTED}\nturn four" in texts[-1], (backend, texts)
            fleet.json("stop", *keys.values(), timeout=150)
        finally:
            for key in keys.values():
                _sweep(fleet, key)


#: A worker: lists src/ and writes a file there, reporting what it listed; then hangs. A
#: revived child's scripted model starts from its first turn again.
WORKER = """
turns:
  - steps:
      - tool: ls
        args: {path: src}
      - tool: write
        args: {path: src/written.txt, content: "written\\n"}
      - reply: "## Summary\\nsaw {{tool:ls}}"
  - steps:
      - hang: true
"""


def test_a_remote_worker_revived_after_its_node_was_lost_starts_from_its_snapshot(
    tmp_path: Path, cluster: Cluster
) -> None:
    """What a remote worker changed comes back only at its stop: lost with its node, it is not
    in the worktree, and the revived worker's new node gets the snapshot (its worktree, checked
    again); what it writes from then on comes back at its stop as for any remote worker."""
    first = cluster.add_node(num_cpus=1, resources={"agent_slot": 1})
    cluster.wait_for_nodes()
    env = {"FLEET_RAY_ADDRESS": cluster.address, "FLEET_SURFACE": "ray"}
    with running_fleet(tmp_path, env=env) as fleet:
        try:
            define(fleet, "worker", mode="worktree", tools=["read", "write", "ls"])
            model = fleet.script("worker", WORKER)
            fleet.json("spawn", "--agent", "worker", "--model", model, "write", timeout=180)
            [note] = fleet.json("wait", "a1", "--timeout", "150", timeout=180)["settled"]
            assert "app.py" in note["report"], note
            fleet.json("resume", "a1", "hang")
            _until(lambda: _state(fleet) == "working", 30, "the second turn never began")
            daemon = int((fleet.paths.root / "supervisor.lock").read_text().strip())
            os.kill(daemon, signal.SIGKILL)
            _until(lambda: not child_pids(fleet.home), 60, "the child outlived its supervisor")
            cluster.remove_node(first, allow_graceful=False)
            cluster.add_node(num_cpus=1, resources={"agent_slot": 1})
            cluster.wait_for_nodes()

            [lost] = fleet.json("peek", timeout=120)["stale"]
            assert (lost["state"], lost["revivable"]) == ("lost", True), lost
            fleet.json("resume", "a1", "write again", timeout=180)  # revives it first
            [note] = fleet.json("wait", "a1", "--timeout", "150", timeout=180)["settled"]
            # Its node's checkout was the snapshot: what it wrote before its node was lost is
            # not there.
            assert "app.py" in note["report"], note
            assert "written.txt" not in note["report"], note
            [handoff] = fleet.json("stop", "a1", timeout=150)["handoffs"]
            assert handoff["applied"] == ["src/written.txt"], json.dumps(handoff)
            assert (fleet.repo / "src" / "written.txt").read_text() == "written\n"
        finally:
            _sweep(fleet)
