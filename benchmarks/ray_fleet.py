"""Children under the ray launcher against the local process launcher, in one run.

N plain children (``python -c pass``-sized scouts: start, print, exit) over 4 simulated Ray nodes
(``ray.cluster_utils.Cluster``, 16 ``agent_slot`` each), against the same N on the local
``ProcessLauncher``: total wall, and launch→running p50 (``launch()`` returning, i.e. the child's
pid known). Launcher-level: it measures placement + actor + process cost, not the fleet's IPC.
Last line: one JSON object.

    .venv/bin/python benchmarks/ray_fleet.py [N]
"""

import json
import statistics
import sys
import tempfile
import time

import ray
import trio
from ray.cluster_utils import Cluster

from orchestrator.launch._launcher import LaunchSpec, ProcessLauncher
from orchestrator.launch._ray import RayLauncher

CODE = "print('scout done')"


def spec(i: int) -> LaunchSpec:
    return LaunchSpec(
        key=f"a{i}",
        name="scout",
        argv=(sys.executable, "-c", CODE),
        cwd=tempfile.gettempdir(),
        env={},
    )


async def run(launcher: object, n: int) -> tuple[float, float]:
    starts: list[float] = []
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:

        async def one(i: int) -> None:
            t = time.perf_counter()
            r = await launcher.launch(spec(i), lambda *_: None, nursery)  # type: ignore[attr-defined]
            starts.append(time.perf_counter() - t)
            assert await r.wait() == 0

        for i in range(n):
            nursery.start_soon(one, i)
    return time.perf_counter() - t0, statistics.median(starts)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    local_wall, local_p50 = trio.run(run, ProcessLauncher(), n)
    cluster = Cluster()
    for _ in range(4):
        cluster.add_node(num_cpus=1, resources={"agent_slot": 16})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        trio.run(run, RayLauncher(), 4)  # warm the workers' imports once
        ray_wall, ray_p50 = trio.run(run, RayLauncher(), n)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"{n} scouts local: wall {local_wall:.2f}s, launch p50 {local_p50 * 1000:.1f} ms")
    print(f"{n} scouts ray (4 nodes): wall {ray_wall:.2f}s, launch p50 {ray_p50 * 1000:.1f} ms")
    print(
        json.dumps(
            {
                "n": n,
                "local_wall_s": round(local_wall, 3),
                "ray_wall_s": round(ray_wall, 3),
                "wall_ratio": round(ray_wall / local_wall, 2),
                "local_launch_p50_ms": round(local_p50 * 1000, 1),
                "ray_launch_p50_ms": round(ray_p50 * 1000, 1),
                "launch_p50_ratio": round(ray_p50 / local_p50, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
