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

The last line is one JSON object.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import trio

from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.core._capacity import Capacity
from orchestrator.core._supervisor import Supervisor, open_supervisor

MB = 1024 * 1024
BATCH = 16
TARGET_SUPERVISOR_MB = 150
TARGET_CHILD_MB = 40
TARGET_PEEK_MS = 5
CEILING = 900.0

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="128 retained idle children: RSS and peek.")
    parser.add_argument("--children", type=int, default=128)
    parser.add_argument("--peeks", type=int, default=200)
    args = parser.parse_args(argv)
    result = trio.run(bench, args.children, args.peeks)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
