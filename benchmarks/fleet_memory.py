"""A retained fleet at rest: 128 idle builtin children, the supervisor's RSS and a peek's cost.

Each child is a scout on the builtin agent whose scripted model reads two files and replies,
so every child has loaded its agent loop, tools and model before it goes idle and is retained
(alive, with its context). With all of them idle the script measures:

* the supervisor's RSS (this process: the embedded supervisor plus the benchmark's own
  imports; target <= 150 MB),
* each child's RSS and USS (the pages only it holds) — median and max (target <= 40 MB RSS),
* ``Supervisor.peek()`` over the whole fleet, in memory (no control socket): p50 and p95 of
  ``--peeks`` calls (target <= 5 ms),

against same-run baselines: the RSS of the supervisor before it spawned anything, and of a
``python -I -c 'import trio; input()'`` process (the floor any trio child starts from).

The product caps a fleet at 16 (``max_subagents``); the benchmark swaps in a larger
:class:`~orchestrator.core._capacity.Capacity` after ``open_supervisor``, leaving the cap rule
unchanged. Children are spawned in batches of 16 and each batch settles before the next, so no
hello waits behind a 128-process import storm. Run::

    .venv/bin/python benchmarks/fleet_memory.py [--children 128] [--peeks 200]

``--hibernate`` measures hibernation instead (docs/durability.md "Hibernation"): ``--children``
(default 64) retained children of a real agent CLI (Pi, against the loopback scripted model
server of tests/fakes) with at most 8 live and ``hibernate_after_s: 0`` — the total RSS of the
fleet (this process and every process under it) once all have answered and hibernated, against
the same children all live and idle in a second supervisor; and wake→hello p50 of eight
hibernated children woken one at a time, against spawn→hello p50 of eight fresh children
spawned one at a time (``revive_ratio``). Run::

    .venv/bin/python benchmarks/fleet_memory.py --hibernate [--children 16]

The last line is one JSON object.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import trio

from orchestrator._config import Config
from orchestrator._records import SpawnRequest, State
from orchestrator.core._capacity import Capacity
from orchestrator.core._supervisor import Supervisor, open_supervisor

if TYPE_CHECKING:
    from tests.fakes.model_server import ModelServer

ROOT = Path(__file__).resolve().parents[1]
MB = 1024 * 1024
BATCH = 16
#: ``--hibernate``: the most live children, and how many spawns and wakes are timed.
LIVE = 8
TIMED = 8
TARGET_SUPERVISOR_MB = 150
TARGET_CHILD_MB = 40
TARGET_PEEK_MS = 5
CEILING = 900.0
HIBERNATE_CEILING = 1800.0

SCRIPT = {
    "turns": [
        {
            "steps": [
                {"tool": "read", "args": {"path": "README.md"}},
                {"tool": "read", "args": {"path": "src/app.py"}},
                {"reply": "## Summary\nThe app greets.\n"},
            ]
        }
    ]
}


def make_workspace(root: Path) -> Path:
    """A two-file repository and the children's script; returns the script's path."""
    (root / "src").mkdir(parents=True)
    (root / "README.md").write_text("# app\n\nGreets whoever runs it.\n")
    (root / "src" / "app.py").write_text('def main() -> None:\n    print("hello")\n')
    script = root / "script.json"
    script.write_text(json.dumps(SCRIPT))  # JSON is YAML: the scripted model reads it as is
    return script


def rss_mb(process: psutil.Process) -> float:
    return process.memory_info().rss / MB


def uss_mb(process: psutil.Process) -> float:
    return process.memory_full_info().uss / MB


def trio_floor_mb() -> float:
    """RSS of an idle interpreter that has imported trio and nothing else."""
    process = subprocess.Popen(
        [sys.executable, "-I", "-c", "import sys, trio; print(flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        process.stdout.readline()  # imported
        return rss_mb(psutil.Process(process.pid))
    finally:
        process.communicate(b"")


async def spawn_fleet(sup: Supervisor, script: Path, children: int) -> list[str]:
    keys: list[str] = []
    for start in range(0, children, BATCH):
        batch = [
            SpawnRequest(
                task="What does the app do?",
                agent="scout",
                name=f"idle{index:03d}",
                model=f"scripted:{script}",
            )
            for index in range(start, min(children, start + BATCH))
        ]
        records = await sup.spawn(batch)
        batch_keys = [r.key for r in records]
        await sup.wait(batch_keys, every=True)
        keys.extend(batch_keys)
    for key in keys:
        record = sup.runs[key].record
        if str(record.state) != "idle" or "greets" not in record.report:
            raise RuntimeError(f"child {key} is not an idle, retained child: {record.peek()}")
    return keys


def peek_ms(sup: Supervisor, peeks: int) -> list[float]:
    times = []
    for _ in range(peeks):
        started = time.perf_counter()
        data = sup.peek()
        times.append((time.perf_counter() - started) * 1000)
        if not data["agents"]:
            raise RuntimeError("peek saw no children")
    return times


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def bench(children: int, peeks: int) -> dict[str, Any]:
    me = psutil.Process()
    floor = trio_floor_mb()
    with tempfile.TemporaryDirectory(prefix="fleet-memory-") as tmp:
        base = Path(tmp)
        script = make_workspace(base / "repo")
        config = Config(
            home=base / "state",
            session="memory",
            workspace=base / "repo",
            sandbox="off",
            allow_unsandboxed=True,
            lane=8,
            max_subagents=16,
        )
        with trio.fail_after(CEILING):
            async with open_supervisor(config) as sup:
                sup.capacity = Capacity(cap=children)  # benchmark-only: above the product's 16
                empty = rss_mb(me)
                started = time.perf_counter()
                keys = await spawn_fleet(sup, script, children)
                spawned = time.perf_counter() - started
                await trio.sleep(1.0)  # let the children's last events and allocations settle
                supervisor = rss_mb(me)
                pids = [sup.runs[key].record.pid for key in keys]
                processes = [psutil.Process(pid) for pid in pids if pid is not None]
                child_rss = [rss_mb(p) for p in processes]
                child_uss = [uss_mb(p) for p in processes]
                peek = peek_ms(sup, peeks)
                handoffs = await sup.stop(keys)
    stopped = sum(h["state"] == "stopped" for h in handoffs)
    print(f"{children} children spawned and idle in {spawned:.1f} s; {stopped} stopped cleanly")
    print(f"supervisor RSS MB: empty {empty:.1f}, with the fleet {supervisor:.1f}")
    print(
        f"child RSS MB: median {statistics.median(child_rss):.1f} max {max(child_rss):.1f}; "
        f"USS MB: median {statistics.median(child_uss):.1f} max {max(child_uss):.1f}; "
        f"idle trio interpreter RSS MB: {floor:.1f}"
    )
    p50, p95 = percentile(peek, 0.5), percentile(peek, 0.95)
    print(f"peek ms over {children} children: p50 {p50:.3f} p95 {p95:.3f}")
    return {
        "benchmark": "fleet_memory",
        "children": len(processes),
        "supervisor_rss_mb": round(supervisor, 1),
        "supervisor_empty_rss_mb": round(empty, 1),
        "child_rss_mb_p50": round(statistics.median(child_rss), 1),
        "child_rss_mb_max": round(max(child_rss), 1),
        "child_uss_mb_p50": round(statistics.median(child_uss), 1),
        "trio_floor_rss_mb": round(floor, 1),
        "child_rss_ratio_to_trio_floor": round(statistics.median(child_rss) / floor, 2),
        "peek_p50_ms": round(p50, 3),
        "peek_p95_ms": round(p95, 3),
        "target_supervisor_mb": TARGET_SUPERVISOR_MB,
        "target_child_mb": TARGET_CHILD_MB,
        "target_peek_ms": TARGET_PEEK_MS,
    }


# -- --hibernate: a fleet of real Pi children, hibernated against live -----------------------


def fleet_rss_mb() -> float:
    """This process (supervisor, model server) and every process under it."""
    me = psutil.Process()
    total = me.memory_info().rss
    for process in me.children(recursive=True):
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total / MB


def request(srv: "ModelServer", index: int) -> SpawnRequest:
    child = f"c{index}"
    srv.script(child, [{"text": f"## Summary\nchild {index} read the app."}] * 4)
    return SpawnRequest(
        task="What does the app do?",
        backend="pi",
        name=f"pi{index:03d}",
        model=f"openai:fake-model@{srv.base_url(child)}/v1",
    )


async def until(check: Any) -> None:
    while not check():  # noqa: ASYNC110 - polling the fleet, as a person would
        await trio.sleep(0.02)


def fleet_config(base: Path, name: str, **overrides: Any) -> Config:
    (base / "repo").mkdir(exist_ok=True)
    (base / "repo" / "README.md").write_text("# app\n\nGreets whoever runs it.\n")
    settings: dict[str, Any] = {"sandbox": "off", "allow_unsandboxed": True, "lane": LIVE}
    return Config(home=base / name, session=name, workspace=base / "repo", **(settings | overrides))


def asleep(sup: Supervisor, keys: list[str]) -> bool:
    return all(sup.registry.records[key].state is State.HIBERNATED for key in keys)


async def hibernated_fleet(srv: "ModelServer", base: Path, children: int) -> dict[str, Any]:
    cfg = fleet_config(
        base, "hibernated", max_subagents=LIVE, hibernate_after_s=0, max_retained=children
    )
    spawn_hello: list[float] = []
    wake_hello: list[float] = []
    spawn_first: list[float] = []
    wake_first: list[float] = []
    async with open_supervisor(cfg) as sup:
        keys: list[str] = []
        for index in range(min(TIMED, children)):  # one at a time: spawn→hello
            started = time.perf_counter()
            [record] = await sup.spawn([request(srv, index)])
            await sup.runs[record.key].connected.wait()
            spawn_hello.append(time.perf_counter() - started)
            await until(lambda index=index: srv.requests(f"c{index}"))
            spawn_first.append(time.perf_counter() - started)
            keys.append(record.key)
            await until(lambda: asleep(sup, keys))
        for start in range(len(keys), children, LIVE):
            records = await sup.spawn(
                [request(srv, i) for i in range(start, min(children, start + LIVE))]
            )
            keys += [r.key for r in records]
            await until(lambda keys=keys: asleep(sup, keys))
        await sup.wait(keys, every=True)
        await trio.sleep(1.0)  # the last exits reaped, allocations settled
        rss = fleet_rss_mb()
        processes = len(psutil.Process().children(recursive=True))
        for index, key in enumerate(keys[:TIMED]):  # one at a time: wake→hello
            started = time.perf_counter()
            async with sup.hibernation.awake(key) as run:
                await run.connected.wait()
                wake_hello.append(time.perf_counter() - started)
            await until(lambda: asleep(sup, keys))
            # ... and a prompt to a hibernated child → its model request (Pi resumed).
            seen = len(srv.requests(f"c{index}"))
            started = time.perf_counter()
            await sup.prompt(key, "And what does it print?")
            await until(lambda index=index, seen=seen: len(srv.requests(f"c{index}")) > seen)
            wake_first.append(time.perf_counter() - started)
            await until(lambda: asleep(sup, keys))
        handoffs = await sup.stop(keys)
    stopped = sum(h["state"] == "stopped" for h in handoffs)
    return {
        "rss": rss,
        "processes": processes,
        "spawn_hello": spawn_hello,
        "wake_hello": wake_hello,
        "spawn_first": spawn_first,
        "wake_first": wake_first,
        "stopped": stopped,
    }


async def live_fleet(srv: "ModelServer", base: Path, children: int) -> dict[str, Any]:
    async with open_supervisor(fleet_config(base, "live", max_subagents=16)) as sup:
        sup.capacity = Capacity(cap=children, max_retained=children)  # benchmark-only
        keys: list[str] = []
        for start in range(0, children, LIVE):
            records = await sup.spawn(
                [request(srv, i) for i in range(start, min(children, start + LIVE))]
            )
            batch = [r.key for r in records]
            await sup.wait(batch, every=True)
            keys += batch
        await until(lambda: all(sup.registry.records[k].state is State.IDLE for k in keys))
        await trio.sleep(1.0)
        rss = fleet_rss_mb()
        processes = len(psutil.Process().children(recursive=True))
        await sup.stop(keys)
    return {"rss": rss, "processes": processes}


async def bench_hibernation(children: int) -> dict[str, Any]:
    """``--hibernate``: see the module docstring."""
    os.environ.setdefault("FLEET_PI_BIN", str(ROOT / ".npm-prefix" / "bin" / "pi"))
    sys.path.insert(0, str(ROOT))  # tests.fakes: the loopback scripted model server
    from tests.fakes.model_server import ModelServer  # noqa: PLC0415 - only for --hibernate

    empty = fleet_rss_mb()
    with tempfile.TemporaryDirectory(prefix="fleet-hibernate-") as tmp:
        with trio.fail_after(HIBERNATE_CEILING):
            async with ModelServer() as srv:
                asleep_run = await hibernated_fleet(srv, Path(tmp), children)
                live = await live_fleet(srv, Path(tmp), children)
    spawn_p50 = statistics.median(asleep_run["spawn_hello"])
    wake_p50 = statistics.median(asleep_run["wake_hello"])
    first_p50 = statistics.median(asleep_run["spawn_first"])
    woken_p50 = statistics.median(asleep_run["wake_first"])
    print(f"fleet RSS MB with nothing spawned: {empty:.1f}")
    print(
        f"{children} Pi children, all hibernated ({LIVE} live at most): fleet RSS "
        f"{asleep_run['rss']:.1f} MB in {asleep_run['processes']} processes; "
        f"{asleep_run['stopped']} stopped cleanly"
    )
    print(
        f"{children} Pi children, all live and idle: fleet RSS {live['rss']:.1f} MB in "
        f"{live['processes']} processes"
    )
    print(
        f"spawn→hello s (one at a time): p50 {spawn_p50:.3f} "
        f"min {min(asleep_run['spawn_hello']):.3f} max {max(asleep_run['spawn_hello']):.3f}"
    )
    print(
        f"wake→hello s (one at a time): p50 {wake_p50:.3f} "
        f"min {min(asleep_run['wake_hello']):.3f} max {max(asleep_run['wake_hello']):.3f}"
    )
    print(
        f"spawn→first model request s: p50 {first_p50:.3f}; prompt to a hibernated child→its "
        f"model request s: p50 {woken_p50:.3f}"
    )
    return {
        "benchmark": "fleet_memory_hibernate",
        "backend": "pi",
        "children": children,
        "max_live": LIVE,
        "empty_rss_mb": round(empty, 1),
        "hibernated_total_rss_mb": round(asleep_run["rss"], 1),
        "live_total_rss_mb": round(live["rss"], 1),
        "rss_ratio": round(asleep_run["rss"] / live["rss"], 3),
        "spawn_hello_p50_s": round(spawn_p50, 3),
        "revive_hello_p50_s": round(wake_p50, 3),
        "revive_ratio": round(wake_p50 / spawn_p50, 3),
        "spawn_first_request_p50_s": round(first_p50, 3),
        "revive_first_request_p50_s": round(woken_p50, 3),
        "revive_first_request_ratio": round(woken_p50 / first_p50, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="128 retained idle children: RSS and peek.")
    parser.add_argument("--children", type=int, default=None)
    parser.add_argument("--peeks", type=int, default=200)
    parser.add_argument("--hibernate", action="store_true", help="hibernated against live")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run that checks the script works (its figures mean nothing)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        # 4 children and 10 peeks; hibernated: 2 Pi children, one spawn and one wake timed.
        global TIMED  # noqa: PLW0603
        args.children, args.peeks = (2 if args.hibernate else 4), 10
        TIMED = 1
    if args.hibernate:
        result = trio.run(bench_hibernation, args.children or 64)
    else:
        result = trio.run(bench, args.children or 128, args.peeks)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
