"""Soak the fault suite: run ``tests/faults`` again and again, count failures and orphans.

Each run is a fresh ``pytest`` process (``-p no:cacheprovider``) whose scenarios put their
``FLEET_HOME`` under a per-run prefix (``FLEET_FAULTS_PREFIX``). After a run, every process whose
argv or ``FLEET_HOME`` lies under that prefix is an orphan: it is counted and killed. Target:
0 failures, 0 orphans. The last line is one JSON object::

    {"benchmark": "fault_soak", "scenarios": N, "runs": R, "failures": F, "orphans": O}

Usage: ``.venv/bin/python benchmarks/fault_soak.py [--runs 10] [--smoke] [-- extra pytest args]``
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
SETTLE = 3.0  # seconds for the last processes of a run to go before they count as orphans
#: ``--smoke``: one quick real-child scenario instead of the whole fault suite.
SMOKE_TARGET = (
    "tests/faults/test_quick_faults.py::test_a_childs_own_token_never_reaches_its_log_or_tail"
)


def orphans(prefix: str) -> list[psutil.Process]:
    # A home's sessions, not the home alone: every sandbox of every fleet names each other home
    # of the user it hides on its command line (``--tmpfs HOME``), a parallel run's included.
    sessions = re.compile(re.escape(prefix) + r"[^/\s]*/sessions")
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
            home = (process.info["environ"] or {}).get("FLEET_HOME", "")
            mine = bool(sessions.search(cmdline)) or home.startswith(prefix)
            if mine and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def settle_orphans(prefix: str) -> int:
    """Wait up to SETTLE for the run's processes to go; kill and count the rest."""
    deadline = time.monotonic() + SETTLE
    while orphans(prefix) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = orphans(prefix)
    for process in left:
        try:
            process.kill()
        except psutil.Error:
            continue
    return len(left)


def one_run(
    index: int, extra: list[str], scratch: Path, target: str = "tests/faults"
) -> dict[str, float | int]:
    # Short and under /tmp: the scenarios' socket paths must fit sun_path.
    prefix = f"/tmp/fsoak-{os.getpid()}-r{index}-"  # noqa: S108
    report = scratch / f"run{index}.xml"
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            target,
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={report}",
            *extra,
        ],
        cwd=ROOT,
        env={**os.environ, "FLEET_FAULTS_PREFIX": prefix},
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - started
    try:
        suite = ET.parse(report).getroot()  # noqa: S314 - pytest's own report
        suite = suite if suite.tag == "testsuite" else suite[0]
        tests = int(suite.get("tests", 0)) - int(suite.get("skipped", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    except (OSError, ET.ParseError, IndexError):
        tests, failed = 0, 1
    if failed or result.returncode not in {0, 1}:
        tail = "\n".join(result.stdout.strip().splitlines()[-15:])
        print(f"--- run {index}: pytest exited {result.returncode} ---\n{tail}", file=sys.stderr)
    return {
        "run": index,
        "scenarios": tests,
        "failures": failed,
        "orphans": settle_orphans(prefix),
        "seconds": round(seconds, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run that checks the script works: one run of one quick scenario",
    )
    parser.add_argument("extra", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()
    target = SMOKE_TARGET if args.smoke else "tests/faults"
    if args.smoke:
        args.runs = 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="fault-soak-") as scratch:
        for index in range(1, args.runs + 1):
            row = one_run(index, args.extra, Path(scratch), target)
            rows.append(row)
            print(
                f"run {row['run']:>3}  scenarios {row['scenarios']:>3}  failures "
                f"{row['failures']:>3}  orphans {row['orphans']:>3}  {row['seconds']:>6.1f} s",
                flush=True,
            )
    failures = sum(int(r["failures"]) for r in rows)
    orphan_count = sum(int(r["orphans"]) for r in rows)
    print(
        f"total: {len(rows)} runs, {failures} failures, {orphan_count} orphans, "
        f"{sum(float(r['seconds']) for r in rows):.0f} s"
    )
    summary = {
        "benchmark": "fault_soak",
        "scenarios": max((int(r["scenarios"]) for r in rows), default=0),
        "runs": len(rows),
        "failures": failures,
        "orphans": orphan_count,
    }
    print(json.dumps(summary))
    return 0 if failures == 0 and orphan_count == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
