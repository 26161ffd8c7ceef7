"""Fleet overhead: 32 scripted children through the supervisor vs the same work without it.

Two figures, each a ratio against a baseline measured in the same run (DESIGN.md §12):

* ``wall_ratio``: 32 builtin children, each a scripted model whose one turn makes 20 ``read``
  tool calls on its own 20 files of a generated repository and then replies, run through an
  embedded supervisor with a lane of 8 — divided by 32 plain ``python -I -c`` subprocesses,
  8 at a time and with no IPC, that read the same 20 files each and print a report. The fleet
  wall runs from the ``spawn`` call until every child is reaped after ``stop``, on a
  supervisor that is already running (as ``fleet serve`` is for a whole session) with its fork
  server preloaded; that start-up is printed apart. The baseline wall runs from the first
  start to the last exit. The product caps a fleet at 16 (``max_subagents``), so the benchmark
  swaps in a 32-slot :class:`~orchestrator.core._capacity.Capacity` after ``open_supervisor``; the
  cap rule itself is unchanged.
* ``spawn_ratio``: spawn→hello p50 — from the ``Supervisor.spawn`` call until the supervisor
  has accepted the child's authenticated hello (``run.connected``), one child at a time on an
  idle supervisor — divided by the p50 of ``python -c pass`` timed interleaved with it.

Printed before the last line, to say what bounds those: the fleet wall against the same 32
children's *agent* work run as fresh interpreters without a supervisor (the builtin agent
loop, scripted model and tools in-process, no IPC, all 32 processes at once as the fleet
starts them); the CPU seconds each side burnt (children — forked children through the fork
server's own accounting — and this process); Popen→hello (launch→hello for a fork); and the
start-up floors of the interpreter, of ``import trio`` and of the child's import set before its
hello, which a forked child does not pay.

Children run unsandboxed (``sandbox="off"``, ``allow_unsandboxed``), so they are forks of the
fork server and both sides do the same work. ``--sandboxed`` adds the default path, every child
sandboxed, against the same bwrap command. A sandboxed child is a fork of the session's
sandboxed fork server that builds its own bwrap view (docs/sandbox.md); the figures say how
many were forked (a child the server cannot fork starts under its bwrap command line):

* ``sandboxed_wall_ratio``: the same 32 children sandboxed, divided by the 32 plain processes
  each run under the very bwrap command line the supervisor used for a child (its recorded
  argv, the child command swapped for the plain script);
* ``sandboxed_spawn_ratio``: sandboxed spawn→hello p50 divided by the p50 of that bwrap
  command running ``python -c pass``, timed interleaved with it.

Bytecode caches of our packages are refreshed first (``compileall``): with
``PYTHONDONTWRITEBYTECODE`` set and a stale cache, every child would recompile. Run::

    .venv/bin/python benchmarks/fleet_overhead.py                  # 3 repetitions, medians
    .venv/bin/python benchmarks/fleet_overhead.py --reps 5 --spawns 40 --sandboxed

The last line is one JSON object.
"""

import argparse
import compileall
import itertools
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import psutil
import trio

import ipc
from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.core._capacity import Capacity
from orchestrator.core._supervisor import Supervisor, open_supervisor
from orchestrator.launch._launcher import LaunchedProcess, LaunchSpec, OutputSink, ProcessLauncher

CHILDREN = 32
FILES = 20
LANE = 8
LINES = 120
TARGET_WALL = 1.25
TARGET_SPAWN = 10
CEILING = 900.0
SPAWN_CEILING = 60.0
PACKAGES = ("ipc", "child", "orchestrator", "sandbox")
BWRAP_FLOOR = "bwrap <same flags> python -c pass"
TARGET_SANDBOXED_WALL = 1.25
TARGET_SANDBOXED_SPAWN = 3

# The baseline process: read the same 20 files and print a report like the child's.
PLAIN_SCRIPT = """
import sys
lines = 0
for path in sys.argv[2:]:
    with open(path, encoding="utf-8") as handle:
        lines += sum(1 for _ in handle)
print(f"## Summary\\nRead {len(sys.argv) - 2} modules of {sys.argv[1]} ({lines} lines).")
"""

