"""Scouts through a supervisor on a Ray cluster against the same through a local one, in one run.

The headline (#34): N scouts spawned at once through an embedded supervisor (its cap widened to
N; the product caps live children at 16), each a real child (``python -I -m child``, builtin
backend, a scripted model: read the workspace's README, report), unsandboxed on both sides so
that both are forks of a preloaded fork server: locally the session's, on the cluster its node
host's (``ray_node_host``, four simulated nodes of ``ray.cluster_utils.Cluster``, 16
``agent_slot`` each). Wall from the spawn call to every child reaped after its report, the ratio
of the two per repetition (alternated; the median), and the p50 of spawn call → the child's
authenticated hello (``--sandboxed``: every child sandboxed on both sides instead, the product's
default; forks of the sandboxed fork servers). A warm-up fleet (one scout a node) first starts
the fork servers and the node hosts, as a running session has them. Memory: with 16 idle scouts
placed, a child's USS (what it costs beyond the process it was forked from) and, remote, the
node hosts' and their fork servers' RSS shared over their children. CPU a child: the whole
machine's busy time over a fleet (every process, on the same cores: four simulated nodes share
the baseline's CPUs) and the supervisor's own, each over the fleet's children (the supervisor's
part is what a real cluster still pays on the supervisor's machine), with the children's own
(reaped by their fork servers) and the node hosts' (with the Git they run) apart.

Then the channel a remote child speaks: authenticated ``ipc`` round trips over the TLS door
against the same over the session's Unix socket, in one process and across processes
(``benchmarks/door_roundtrips.py``, which says how). ``--launcher`` adds the launcher alone
(``python -c`` children started by the ``ProcessLauncher`` against the ray launcher, an actor
per child and a host per node). Last line: one JSON object.

    .venv/bin/python benchmarks/ray_fleet.py [N] [--reps R] [--sandboxed] [--smoke]
        [--launcher [--host]]
"""

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import psutil
import ray
import trio
from ray.cluster_utils import Cluster

from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.core._capacity import Capacity
from orchestrator.core._supervisor import Supervisor, open_supervisor
from orchestrator.launch._launcher import LaunchSpec, ProcessLauncher
from orchestrator.launch._ray import RayLauncher
from orchestrator.launch._ray_forks import LABEL

CODE = "print('scout done')"
#: Seconds a fleet may take before the benchmark gives up on it.
CEILING = 600.0


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


SLEEPER = "import time; time.sleep(60)"


async def remote_memory(k: int, hosted: bool) -> tuple[float, float]:
    """Mean RSS (MB) a remote child costs with *k* idle children placed: the child's own, and
    its share of its actor's worker (an actor per child) or of its node's host (``node_host``)."""

    def rss(pid: int) -> float:
        return psutil.Process(pid).memory_info().rss / 2**20

    launcher = RayLauncher(node_host=hosted)
    async with trio.open_nursery() as nursery:
        launched = []
        for i in range(k):
            sleeper = attrs.evolve(spec(i), argv=(sys.executable, "-c", SLEEPER))
            launched.append(await launcher.launch(sleeper, lambda *_: None, nursery))
        await trio.sleep(1.0)
        workers = {r.actor_pid for r in launched}
        own = statistics.mean(rss(r.pid) for r in launched)
        share = sum(rss(pid) for pid in workers) / len(launched)
        for r in launched:
            await r.terminate(1.0)
    return own, share


# -- through the supervisor ---------------------------------------------------------------------

#: A scout's one turn: read the workspace's README, then report.
SCOUT = {
    "turns": [
        {
            "steps": [
                {"tool": "read", "args": {"path": "README.md"}},
                {"reply": "## Summary\nscout read: {{tool:read}}"},
            ]
        }
    ]
}
#: A scout that stays (for memory): it hangs in its first turn until stopped.
IDLE = {"turns": [{"steps": [{"hang": True}]}]}
README = "fleet ray benchmark workspace\n"


