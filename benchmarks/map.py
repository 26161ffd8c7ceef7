"""``fleet map`` over 200 scripted rows: wall against the ideal schedule, and supervisor memory.

Each row's child is a fresh scout on the builtin agent whose scripted model thinks
``--think`` seconds (0.5 by default: a row waits on its model, as a real one does for seconds)
and replies with its task; the rest of a row's time is the fleet's own cost: spawn (sandboxed
by default), hello, one turn, the settle, the ledger's fsync and the out file, the discard.
With ``--think 0`` a row is nothing but that cost, which is CPU: W rows at a time then cannot
beat the machine's cores, and the ratio says as much about the cores as about the fleet (the
JSON gives ``cores``). The script measures, in one run on an embedded supervisor over a real
git repository:

* one row's time: a 1-row map, ``--single`` times (median);
* a ``--rows``-row map at the lane's width ``W = min(lane, max_subagents)``;
* ``ratio = wall ÷ (ceil(rows ÷ W) * one row's time)`` — the ideal schedule runs W rows at a
  time back to back with no cost between them (target <= 1.2, stretch <= 1.1);
* the supervisor's RSS (this process) before the map and its peak after it.

Run::

    .venv/bin/python benchmarks/map.py [--rows 200] [--lane 4] [--unsandboxed]
    .venv/bin/python benchmarks/map.py --smoke     # 12 rows, 1 single: a quick check

The last line is one JSON object.
"""

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import psutil
import trio

from orchestrator._config import Config
from orchestrator.batch import MapSpec
from orchestrator.core._supervisor import open_supervisor

MB = 1024 * 1024
TARGET = 1.2
SCRIPT = 'turns:\n  - steps:\n      - wait: {think}\n      - reply: "{{{{task}}}}"\n'
GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.invalid"}
GIT_ENV |= {"GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.invalid"}


def make_repo(path: Path) -> None:
    path.mkdir()
    (path / "README.md").write_text("# bench\n")
    env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=path, env=env, check=True, capture_output=True)


async def bench(
    rows: int, singles: int, lane: int, *, sandboxed: bool, think: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fmb-", dir="/tmp") as tmp:
        root = Path(tmp)
        make_repo(root / "repo")
        (root / "row.yaml").write_text(SCRIPT.format(think=think))
        config = Config(
            home=root / "home",
            session="b",
            workspace=root / "repo",
            max_subagents=max(c for c in (2, 4, 6, 8, 16) if c >= lane),
            lane=lane,
            sandbox="auto" if sandboxed else "off",
        )
        spec = MapSpec(template="row {n}", model=f"scripted:{root / 'row.yaml'}")
        me = psutil.Process()
        async with open_supervisor(config) as sup:
            width = min(sup.lane.capacity, sup.capacity.cap)
            await sup.map(spec, [{"n": -1}])  # the fork server and caches warm
            single = []
            for i in range(singles):
                started = time.perf_counter()
                done = await sup.map(spec, [{"n": i}])
                single.append(time.perf_counter() - started)
                assert done.status()["done"] == 1, done.status()
            rss_before = me.memory_info().rss / MB
            out = root / "out.jsonl"
            started = time.perf_counter()
            done = await sup.map(attrs.evolve(spec, out=str(out)), [{"n": i} for i in range(rows)])
            wall = time.perf_counter() - started
            rss_after = me.memory_info().rss / MB
            status = done.status()
        written = sum(1 for _ in out.open())
    one = statistics.median(single)
    ideal = math.ceil(rows / width) * one
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"one row (median of {singles}): {one:.3f} s; width {width}")
    print(f"{rows} rows: wall {wall:.2f} s, ideal {ideal:.2f} s, ratio {wall / ideal:.3f}")
    print(f"supervisor RSS: {rss_before:.1f} MB before, {rss_after:.1f} MB after, peak {peak:.1f}")
    return {
        "benchmark": "map",
        "rows": rows,
        "done": status["done"],
        "failed": status["failed"],
        "written": written,
        "width": width,
        "cores": os.cpu_count(),
        "think_s": think,
        "sandboxed": sandboxed,
        "one_row_s": round(one, 3),
        "single_min_s": round(min(single), 3),
        "single_max_s": round(max(single), 3),
        "wall_s": round(wall, 3),
        "ideal_s": round(ideal, 3),
        "ratio": round(wall / ideal, 3),
        "target": TARGET,
        "supervisor_rss_before_mb": round(rss_before, 1),
        "supervisor_rss_after_mb": round(rss_after, 1),
        "supervisor_peak_rss_mb": round(peak, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fleet map: wall ÷ ideal schedule, memory.")
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--single", type=int, default=5, help="1-row maps timed for the ideal")
    parser.add_argument("--lane", type=int, default=4)
    parser.add_argument("--unsandboxed", action="store_true")
    parser.add_argument("--think", type=float, default=0.5, help="each row's model time, s")
    parser.add_argument("--smoke", action="store_true", help="12 rows, 1 single")
    args = parser.parse_args(argv)
    rows, single = (12, 1) if args.smoke else (args.rows, args.single)
    sandboxed = not args.unsandboxed
    result = trio.run(lambda: bench(rows, single, args.lane, sandboxed=sandboxed, think=args.think))
    print(json.dumps(result))
    return 0 if result["done"] == rows else 1


if __name__ == "__main__":
    sys.exit(main())