# The child's agent work without the supervisor: the builtin agent loop with the same scripted
# model and tools, in-process; events go nowhere and there is no IPC. It leaves the way a child
# does (child/__main__.py), without the interpreter's teardown.
SOLO_SCRIPT = """
import os, sys
import trio
import ipc
from child.backends.builtin import BuiltinBackend

class Host:
    def emit(self, event):
        pass

    async def ownership(self, paths):
        return "read-only"

    async def check_tool(self, start):
        return None  # no loop gate without a supervisor: every call runs

script, workspace = sys.argv[1:]
loadout = ipc.Loadout(
    session="solo", owner="a1", name="solo", agent="scout", token="0" * 64,
    socket="/nonexistent", workspace=workspace, scratch=workspace,
    model=ipc.ModelSpec(kind="scripted", script=script),
    tools=["read", "grep", "find", "ls", "todo", "ask_parent"], system_prompt="You are a scout.",
)

async def main():
    os.chdir(workspace)
    backend = BuiltinBackend.from_loadout(loadout, Host())
    result = await backend.run_turn("Read the modules and report.")
    await backend.aclose()
    return result.text

print(trio.run(main), flush=True)
os._exit(0)
"""

# Start-up floors: what any child pays before it can say hello. The import floors leave with
# os._exit, as a child does, so the interpreter's teardown is not counted.
FLOORS = {
    "python -c pass": ["-c", "pass"],
    "import trio": ["-I", "-c", "import os, trio; os._exit(0)"],
    "child import set before hello": ["-I", "-c", "import os, child._runtime; os._exit(0)"],
}


@attrs.frozen(kw_only=True)
class Cost:
    """Wall seconds, and CPU seconds of this process and of its reaped children."""

    wall: float
    own_cpu: float
    children_cpu: float

    @property
    def cpu(self) -> float:
        return self.own_cpu + self.children_cpu


def _cpu(forks: psutil.Process | None = None) -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = children.ru_utime + children.ru_stime
    if forks is not None:
        # Forked children are the fork server's: their CPU reaches our rusage only when the
        # server itself is reaped, so it is read from the server (itself and its reaped).
        times = forks.cpu_times()
        spent += times.user + times.system + times.children_user + times.children_system
    return own.ru_utime + own.ru_stime, spent


async def measure(work: Callable[[], Awaitable[None]], forks: psutil.Process | None = None) -> Cost:
    own, children = _cpu(forks)
    started = time.perf_counter()
    await work()
    wall = time.perf_counter() - started
    own_after, children_after = _cpu(forks)
    return Cost(wall=wall, own_cpu=own_after - own, children_cpu=children_after - children)


# -- the workload -------------------------------------------------------------------------------