@attrs.frozen(kw_only=True)
class FleetRun:
    """One fleet of scouts through a supervisor: spawn call → every child reaped after its
    report; each child's spawn call → its authenticated hello; how many were forks."""

    wall: float
    hello_s: list[float]
    forked: int
    sandboxed: int = 0
    #: CPU seconds over the fleet: the whole machine's (every process: the supervisor, the
    #: children, the node hosts, Ray's own) and the supervisor's process alone.
    cpu_machine: float = 0.0
    cpu_supervisor: float = 0.0
    #: The children's own (reaped by their fork servers, here or on the nodes) and the node
    #: hosts' (with what they reaped: Git); the rest of the machine's is Ray's and the system's.
    cpu_children: float = 0.0
    cpu_hosts: float = 0.0


def _machine_cpu() -> float:
    """CPU seconds the whole machine has been busy (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def _group_cpu() -> tuple[float, float]:
    """CPU seconds so far of every fork server's reaped children (the fleet's children, here
    and on the nodes) and of the node hosts (their own and their reaped Git)."""
    children = hosts = 0.0
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or ())
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        if "child._forkserver" in command:
            children += times.children_user + times.children_system
        elif "NodeHost" in command:
            hosts += times.user + times.system + times.children_user + times.children_system
    return children, hosts


def make_workspace(base: Path, megabytes: int = 0) -> tuple[Path, Path, Path]:
    """A git repository with a README (and *megabytes* of incompressible data beside it), and
    the two scripted models."""
    repo = base / "repo"
    repo.mkdir()
    (repo / "README.md").write_text(README)
    if megabytes:
        (repo / "data.bin").write_bytes(os.urandom(megabytes * 1024 * 1024))
    git = ["git", "-C", str(repo), "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "workspace"], check=True)
    scout, idle = base / "scout.yaml", base / "idle.yaml"
    scout.write_text(json.dumps(SCOUT))  # JSON is YAML
    idle.write_text(json.dumps(IDLE))
    return repo, scout, idle


def fleet_config(
    base: Path, repo: Path, session: str, address: str, *, sandboxed: bool = False
) -> Config:
    return Config(
        home=base / "state",
        session=session,
        workspace=repo,
        sandbox="auto" if sandboxed else "off",
        allow_unsandboxed=not sandboxed,
        lane=64,
        max_subagents=16,
        ray_address=address,
        ray_node_host=True,
    )


def scouts(script: Path, n: int, surface: str) -> list[SpawnRequest]:
    return [
        SpawnRequest(
            task=f"scout {i}: read the README and report.",
            agent="scout",
            name=f"scout{i:02d}",
            model=f"scripted:{script}",
            surface=surface,
        )
        for i in range(n)
    ]


async def _hello(sup: Supervisor, key: str, started: float, into: list[float]) -> None:
    """The child's hello, waited for without polling (a poll every 50 ms cost the supervisor
    more the longer a hello took: the remote side's share of it was the benchmark's)."""
    run = sup.runs[key]

    async def first(event: trio.Event, nursery: trio.Nursery) -> None:
        await event.wait()
        nursery.cancel_scope.cancel()

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first, run.connected, nursery)
            nursery.start_soon(first, run.done, nursery)
    if not run.connected.is_set():
        raise RuntimeError(f"{key} ended before its hello: {sup.all_records()[key].error}")
    into.append(time.perf_counter() - started)


async def run_fleet(sup: Supervisor, script: Path, n: int, surface: str) -> FleetRun:
    """Spawn *n* scouts at once on *sup*, wait for every report, stop them all."""
    hellos: list[float] = []
    children, hosts = _group_cpu()  # before the clocks start: its own cost is not counted
    machine, own = _machine_cpu(), _own_cpu()
    started = time.perf_counter()
    records = await sup.spawn(scouts(script, n, surface))
    keys = [r.key for r in records]
    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(_hello, sup, key, started, hellos)
    forked = sum(1 for key in keys if getattr(sup.runs[key].launched, "forked", False))
    sandboxed = sum(1 for key in keys if sup.runs[key].record.sandboxed)
    await sup.wait(keys, every=True)
    handoffs = await sup.stop(keys)
    wall = time.perf_counter() - started
    machine, own = _machine_cpu() - machine, _own_cpu() - own
    now_children, now_hosts = _group_cpu()
    children, hosts = now_children - children, now_hosts - hosts
    for handoff in handoffs:
        if handoff["state"] != "stopped" or README.strip() not in handoff["last"]:
            raise RuntimeError(f"a scout did not report: {handoff}")
    return FleetRun(
        wall=wall,
        hello_s=hellos,
        forked=forked,
        sandboxed=sandboxed,
        cpu_machine=machine,
        cpu_supervisor=own,
        cpu_children=children,
        cpu_hosts=hosts,
    )


def _uss(pid: int) -> float:
    return psutil.Process(pid).memory_full_info().uss / 2**20


def _tree_rss(pid: int) -> float:
    """RSS (MB) of *pid* and of its fork servers (its children labelled as such)."""
    process = psutil.Process(pid)
    total = process.memory_info().rss
    for child in process.children():
        with contextlib.suppress(psutil.Error):
            if LABEL in " ".join(child.cmdline()):
                total += child.memory_info().rss
    return total / 2**20


async def idle_memory(sup: Supervisor, script: Path, k: int, surface: str) -> tuple[float, float]:
    """With *k* idle scouts placed: the mean USS of a child (what it costs beyond the process it
    was forked from) and, for remote children, its share of its node's host and fork servers."""
    records = await sup.spawn(scouts(script, k, surface))
    keys = [r.key for r in records]
    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(_hello, sup, key, time.perf_counter(), [])
    await trio.sleep(1.0)
    launched = [sup.runs[key].launched for key in keys]
    own = statistics.mean(_uss(r.pid) for r in launched)  # type: ignore[union-attr]
    hosts = {getattr(r, "actor_pid", 0) for r in launched} - {0}
    share = sum(_tree_rss(pid) for pid in hosts) / k if hosts else 0.0
    await sup.stop(keys)
    return own, share


