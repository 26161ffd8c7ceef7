"""A warm CLI verb's wall time against ``python -c pass``, measured interleaved in one run.

An LLM parent calls ``fleet peek --json`` and ``fleet wait --timeout 0`` in a loop, so a verb
on a running supervisor must cost little more than starting an interpreter (DESIGN §13:
<= 3x, stretch 2x). A throwaway session (its own ``FLEET_HOME`` and git repository) is
started with ``fleet serve`` and given a few retained children (one-reply scripted scouts,
unsandboxed: a verb's cost does not depend on where the children run); then each round times
``python -c pass``, ``fleet peek --json`` and ``fleet wait --timeout 0 --json`` back to back,
each as a fresh process (the ``fleet`` console script beside this interpreter), and for
comparison ``peek --json`` through the full command line (``cli._main``: what every other verb
costs). Each ratio is the median of the per-round ratios. The bytecode caches of
``orchestrator`` are refreshed first (``compileall``), as an installed package has them: with
``PYTHONDONTWRITEBYTECODE`` set, every verb would otherwise compile the modules it imports.
The last line printed is one JSON object.

Usage: ``python benchmarks/cli_latency.py [--rounds N] [--children N]``
"""

import argparse
import compileall
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import orchestrator
from orchestrator.cli._bench import Session, session_spawn, timed

TARGET = 3.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds (default 20)")
    parser.add_argument("--children", type=int, default=3, help="retained children (default 3)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run that checks the script works (its figures mean nothing)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.children = 2, 1
    compileall.compile_dir(Path(orchestrator.__file__).parent, quiet=1)
    python = [sys.executable, "-c", "pass"]
    full = [sys.executable, "-c", "from orchestrator.cli._main import main; main()"]
    samples: dict[str, list[float]] = {"python": [], "peek": [], "wait": [], "full": []}
    with tempfile.TemporaryDirectory(prefix="fleet-cli-latency-") as tmp:
        session = Session(Path(tmp), FLEET_SANDBOX="off", FLEET_ALLOW_UNSANDBOXED="1")
        session.verb("serve")
        try:
            for index in range(args.children):
                session_spawn(session, index)
            session.verb("peek", "--json")  # warm the caches once
            for _ in range(args.rounds):
                samples["python"].append(timed(python, session.env, session.repo))
                samples["peek"].append(session.verb("peek", "--json"))
                samples["wait"].append(session.verb("wait", "--timeout", "0", "--json"))
                samples["full"].append(timed([*full, "peek", "--json"], session.env, session.repo))
        finally:
            session.verb("serve", "--stop")
    ratios = {
        verb: statistics.median(
            v / p for v, p in zip(samples[verb], samples["python"], strict=True)
        )
        for verb in ("peek", "wait", "full")
    }
    print(f"{'process':28} {'p50 ms':>8} {'min-max ms':>16} {'ratio':>6}")
    for name, label in (
        ("python", "python -c pass"),
        ("peek", "fleet peek --json"),
        ("wait", "fleet wait --timeout 0"),
        ("full", "peek --json, full CLI path"),
    ):
        values = samples[name]
        ratio = f"{ratios[name]:.2f}" if name in ratios else "1"
        spread = f"{min(values):.1f}-{max(values):.1f}"
        print(f"{label:28} {statistics.median(values):8.1f} {spread:>16} {ratio:>6}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average {load}; {args.rounds} rounds, {args.children} retained children")
    result = {
        "benchmark": "cli_latency",
        "peek_ratio": round(ratios["peek"], 3),
        "wait_ratio": round(ratios["wait"], 3),
        "full_path_peek_ratio": round(ratios["full"], 3),
        "python_pass_ms": round(statistics.median(samples["python"]), 1),
        "peek_ms": round(statistics.median(samples["peek"]), 1),
        "wait_ms": round(statistics.median(samples["wait"]), 1),
        "children": args.children,
        "target": TARGET,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
