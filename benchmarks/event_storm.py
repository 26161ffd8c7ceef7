"""Parent-side CPU per child event under an event storm, at several fleet sizes.

DESIGN.md §12 asks that the supervisor's CPU per child event stay flat as the fleet grows. For
each fleet size (8, 16, 32 by default) the script opens an embedded supervisor, spawns that
many builtin children (scripted models, unsandboxed so they fork from the fork server) and
lets each settle a first, trivial turn. Then it prompts every child at once with a turn of
``--calls`` ``ls`` tool calls (over :data:`DIRS` directories in turn, so the loop gate sees no
repeat) — each one a ``tool_start`` and a ``tool_end`` the builtin agent has the supervisor's
loop gate check, and which the runtime never coalesces — and measures this process's CPU (the
supervisor's, all of it: events, checks, frames, records, watchdogs, settle notes) from the
prompts until every child has settled, and the events the supervisor received in that time
(counted at ``ChildRequests.on_event`` and ``ChildRequests.check_tool``).

The figure is CPU microseconds per event at each size; the ratio is the largest fleet's figure
over the smallest's, measured in the same run (flat is 1.0). Run::

    .venv/bin/python benchmarks/event_storm.py [--sizes 8,16,32] [--calls 100] [--reps 3]

The last line is one JSON object.
"""

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

import ipc
from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.core._capacity import Capacity
from orchestrator.core._requests import ChildRequests
from orchestrator.core._supervisor import Supervisor, open_supervisor

TARGET_RATIO = 1.25  # "flat": the largest fleet may cost at most this much more per event
#: Directories the storm lists in turn: more than the loop gate's window, so no call repeats.
DIRS = 12
CEILING = 600.0


@attrs.define
class Counter:
    """Counts every event frame a supervisor's children send (a benchmark-side hook)."""

    events: int = 0

    def install(self) -> None:
        original = ChildRequests.on_event
        check = ChildRequests.check_tool

        async def counted(requests: ChildRequests, envelope: ipc.Envelope) -> None:
            self.events += 1
            await original(requests, envelope)

        def checked(requests: ChildRequests, event: ipc.Event) -> ipc.Message:
            self.events += 1
            return check(requests, event)

        ChildRequests.on_event = counted  # type: ignore[method-assign,assignment]
        ChildRequests.check_tool = checked  # type: ignore[method-assign,assignment]


def write_script(directory: Path, calls: int) -> Path:
    storm = [{"tool": "ls", "args": {"path": f"d{n % DIRS}"}} for n in range(calls)]
    script = {
        "turns": [
            {"steps": [{"reply": "ready"}]},
            {"steps": [*storm, {"reply": f"## Summary\n{calls} listings."}]},
        ]
    }
    path = directory / "storm.json"
    path.write_text(json.dumps(script))  # JSON is YAML
    return path


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def storm(
    base: Path, repo: Path, script: Path, size: int, counter: Counter
) -> tuple[float, int]:
    """One fleet of *size*: (supervisor CPU seconds, events received) for the storm turn."""
    config = Config(
        home=base / "state",
        session=f"storm{size}-{time.monotonic_ns()}",
        workspace=repo,
        sandbox="off",
        allow_unsandboxed=True,
        lane=size,
        max_subagents=16,
    )
    async with open_supervisor(config) as sup:
        sup.capacity = Capacity(cap=size)  # benchmark-only: fleets above the product's 16
        records = await sup.spawn(
            [
                SpawnRequest(task="get ready", agent="scout", model=f"scripted:{script}")
                for _ in range(size)
            ]
        )
        keys = [record.key for record in records]
        await sup.wait(keys, every=True)
        events, cpu = counter.events, own_cpu()
        for key in keys:
            await sup.prompt(key, "list")
        await settled(sup, keys)
        spent, received = own_cpu() - cpu, counter.events - events
        await sup.stop(keys)
    return spent, received


async def settled(sup: Supervisor, keys: Sequence[str]) -> None:
    notes = await sup.wait(keys, every=True)
    for note in notes:
        if "listings" not in note.get("report", ""):
            raise RuntimeError(f"a storm child did not finish its turn: {note}")


async def bench(sizes: Sequence[int], calls: int, reps: int) -> dict[str, Any]:
    counter = Counter()
    counter.install()
    per_event: dict[int, list[float]] = {size: [] for size in sizes}
    counts: dict[int, list[int]] = {size: [] for size in sizes}
    with tempfile.TemporaryDirectory(prefix="storm-") as tmp, trio.fail_after(CEILING):
        base = Path(tmp)
        repo = base / "repo"
        repo.mkdir()
        for index in range(DIRS):
            (repo / f"d{index}").mkdir()
            for name in range(20 // DIRS + 1):
                (repo / f"d{index}" / f"file{name}.txt").write_text("x\n")
        script = write_script(base, calls)
        await storm(base, repo, script, min(sizes), counter)  # warm-up
        for rep in range(reps):
            for size in sizes if rep % 2 == 0 else list(reversed(sizes)):
                cpu, events = await storm(base, repo, script, size, counter)
                per_event[size].append(cpu / events * 1e6)
                counts[size].append(events)
            print(
                f"rep {rep + 1}/{reps}: "
                + ", ".join(
                    f"{size} children {per_event[size][-1]:.1f} us/event" for size in sizes
                ),
                flush=True,
            )
    medians = {size: statistics.median(values) for size, values in per_event.items()}
    print(f"{'children':>9}{'events':>9}{'us/event (median)':>20}{'min':>8}{'max':>8}")
    for size in sizes:
        values = per_event[size]
        print(
            f"{size:>9}{statistics.median(counts[size]):>9.0f}{medians[size]:>20.1f}"
            f"{min(values):>8.1f}{max(values):>8.1f}"
        )
    ratio = medians[max(sizes)] / medians[min(sizes)]
    print(f"largest / smallest fleet, CPU per event: {ratio:.3f} (target <= {TARGET_RATIO})")
    return {
        "benchmark": "event_storm",
        "us_per_event": {str(size): round(medians[size], 1) for size in sizes},
        "flatness_ratio": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Supervisor CPU per child event by fleet size.")
    parser.add_argument("--sizes", default="8,16,32", help="fleet sizes (comma-separated)")
    parser.add_argument("--calls", type=int, default=100, help="tool calls per child's storm")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (medians)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run that checks the script works (its figures mean nothing)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.calls, args.reps = "1,2", 5, 1
    sizes = sorted({int(size) for size in args.sizes.split(",")})
    result = trio.run(bench, sizes, args.calls, args.reps)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