async def fleets(
    base: Path,
    address: str,
    n: int,
    nodes: int,
    reps: int,
    *,
    sandboxed: bool = False,
    workspace_mb: int = 0,
) -> dict[str, Any]:
    """*n* scouts through a local supervisor against the same on the cluster, alternated
    (*sandboxed*: every child in its sandbox, the product's default, on both sides;
    *workspace_mb*: the workspace's size beyond its README)."""
    repo, scout, idle = make_workspace(base, workspace_mb)
    runs: dict[str, list[FleetRun]] = {"process": [], "ray": []}
    memory: dict[str, tuple[float, float]] = {}
    for rep in range(reps):
        order = ("process", "ray") if rep % 2 == 0 else ("ray", "process")
        for surface in order:
            config = fleet_config(base, repo, f"{surface}{rep}", address, sandboxed=sandboxed)
            async with open_supervisor(config) as sup:
                sup.capacity = Capacity(
                    cap=max(n, 4 * nodes)
                )  # benchmark-only: a fleet over the product's cap
                await run_fleet(sup, scout, nodes, surface)  # warm: fork servers, node hosts
                runs[surface].append(await run_fleet(sup, scout, n, surface))
                if rep == 0:
                    memory[surface] = await idle_memory(sup, idle, 4 * nodes, surface)
            print(
                f"rep {rep + 1}/{reps}, {surface}: {n} scouts {runs[surface][-1].wall:.2f} s",
                flush=True,
            )
    return {"runs": runs, "memory": memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int, nargs="?", default=64, help="scouts (default 64)")
    parser.add_argument("--reps", type=int, default=3, help="fleets each way (default 3)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run that checks the script works (its figures mean nothing)",
    )
    parser.add_argument(
        "--launcher",
        action="store_true",
        help="also the launcher alone: python -c children, an actor each and a host a node",
    )
    parser.add_argument(
        "--host", action="store_true", help="with --launcher: the node host alone (no actors)"
    )
    parser.add_argument(
        "--sandboxed",
        action="store_true",
        help="every child sandboxed on both sides (the default path; forks of sandboxed servers)",
    )
    parser.add_argument(
        "--workspace-mb",
        type=int,
        default=0,
        metavar="M",
        help="M MB of incompressible data in the workspace the scouts read (default 0)",
    )
    args = parser.parse_args()
    smoke = args.smoke
    # --smoke: 2 scouts on one node, each path once (a quick check that every path still runs).
    n, reps = (2, 1) if smoke else (args.n, args.reps)
    nodes, slots = (1, 4) if smoke else (4, 16)
    # A runtime root of the run's own (the nodes inherit it): every sandbox hides every fleet
    # home registered on the machine, and a box that runs test suites has dozens (89 once:
    # 5.9 ms to look up, and a mount each in every sandboxed child's view, on both sides).
    runtime = os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="fleet-bench-run-")
    base = Path(tempfile.mkdtemp(prefix="fleet-bench-ray-"))
    cluster = Cluster()
    for _ in range(nodes):
        cluster.add_node(num_cpus=1, resources={"agent_slot": slots})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    result: dict[str, Any] = {}
    try:
        measured = trio.run(
            functools.partial(fleets, sandboxed=args.sandboxed, workspace_mb=args.workspace_mb),
            base,
            cluster.address,
            n,
            nodes,
            reps,
        )
        result |= report_fleets(measured, n, nodes)
        if args.launcher or smoke:
            result |= launcher_level(n, nodes, smoke=smoke, host_only=args.host or smoke)
    finally:
        ray.shutdown()
        cluster.shutdown()
        # Its fleets' homes and its runtime root (each run left both behind: 58 on this box).
        for leftover in (base, Path(runtime)):
            shutil.rmtree(leftover, ignore_errors=True)
    # The channel a remote child speaks: benchmarks/door_roundtrips.py, in a process of its
    # own (no Ray driver's threads beside it), both layouts; its lines, then its figures.
    roundtrips = door_roundtrips(smoke=smoke)
    print(
        json.dumps(
            {
                "benchmark": "ray_fleet",
                **roundtrips,
                "n": n,
                "nodes": nodes,
                **result,
            }
        )
    )


