"""The ray launcher on a real three-node ``ray.cluster_utils.Cluster`` (one machine)."""

import os
import sys
import time
from pathlib import Path

import attrs
import pytest
import ray  # the [ray] extra is part of [test]: absent, this fails (never skips)
import trio
from ray.cluster_utils import Cluster

from orchestrator.launch._launcher import LaunchSpec
from orchestrator.launch._ray import RayLauncher

pytestmark = pytest.mark.slow

SLOTS = (1, 1, 2)  # each simulated node's agent_slot count: 4 lanes in all


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    for slots in SLOTS:
        c.add_node(num_cpus=1, resources={"agent_slot": slots})
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def spec(tmp_path, code: str, key: str = "c1") -> LaunchSpec:
    return LaunchSpec(
        key=key,
        name="scout",
        argv=(sys.executable, "-c", code),
        cwd=str(tmp_path),
        env={"PATH": os.environ.get("PATH", "")},
    )


def sink_into(out: list[bytes]):
    return lambda _stream, chunk: out.append(chunk)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


async def gone(pid: int, within: float = 10.0) -> None:
    with trio.fail_after(within):
        while alive(pid):  # noqa: ASYNC110 - no event for another process's exit
            await trio.sleep(0.1)


async def test_children_spread_over_nodes_and_report(cluster, tmp_path):
    launcher = RayLauncher()
    out: list[bytes] = []
    async with trio.open_nursery() as nursery:
        runs = [
            await launcher.launch(
                spec(tmp_path, "import time; print('hi'); time.sleep(3)", f"c{i}"),
                sink_into(out),
                nursery,
            )
            for i in range(4)
        ]
        codes = [await r.wait() for r in runs]
    assert codes == [0, 0, 0, 0]
    # 4 children on 4 slots over 3 nodes: every node got at least one.
    assert len({r.node for r in runs}) == 3
    assert out.count(b"hi\n") == 4


async def test_lane_queues_and_never_fails(cluster, tmp_path):
    launcher = RayLauncher()
    marks = tmp_path / "marks"
    marks.mkdir()
    code = (
        "import time, os, sys; open(os.path.join(sys.argv[1], str(time.time())), 'w').close();"
        " time.sleep(4)"
    )
    async with trio.open_nursery() as nursery:
        t0 = time.monotonic()

        async def one(i: int, done: list[int]) -> None:
            s = spec(tmp_path, code, f"q{i}")
            s = LaunchSpec(key=s.key, name=s.name, argv=(*s.argv, str(marks)), cwd=s.cwd, env=s.env)
            r = await launcher.launch(s, lambda *_: None, nursery)
            done.append(await r.wait())

        done: list[int] = []
        for i in range(6):  # 6 children on 4 lanes: two must wait for a slot
            nursery.start_soon(one, i, done)
    wall = time.monotonic() - t0
    assert done == [0] * 6
    starts = sorted(float(p.name) for p in marks.iterdir())
    # The queued two started only once a first wave child ended (≥ ~4 s later).
    assert starts[-1] - starts[0] > 3.0
    assert wall > 7.0


async def test_stop_kills_the_whole_group_through_the_actor(cluster, tmp_path):
    launcher = RayLauncher()
    pidfile = tmp_path / "grandchild"
    code = (
        "import subprocess, sys, time;"
        f" p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        f" open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(600)"
    )
    async with trio.open_nursery() as nursery:
        r = await launcher.launch(spec(tmp_path, code), lambda *_: None, nursery)
        with trio.fail_after(60):
            while not pidfile.exists() or not pidfile.read_text():  # noqa: ASYNC110
                await trio.sleep(0.1)
        grandchild = int(pidfile.read_text())
        assert alive(r.pid)
        assert alive(grandchild)
        await r.terminate(grace=2.0)
        assert r.exited.is_set()
    assert r.returncode == -15
    await gone(grandchild)
    await gone(r.pid)


async def test_killed_actor_takes_its_child_with_it_and_its_node_directory_goes(cluster, tmp_path):
    launcher = RayLauncher(session="t")
    node = Path(await launcher.open_node("c1"))
    # What the child leaves there: a directory it made unwritable, with a file in it.
    code = (
        "import os, sys, time; d = sys.argv[1] + '/scratch/kept'; os.makedirs(d); "
        "open(d + '/f', 'w').write('x'); os.chmod(d, 0o500); print('ready', flush=True); "
        "time.sleep(600)"
    )
    child = attrs.evolve(spec(tmp_path, code), argv=(sys.executable, "-c", code, str(node)))
    async with trio.open_nursery() as nursery:
        r = await launcher.launch(child, lambda *_: None, nursery)
        assert r.node_dir == str(node)
        assert alive(r.pid)
        with trio.fail_after(30):
            while not await trio.Path(node / "scratch" / "kept" / "f").exists():  # noqa: ASYNC110
                await trio.sleep(0.05)
        # Behind the launcher's back (as an OOM kill would): PR_SET_PDEATHSIG reaps the child,
        # and with the actor gone a task on its node removes the node directory.
        ray.kill(r.actor, no_restart=True)
        with trio.fail_after(60):
            await r.wait()
    assert r.returncode is not None
    assert r.returncode < 0
    await gone(r.pid)
    assert not await trio.Path(node).exists()


async def test_a_dead_node_fails_its_child_once_and_leaves_no_process(cluster, tmp_path):
    doomed = cluster.add_node(num_cpus=1, resources={"agent_slot": 1, "doomed": 1})
    cluster.wait_for_nodes()
    launcher = RayLauncher(resources={"doomed": 1})
    async with trio.open_nursery() as nursery:
        r = await launcher.launch(
            spec(tmp_path, "import time; time.sleep(600)"), lambda *_: None, nursery
        )
        assert r.node == doomed.node_id
        assert alive(r.pid)
        # The node's raylet dies mid-turn (no graceful drain): its workers go, and with them
        # the child (PR_SET_PDEATHSIG on the actor's worker).
        await trio.to_thread.run_sync(lambda: cluster.remove_node(doomed, allow_graceful=False))
        with trio.fail_after(90):
            code = await r.wait()
    assert code < 0
    await gone(r.pid, within=30)
    # The surviving nodes' lanes are unaffected: a new child still runs.
    async with trio.open_nursery() as nursery:
        again = await RayLauncher().launch(spec(tmp_path, "pass", "c2"), lambda *_: None, nursery)
        assert await again.wait() == 0
    assert again.node != doomed.node_id
