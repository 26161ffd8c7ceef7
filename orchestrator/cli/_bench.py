"""``fleet bench``: the quick figures on this machine, each beside its floor from the same run.

A throwaway session (its own ``FLEET_HOME`` and git repository under a temporary directory)
is started with ``fleet serve``; every figure is timed against a baseline measured
interleaved with it, because a shared machine's load changes from second to second:

- a warm verb (``peek --json``, ``wait --timeout 0``) against ``python -c pass``;
- spawn→settled of one scripted child, forked (``FLEET_SANDBOX=off``) and sandboxed (the
  default), against ``python -c pass`` (the floor of any new process; a fork pays less);
- an idle child's RSS against an idle ``python -c`` interpreter's.

- authenticated IPC round trips against a raw echo of the same bytes
  (:mod:`orchestrator.control._ipcbench`: both ends in this process; the two-process version,
  with pipelined events, is ``benchmarks/ipc_throughput.py``).

Fully offline; about half a minute at the default ``--runs``.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator._errors import OperationFailed, UsageError
from orchestrator.control._ipcbench import measure_ipc

MAX_SPAWNS = 4  # the default retained-fleet cap: the children stay, idle, to be measured
SCRIPT = "turns:\n  - steps:\n      - reply: done\n"


def fleet_argv() -> list[str]:
    """How a user runs ``fleet``: the console script beside this interpreter, if installed."""
    script = Path(sys.executable).with_name("fleet")
    return [str(script)] if script.exists() else [sys.executable, "-P", "-m", "orchestrator"]


def timed(argv: Sequence[str], env: dict[str, str], cwd: Path) -> float:
    """Wall milliseconds of one process; a failure is an error (a figure must be real)."""
    start = time.perf_counter()
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=False)
    elapsed = (time.perf_counter() - start) * 1000
    if result.returncode != 0:
        detail = result.stderr.decode(errors="replace").strip().splitlines()
        raise OperationFailed(f"bench: {' '.join(argv[-3:])} failed: {detail[-1:] or '?'}")
    return elapsed


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise OperationFailed(f"bench: no RSS for process {pid}")


def child_pids(home: Path) -> list[int]:
    """The bench session's children: processes of ``child`` under *home* with a run marker,
    or forks of the fork server (their environment is the server's, without a marker)."""
    found: dict[int, tuple[bool, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        is_child = any(arg.split(b".")[0] == b"child" for arg in cmdline[1:4])
        if f"FLEET_HOME={home}".encode() in environ and is_child:
            marked = any(item.startswith(b"FLEET_RUN=") for item in environ)
            found[int(entry.name)] = (marked, ppid)
    return [pid for pid, (marked, ppid) in found.items() if marked or ppid in found]


def figure(
    name: str, values: list[float], floor_name: str, floors: list[float], unit: str
) -> dict[str, Any]:
    value, floor = statistics.median(values), statistics.median(floors)
    spread = [min(values), max(values)]
    return {
        "name": name,
        "value": round(value, 2),
        "spread": [round(v, 2) for v in spread],
        "unit": unit,
        "floor_name": floor_name,
        "floor": round(floor, 2),
        "ratio": round(value / floor, 2) if floor else None,
    }


class Session:
    """A private supervisor for the bench, stopped (and its directory removed) at the end."""

    def __init__(self, root: Path, **settings: str) -> None:
        self.root = root
        self.repo = root / "repo"
        self.home = root / "home"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        self.env = env | {"FLEET_HOME": str(self.home), "FLEET_SESSION": "bench"} | settings
        self.fleet = fleet_argv()
        self.script = root / "done.yaml"
        self.repo.mkdir(parents=True)
        self.script.write_text(SCRIPT)
        (self.repo / "README.md").write_text("bench\n")
        identity = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
        for argv in (["init", "-q"], ["add", "README.md"], [*identity, "commit", "-qm", "b"]):
            subprocess.run(
                ["git", *argv], cwd=self.repo, env=self.env, capture_output=True, check=True
            )

    def verb(self, *args: str) -> float:
        return timed([*self.fleet, *args], self.env, self.repo)

    def call(self, *args: str) -> Any:
        result = subprocess.run(
            [*self.fleet, *args, "--json"],
            env=self.env,
            cwd=self.repo,
            capture_output=True,
            check=False,
        )
        if result.returncode != 0:
            raise OperationFailed(f"bench: fleet {args[0]} failed: {result.stdout!r}")
        return json.loads(result.stdout)


def measure(runs: int, spawns: int, log: Callable[[str], None]) -> dict[str, Any]:
    python = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        sandboxed = Session(Path(tmp) / "sandboxed")
        forked = Session(Path(tmp) / "forked", FLEET_SANDBOX="off", FLEET_ALLOW_UNSANDBOXED="1")
        env, cwd = sandboxed.env, sandboxed.repo
        log("starting two throwaway supervisors (sandboxed children, forked children)")
        sandboxed.verb("serve")
        try:
            forked.verb("serve")
            floors: list[float] = []
            peeks: list[float] = []
            waits: list[float] = []
            log(f"warm verbs: {runs} runs each")
            for _ in range(runs):
                floors.append(timed(python, env, cwd))
                peeks.append(sandboxed.verb("peek", "--json"))
                waits.append(sandboxed.verb("wait", "--timeout", "0", "--json"))
            spawn_floors: list[float] = []
            spawned: dict[str, list[float]] = {"forked": [], "sandboxed": []}
            log(f"spawn→settled: {spawns} children forked and {spawns} sandboxed")
            for index in range(spawns):
                spawned["forked"].append(session_spawn(forked, index))
                spawned["sandboxed"].append(session_spawn(sandboxed, index))
                spawn_floors.append(timed(python, env, cwd))
            log("idle child memory")
            rss = {
                name: [rss_kb(pid) / 1024 for pid in child_pids(session.home)]
                for name, session in (("forked", forked), ("sandboxed", sandboxed))
            }
            idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            try:
                time.sleep(0.3)
                floor_rss = [rss_kb(idle.pid) / 1024]
            finally:
                idle.kill()
                idle.wait()
        finally:
            forked.verb("serve", "--stop")
            sandboxed.verb("serve", "--stop")
    log("ipc round trips against a raw echo")
    rounds = measure_ipc()
    figures = [
        figure("peek --json", peeks, "python -c pass", floors, "ms"),
        figure("wait --timeout 0", waits, "python -c pass", floors, "ms"),
    ]
    kinds = ("forked", "sandboxed")
    figures += [
        figure(f"spawn→settled, {name}", spawned[name], "python -c pass", spawn_floors, "ms")
        for name in kinds
    ]
    figures += [
        figure(f"idle child RSS, {name}", rss[name], "idle python RSS", floor_rss, "MB")
        for name in kinds
        if rss[name]
    ]
    figures.append(figure("ipc round trips", rounds["ipc"], "raw echo", rounds["raw"], "/s"))
    return {
        "benchmark": "fleet_bench",
        "runs": runs,
        "spawns": spawns,
        "load": list(os.getloadavg()),
        "figures": figures,
    }


def session_spawn(session: Session, index: int) -> float:
    """Wall ms from ``fleet spawn`` of a one-reply scripted child to its settled note."""
    start = time.perf_counter()
    data = session.call("spawn", "--model", f"scripted:{session.script}", f"bench {index}")
    key = data["agents"][0]["key"]
    session.call("wait", key, "--timeout", "60")
    return (time.perf_counter() - start) * 1000


def render(result: dict[str, Any]) -> str:
    rows = [("figure", "p50", "spread", "floor", "floor p50", "ratio")]
    for f in result["figures"]:
        low, high = f["spread"]
        rows.append(
            (
                f["name"],
                f"{f['value']:.1f} {f['unit']}".replace(" /s", "/s"),
                f"{low:.1f}-{high:.1f}",
                f["floor_name"],
                f"{f['floor']:.1f} {f['unit']}".replace(" /s", "/s"),
                f"{f['ratio']:.2f}x" if f["ratio"] is not None else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    load = ", ".join(f"{x:.2f}" for x in result["load"])
    lines.append(f"load average {load}; {result['runs']} runs, {result['spawns']} spawns each")
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.runs < 1 or not 1 <= args.spawns <= MAX_SPAWNS:
        raise UsageError(f"bench: --runs must be at least 1, --spawns 1 to {MAX_SPAWNS}")

    def log(text: str) -> None:
        if not args.json:
            print(f"fleet bench: {text}", file=sys.stderr)

    result = measure(args.runs, args.spawns, log)
    print(json.dumps(result) if args.json else render(result))
    return 0