def make_repo(root: Path) -> list[list[str]]:
    """``CHILDREN`` packages of ``FILES`` modules each; every child's list of files."""
    listing = []
    for package in range(CHILDREN):
        (root / f"pkg{package:02d}").mkdir(parents=True)
        files = []
        for module in range(FILES):
            name = f"pkg{package:02d}/mod{module:02d}.py"
            body = "".join(
                f"def f{line}(x: int) -> int:  # {name} line {line}\n    return x + {line}\n"
                for line in range(LINES // 2)
            )
            (root / name).write_text(f'"""Module {module} of package {package}."""\n\n{body}')
            files.append(name)
        listing.append(files)
    return listing


def write_scripts(directory: Path, listing: list[list[str]]) -> list[Path]:
    """One scripted model per child: 20 ``read`` steps, then the report."""
    directory.mkdir()
    scripts = []
    for index, files in enumerate(listing):
        steps: list[dict[str, Any]] = [{"tool": "read", "args": {"path": f}} for f in files]
        steps.append({"reply": f"## Summary\nRead {len(files)} modules of pkg{index:02d}.\n"})
        path = directory / f"child{index:02d}.yaml"
        path.write_text(json.dumps({"turns": [{"steps": steps}]}))  # JSON is YAML
        scripts.append(path)
    return scripts


def bench_config(base: Path, repo: Path, session: str, *, sandbox: str = "off") -> Config:
    return Config(
        home=base / "state",
        session=session,
        workspace=repo,
        sandbox=sandbox,
        allow_unsandboxed=sandbox == "off",
        lane=LANE,
        max_subagents=16,
    )


def widen(sup: Supervisor, cap: int) -> None:
    """Benchmark-only: a fleet larger than the product's largest cap (16)."""
    sup.capacity = Capacity(cap=cap)


def requests(scripts: Sequence[Path]) -> list[SpawnRequest]:
    return [
        SpawnRequest(
            task=f"Read the modules of pkg{index:02d} and report.",
            agent="scout",
            name=f"bench{index:02d}",
            model=f"scripted:{script}",
        )
        for index, script in enumerate(scripts)
    ]


def reported(index: int, text: str) -> bool:
    return f"Read {FILES} modules of pkg{index:02d}" in text


async def warm_supervisor(sup: Supervisor) -> float:
    """Seconds until the supervisor can start children: its fork server preloaded.

    A session's supervisor (``fleet serve``) starts once and serves every fleet after; this
    start-up is its own, not the fleet's, and is printed apart.
    """
    started = time.perf_counter()
    for forks in (sup.fork_server, sup.boxed_fork_server):
        if forks is not None and (forks.sandboxed or sup.config.sandbox == "off"):
            forks.start()
            if not await forks.ready():
                raise RuntimeError(f"fork server failed: {forks.failure}")
    return time.perf_counter() - started


async def run_fleet(
    base: Path,
    repo: Path,
    scripts: Sequence[Path],
    session: str,
    startups: list[float],
    *,
    sandbox: str = "off",
    argvs: dict[str, tuple[str, ...]] | None = None,
) -> Cost:
    """On a running supervisor: spawn every child, wait for every report, stop them all
    (every child reaped); check every handoff. The cost runs from the spawn call. *argvs*
    collects each child's launch argv."""
    handoffs: list[dict[str, Any]] = []

    async def fleet(sup: Supervisor) -> None:
        records = await sup.spawn(requests(scripts))
        keys = [r.key for r in records]
        await sup.wait(keys, every=True)
        handoffs.extend(await sup.stop(keys))

    async with open_supervisor(bench_config(base, repo, session, sandbox=sandbox)) as sup:
        widen(sup, len(scripts))
        startups.append(await warm_supervisor(sup))
        launcher = TimedLauncher(forks=sup.fork_server, boxed=sup.boxed_fork_server)
        sup.launchers["process"] = launcher
        forks = None if sup.fork_server is None else psutil.Process(sup.fork_server.pid)
        cost = await measure(lambda: fleet(sup), forks)
    if argvs is not None:
        argvs.update(launcher.argvs)
    for index, handoff in enumerate(handoffs):
        if handoff["state"] != "stopped" or not reported(index, handoff["last"]):
            raise RuntimeError(f"fleet child {index} did not finish its work: {handoff}")
    return cost


async def run_processes(argvs: Sequence[Sequence[str]], cwd: Path, *, at_once: int) -> None:
    """Run *argvs* as plain subprocesses, *at_once* at a time; check each one's report.

    Each gets its own session, as the launcher gives a child: with the kernel's autogroup
    scheduling a session is a unit of CPU share, so on a busy box a fleet of sessions would
    otherwise outrun baseline processes that share one.
    """
    limiter = trio.CapacityLimiter(at_once)

    async def one(index: int, argv: Sequence[str]) -> None:
        async with limiter:
            done = await trio.run_process(
                list(argv), cwd=cwd, capture_stdout=True, start_new_session=True
            )
        if not reported(index, done.stdout.decode()):
            raise RuntimeError(f"baseline process {index} printed {done.stdout!r}")

    async with trio.open_nursery() as nursery:
        for index, argv in enumerate(argvs):
            nursery.start_soon(one, index, argv)


# -- spawn -> hello -----------------------------------------------------------------------------


@attrs.define(eq=False)
class TimedLauncher(ProcessLauncher):
    """The product's launcher, noting when each launch (``Popen`` or fork) began."""

    started: dict[str, float] = attrs.Factory(dict)
    argvs: dict[str, tuple[str, ...]] = attrs.Factory(dict)
    forked: set[str] = attrs.Factory(set)

    async def launch(
        self, spec: LaunchSpec, sink: OutputSink, nursery: trio.Nursery
    ) -> LaunchedProcess:
        self.started[spec.key] = time.perf_counter()
        self.argvs[spec.key] = spec.argv
        launched = await super().launch(spec, sink, nursery)
        if launched.forked:
            self.forked.add(spec.key)
        return launched


def sandbox_prefix(argv: Sequence[str]) -> list[str]:
    """The recorded argv of a sandboxed child up to its interpreter: the bwrap command line
    (with its seccomp shell) the supervisor placed it in."""
    for index in range(len(argv) - 3, 0, -1):
        if tuple(argv[index : index + 3]) == ("-I", "-m", "child"):
            return list(argv[: index - 1])
    raise RuntimeError(f"no child command in the sandboxed argv {argv!r}")


def recreate_bind_sources(prefix: Sequence[str]) -> None:
    """The warm-up child's scratch directory, bound into its view, went with the child: the
    plain processes get an empty one in its place (bwrap refuses a missing bind source)."""
    for flag, source in itertools.pairwise(prefix):
        if flag == "--bind":
            Path(source).mkdir(parents=True, exist_ok=True)


async def process_ms(argv: Sequence[str]) -> float:
    """Milliseconds from ``Popen`` to exit of *argv*."""
    started = time.perf_counter()
    # Popen on the trio thread in a new session, as the product's launcher starts a child.
    process = subprocess.Popen(list(argv), start_new_session=True)  # noqa: ASYNC220
    await trio.to_thread.run_sync(process.wait)
    if process.returncode != 0:
        raise RuntimeError(f"{argv} exited with {process.returncode}")
    return (time.perf_counter() - started) * 1000


async def hello_or_end(sup: Supervisor, key: str) -> None:
    """Wait for *key*'s hello; raise if the child ended without one (a broken tree, say)."""
    run = sup.runs.get(key)
    with trio.fail_after(SPAWN_CEILING):
        if run is not None:
            async with trio.open_nursery() as nursery:

                async def first(event: trio.Event) -> None:
                    await event.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(first, run.connected)
                nursery.start_soon(first, run.done)
    if run is None or not run.connected.is_set():
        record = sup.all_records()[key]
        raise RuntimeError(f"spawn benchmark child {key} ended before its hello: {record.error}")


@attrs.frozen(kw_only=True)
class Spawns:
    spawn_ms: list[float]
    popen_ms: list[float]
    floors_ms: dict[str, list[float]]
    forked: int = 0


async def time_spawns(base: Path, repo: Path, script: Path, count: int, sandbox: str) -> Spawns:
    """Spawn one child at a time on an idle supervisor; the floors are timed in between."""
    spawn_ms: list[float] = []
    popen_ms: list[float] = []
    floors_ms: dict[str, list[float]] = {name: [] for name in FLOORS}
    async with open_supervisor(
        bench_config(base, repo, f"spawn-{sandbox}", sandbox=sandbox)
    ) as sup:
        await warm_supervisor(sup)
        launcher = TimedLauncher(forks=sup.fork_server, boxed=sup.boxed_fork_server)
        sup.launchers["process"] = launcher
        for _ in range(count):
            for name, args in FLOORS.items():
                floors_ms[name].append(await process_ms([sys.executable, *args]))
            started = time.perf_counter()
            [record] = await sup.spawn(requests([script]))
            await hello_or_end(sup, record.key)
            hello = time.perf_counter()
            spawn_ms.append((hello - started) * 1000)
            popen_ms.append((hello - launcher.started[record.key]) * 1000)
            if sandbox != "off":
                floor = [*sandbox_prefix(launcher.argvs[record.key]), sys.executable, "-c", "pass"]
                floors_ms.setdefault(BWRAP_FLOOR, []).append(await process_ms(floor))
            await sup.wait([record.key])
            [handoff] = await sup.stop([record.key])
            if handoff["state"] != "stopped" or handoff["error"]:
                raise RuntimeError(f"spawn benchmark child failed: {handoff}")
    return Spawns(
        spawn_ms=spawn_ms, popen_ms=popen_ms, floors_ms=floors_ms, forked=len(launcher.forked)
    )


async def sandboxed_fleets(
    base: Path, repo: Path, scripts: Sequence[Path], plain: Sequence[Sequence[str]], reps: int
) -> tuple[list[Cost], list[Cost]]:
    """The 32 children sandboxed (the default path) against the plain processes under the
    same bwrap command line, taken from a warm-up fleet's recorded argv; alternated."""
    argvs: dict[str, tuple[str, ...]] = {}
    await run_fleet(base, repo, scripts[:LANE], "boxed-warmup", [], sandbox="auto", argvs=argvs)
    prefix = sandbox_prefix(next(iter(argvs.values())))
    recreate_bind_sources(prefix)
    boxed_plain = [[*prefix, *argv] for argv in plain]
    fleets: list[Cost] = []
    bare: list[Cost] = []
    for rep in range(reps):

        async def fleet(rep: int = rep) -> Cost:
            return await run_fleet(base, repo, scripts, f"boxed{rep}", [], sandbox="auto")

        async def processes() -> Cost:
            return await measure(lambda: run_processes(boxed_plain, repo, at_once=LANE))

        if rep % 2:
            bare.append(await processes())
            fleets.append(await fleet())
        else:
            fleets.append(await fleet())
            bare.append(await processes())
        print(
            f"sandboxed rep {rep + 1}/{reps}: fleet {fleets[-1].wall:.3f} s, "
            f"plain under bwrap {bare[-1].wall:.3f} s",
            flush=True,
        )
    return fleets, bare


# -- reporting ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def spread(values: Sequence[float], unit: str = "") -> str:
    return (
        f"median {statistics.median(values):.3f}{unit} "
        f"(min {min(values):.3f}, max {max(values):.3f}, n={len(values)})"
    )


def latency(values: Sequence[float]) -> str:
    return (
        f"p50 {percentile(values, 0.5):.1f} p95 {percentile(values, 0.95):.1f} "
        f"(min {min(values):.1f}, max {max(values):.1f}, n={len(values)})"
    )


def refresh_bytecode() -> None:
    root = Path(ipc.__file__).resolve().parents[1]
    for package in PACKAGES:
        compileall.compile_dir(root / package, quiet=1)


async def bench(reps: int, spawns: int, sandboxed: bool) -> dict[str, Any]:
    refresh_bytecode()
    costs: dict[str, list[Cost]] = {"fleet": [], "plain": [], "solo": []}
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp, trio.fail_after(CEILING):
        base = Path(tmp)
        repo = base / "repo"
        listing = make_repo(repo)
        scripts = write_scripts(base / "scripts", listing)
        plain = [
            [sys.executable, "-I", "-c", PLAIN_SCRIPT, f"pkg{index:02d}", *files]
            for index, files in enumerate(listing)
        ]
        solo = [
            [sys.executable, "-I", "-c", SOLO_SCRIPT, str(script), str(repo)] for script in scripts
        ]
        startups: list[float] = []
        runs: dict[str, Callable[[], Awaitable[Cost]]] = {
            "fleet": lambda: run_fleet(
                base, repo, scripts, f"fleet{len(costs['fleet'])}", startups
            ),
            "plain": lambda: measure(lambda: run_processes(plain, repo, at_once=LANE)),
            # All at once, as the fleet starts its processes: on a shared box the CPU is split
            # per session, so both sides must ask for the same share.
            "solo": lambda: measure(lambda: run_processes(solo, repo, at_once=CHILDREN)),
        }
        # Warm-up, outside the measurements: the page cache and the interpreter's own caches.
        await run_processes(plain[:LANE], repo, at_once=LANE)
        await run_processes(solo[:LANE], repo, at_once=LANE)
        await run_fleet(base, repo, scripts[:LANE], "warmup", [])
        for rep in range(reps):
            # Rotate the order so a slow spell on a shared box does not favour one side.
            order = list(runs)[rep % 3 :] + list(runs)[: rep % 3]
            for name in order:
                costs[name].append(await runs[name]())
            print(
                f"rep {rep + 1}/{reps}: "
                + ", ".join(f"{n} {costs[n][-1].wall:.3f} s" for n in runs),
                flush=True,
            )
        boxed_costs = (
            await sandboxed_fleets(base, repo, scripts, plain, reps) if sandboxed else None
        )
        timed = await time_spawns(base, repo, scripts[0], spawns, "off")
        boxed = await time_spawns(base, repo, scripts[0], spawns, "auto") if sandboxed else None

    wall_ratios = [f.wall / p.wall for f, p in zip(costs["fleet"], costs["plain"], strict=True)]
    solo_ratios = [f.wall / s.wall for f, s in zip(costs["fleet"], costs["solo"], strict=True)]
    for name, label in (("fleet", "fleet"), ("plain", "plain processes"), ("solo", "solo agents")):
        walls = [c.wall for c in costs[name]]
        per_child = [c.children_cpu / CHILDREN * 1000 for c in costs[name]]
        own = [c.own_cpu for c in costs[name]]
        print(f"{label:16} wall s {spread(walls)}")
        print(f"{'':16} child CPU ms each {spread(per_child)}; this process CPU s {spread(own)}")
    print(f"supervisor start-up (fork server preloaded), before each fleet: s {spread(startups)}")
    print(f"wall ratio, fleet / plain processes: {spread(wall_ratios)}")
    print(f"wall ratio, fleet / solo agents:     {spread(solo_ratios)}")
    cpu_ratio = statistics.median(
        f.cpu / p.cpu for f, p in zip(costs["fleet"], costs["plain"], strict=True)
    )
    print(f"CPU ratio, fleet / plain processes: median {cpu_ratio:.3f}")
    print(f"spawn->hello ms: {latency(timed.spawn_ms)}")
    print(f"Popen->hello ms: {latency(timed.popen_ms)}")
    for name, values in timed.floors_ms.items():
        print(f"floor {name} ms: {latency(values)}")
    extra: dict[str, Any] = {}
    if boxed is not None and boxed_costs is not None:
        fleets, bare = boxed_costs
        ratios = [f.wall / p.wall for f, p in zip(fleets, bare, strict=True)]
        print(f"sandboxed fleet  wall s {spread([c.wall for c in fleets])}")
        print(f"plain under bwrap wall s {spread([c.wall for c in bare])}")
        print(f"wall ratio, sandboxed fleet / plain under the same bwrap: {spread(ratios)}")
        print(f"sandboxed spawn->hello ms: {latency(boxed.spawn_ms)}")
        print(f"sandboxed children forked: {boxed.forked}/{len(boxed.spawn_ms)} single spawns")
        print(f"floor {BWRAP_FLOOR} ms: {latency(boxed.floors_ms[BWRAP_FLOOR])}")
        boxed_p50 = percentile(boxed.spawn_ms, 0.5)
        bwrap_p50 = percentile(boxed.floors_ms[BWRAP_FLOOR], 0.5)
        extra = {
            "sandboxed_wall_ratio": round(statistics.median(ratios), 3),
            "sandboxed_spawn_hello_p50_ms": round(boxed_p50, 1),
            "bwrap_floor_p50_ms": round(bwrap_p50, 1),
            "sandboxed_spawn_ratio": round(boxed_p50 / bwrap_p50, 2),
            "sandboxed_forked": f"{boxed.forked}/{len(boxed.spawn_ms)}",
            "target_sandboxed_wall": TARGET_SANDBOXED_WALL,
            "target_sandboxed_spawn": TARGET_SANDBOXED_SPAWN,
        }

    spawn_p50 = percentile(timed.spawn_ms, 0.5)
    floor_p50 = percentile(timed.floors_ms["python -c pass"], 0.5)
    return {
        "benchmark": "fleet_overhead",
        "wall_ratio": round(statistics.median(wall_ratios), 3),
        "spawn_hello_p50_ms": round(spawn_p50, 1),
        "python_floor_p50_ms": round(floor_p50, 1),
        "spawn_ratio": round(spawn_p50 / floor_p50, 2),
        "target_wall": TARGET_WALL,
        "target_spawn": TARGET_SPAWN,
        **extra,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="32-child fleet overhead and spawn latency.")
    parser.add_argument("--reps", type=int, default=3, help="fleet/baseline repetitions")
    parser.add_argument("--spawns", type=int, default=30, help="single spawns to time")
    parser.add_argument("--sandboxed", action="store_true", help="also time bwrap spawns")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run that checks the script works (its figures mean nothing)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        # The whole script, shrunk: 4 children of 3 files, a lane of 2, one repetition.
        global CHILDREN, FILES, LANE
        CHILDREN, FILES, LANE = 4, 3, 2
        args.reps, args.spawns = 1, 2
    result = trio.run(bench, args.reps, args.spawns, args.sandboxed)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