def door_roundtrips(*, smoke: bool) -> dict[str, Any]:
    """``benchmarks/door_roundtrips.py``'s figures (its report lines printed as they come)."""
    script = Path(__file__).resolve().parent / "door_roundtrips.py"
    done = subprocess.run(
        [sys.executable, str(script), *(["--smoke"] if smoke else [])],
        check=True,
        capture_output=True,
        text=True,
    )
    *lines, last = done.stdout.strip().splitlines()
    for line in lines:
        print(line)
    figures: dict[str, Any] = json.loads(last)
    del figures["benchmark"]
    return figures


def report_fleets(measured: dict[str, Any], n: int, nodes: int) -> dict[str, Any]:
    """Print and return the through-the-supervisor figures."""
    local, remote = measured["runs"]["process"], measured["runs"]["ray"]
    ratios = [there.wall / here.wall for here, there in zip(local, remote, strict=True)]
    local_wall = statistics.median(run.wall for run in local)
    remote_wall = statistics.median(run.wall for run in remote)
    local_p50 = statistics.median(statistics.median(r.hello_s) for r in local)
    remote_p50 = statistics.median(statistics.median(r.hello_s) for r in remote)
    own_local, _ = measured["memory"]["process"]
    own, share = measured["memory"]["ray"]
    forked = min(r.forked for r in remote)
    sandboxed = min(r.sandboxed for r in (*local, *remote))
    print(
        f"{n} scouts through the supervisor: local {local_wall:.2f} s, "
        f"on {nodes} Ray nodes {remote_wall:.2f} s: "
        f"ratio {statistics.median(ratios):.2f} (runs {', '.join(f'{x:.2f}' for x in ratios)}); "
        f"spawn->hello p50 local {local_p50 * 1000:.0f} ms, remote {remote_p50 * 1000:.0f} ms; "
        f"{forked}/{n} remote children forked, {sandboxed}/{n} sandboxed on each side"
    )
    # CPU per child (ms): the machine's (everything, on the same cores) and the supervisor's.
    cpu = {
        f"{side}_{what}": round(
            statistics.median(getattr(r, f"cpu_{what}") for r in runs) / n * 1000, 1
        )
        for side, runs in (("local", local), ("ray", remote))
        for what in ("machine", "supervisor", "children", "hosts")
    }
    print(
        f"CPU a child: local {cpu['local_machine']:.1f} ms in all "
        f"({cpu['local_supervisor']:.1f} ms of the supervisor, {cpu['local_children']:.1f} ms "
        f"its own), ray {cpu['ray_machine']:.1f} ms in all ({cpu['ray_supervisor']:.1f} ms of "
        f"the supervisor, {cpu['ray_children']:.1f} ms its own, {cpu['ray_hosts']:.1f} ms its "
        f"node host's; the rest Ray's and the system's, on the same cores)"
    )
    print(
        f"memory per idle scout: local {own_local:.1f} MB USS; remote {own:.1f} MB USS beyond "
        f"its node host, whose host and fork servers come to {share:.1f} MB RSS a child"
    )
    return {
        "fleet_wall_ratio": round(statistics.median(ratios), 2),
        "fleet_wall_ratios": [round(x, 2) for x in ratios],
        "fleet_local_wall_s": round(local_wall, 3),
        "fleet_ray_wall_s": round(remote_wall, 3),
        "fleet_local_hello_p50_ms": round(local_p50 * 1000, 1),
        "fleet_ray_hello_p50_ms": round(remote_p50 * 1000, 1),
        "fleet_ray_forked": forked,
        "fleet_sandboxed": sandboxed,
        **{f"cpu_per_child_ms_{key}": value for key, value in cpu.items()},
        "local_child_uss_mb": round(own_local, 1),
        "ray_child_uss_mb": round(own, 1),
        "ray_host_share_rss_mb": round(share, 1),
    }


