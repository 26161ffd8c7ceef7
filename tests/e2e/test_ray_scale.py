"""64 scouts at once through one supervisor on a simulated four-node Ray cluster.

The product caps a session's live children at 16 (``max_subagents``); a cluster is where a
fleet outgrows that, so the test widens the cap as ``benchmarks/ray_fleet.py`` does. Each
scout is sandboxed on its node, a fork of its node host's sandboxed fork server, dials back
over the TLS door, reads the workspace and reports. Past 40 remote children every blocking Ray
call of the supervisor used to wait for a thread that never freed: each child's exit watch held
one of trio's 40 default threads for the child's life, and the 41st child never launched.
"""

import collections
import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import ray
import trio
from ray.cluster_utils import Cluster

from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.core._capacity import Capacity
from orchestrator.core._supervisor import open_supervisor
from orchestrator.launch._ray_launched import LaunchedRay

pytestmark = pytest.mark.slow

SCOUTS = 64
NODES = 4
README = "the workspace every scout reads\n"
SCOUT = {
    "turns": [
        {
            "steps": [
                {"tool": "read", "args": {"path": "README.md"}},
                {"reply": "## Summary\n{{tool:read}}"},
            ]
        }
    ]
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    for _ in range(NODES):
        c.add_node(num_cpus=1, resources={"agent_slot": SCOUTS // NODES})
    yield c
    c.shutdown()


def workspace(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text(README)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "w"]):
        subprocess.run([*git, *args], check=True)
    script = tmp_path / "scout.yaml"
    script.write_text(json.dumps(SCOUT))
    return repo, script


def left_on_nodes(dirs: list[str]) -> list[str]:
    """Node directories still there, and processes still working in one."""
    found = [d for d in dirs if Path(d).exists()]
    for process in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            cwd = process.cwd()
            found += [f"pid {process.pid} in {d}" for d in dirs if cwd.startswith(d)]
    return found


async def test_64_scouts_on_four_nodes_all_report_as_forks_spread_over_every_node(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    repo, script = workspace(tmp_path)
    fetched: list[str] = []  # contexts fetched from a node: none, each came with its Settled
    fetch = LaunchedRay.context

    async def counted(self: LaunchedRay, backend: str, resume: str) -> object:
        fetched.append(backend)
        return await fetch(self, backend, resume)

    monkeypatch.setattr(LaunchedRay, "context", counted)
    config = Config(
        home=tmp_path / "state",
        session="s",
        workspace=repo,
        lane=SCOUTS,
        max_subagents=16,
        ray_address=cluster.address,
    )
    requests = [
        SpawnRequest(
            task=f"scout {i}: read the README",
            agent="scout",
            name=f"scout{i:02d}",
            model=f"scripted:{script}",
            surface="ray",
        )
        for i in range(SCOUTS)
    ]
    try:
        async with open_supervisor(config) as sup:
            sup.capacity = Capacity(cap=SCOUTS)  # past the product's cap, as a cluster is for
            keys = [record.key for record in await sup.spawn(requests)]
            runs = [sup.runs[key] for key in keys]
            with trio.move_on_after(120):
                await sup.wait(keys, every=True)
            records = sup.all_records()
            unsettled = {k: (records[k].state, records[k].error) for k in keys}
            unsettled = {k: v for k, v in unsettled.items() if v[0] != "idle"}
            # Each one's transcript is kept here before its turn settled (a revive needs it).
            places = [config.paths.scratch / key / "transcript.json" for key in keys]
            kept = [path.read_text() for path in places if path.exists()]
            handoffs = await sup.stop(keys)
            launched = [run.launched for run in runs]
    finally:
        ray.shutdown()  # the supervisor joined the cluster from this process
    assert unsettled == {}
    assert all(isinstance(one, LaunchedRay) for one in launched)
    remote = [one for one in launched if isinstance(one, LaunchedRay)]
    failed = [h for h in handoffs if h["state"] != "stopped" or README.strip() not in h["last"]]
    assert failed == []
    assert all(one.forked and one.sandboxed for one in remote)
    per_node = collections.Counter(one.node for one in remote)
    assert sorted(per_node.values()) == [SCOUTS // NODES] * NODES  # spread: every slot used
    assert len({one.actor_pid for one in remote}) == NODES  # one host a node
    assert left_on_nodes([one.node_dir for one in remote]) == []
    assert fetched == []
    assert len(kept) == SCOUTS
    assert all(README.strip() in text for text in kept)