def launcher_level(n: int, nodes: int, *, smoke: bool, host_only: bool) -> dict[str, Any]:
    """The launcher alone: *n* ``python -c`` children, local against each Ray mode."""
    local_wall, local_p50 = trio.run(run, ProcessLauncher(), n)
    print(f"{n} scouts local: wall {local_wall:.2f}s, launch p50 {local_p50 * 1000:.1f} ms")
    result: dict[str, Any] = {
        "local_wall_s": round(local_wall, 3),
        "local_launch_p50_ms": round(local_p50 * 1000, 1),
    }
    modes = (("actor", False), ("host", True))
    for mode, hosted in modes[1:] if host_only else modes:
        trio.run(run, RayLauncher(node_host=hosted), nodes)  # warm imports (and hosts)
        wall, p50 = trio.run(run, RayLauncher(node_host=hosted), n)
        # Four idle children a node: a host's share is over four.
        own, share = trio.run(remote_memory, (1 if smoke else 4) * nodes, hosted)
        mb = own + share
        result |= {
            f"{mode}_wall_s": round(wall, 3),
            f"{mode}_wall_ratio": round(wall / local_wall, 2),
            f"{mode}_launch_p50_ms": round(p50 * 1000, 1),
            f"{mode}_child_rss_mb": round(mb, 1),
            f"{mode}_child_own_rss_mb": round(own, 1),
        }
        print(
            f"{n} scouts ray, {mode} ({nodes} nodes): wall {wall:.2f}s "
            f"({wall / local_wall:.2f}x local), launch p50 {p50 * 1000:.1f} ms, "
            f"{mb:.1f} MB RSS per remote child ({own:.1f} own, {share:.1f} worker share)"
        )
    return result


if __name__ == "__main__":
    main()
