"""Benchmarks are code too: each script in ``benchmarks/`` runs its ``--smoke`` mode (the whole
script, shrunk to seconds) and must end with its one JSON line.

A smoke run's figures mean nothing (a handful of samples on a shared box); what it proves is
that the script still runs against today's code — ``fleet_overhead.py`` crashed in its default
run for a whole round (its stand-in host lacked the loop gate's ``check_tool``) and nothing
noticed.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
#: A smoke run's ceiling, and the grace after its JSON line before it is killed (a Ray driver
#: can hang at exit; see tests/conftest.py).
SMOKE_TIMEOUT_S = 240
EXIT_GRACE_S = 30

SCRIPTS = sorted(path.stem for path in (ROOT / "benchmarks").glob("*.py"))

CASES = [
    pytest.param("cli_latency", [], id="cli_latency"),
    pytest.param("door_roundtrips", [], id="door_roundtrips"),
    pytest.param("event_storm", [], id="event_storm"),
    pytest.param("fault_soak", [], id="fault_soak"),
    pytest.param("fleet_memory", [], id="fleet_memory"),
    pytest.param(
        "fleet_memory", ["--hibernate"], id="fleet_memory-hibernate", marks=pytest.mark.needs("pi")
    ),
    pytest.param("fleet_overhead", [], id="fleet_overhead"),
    pytest.param("fork_tls", [], id="fork_tls"),
    pytest.param(
        "fleet_overhead",
        ["--sandboxed"],
        id="fleet_overhead-sandboxed",
        marks=pytest.mark.needs("sandbox"),
    ),
    pytest.param("gateway", [], id="gateway"),
    pytest.param("ipc_throughput", [], id="ipc_throughput"),
    pytest.param("map", [], id="map", marks=pytest.mark.needs("sandbox")),
    pytest.param("parent_tools", [], id="parent_tools"),
    pytest.param("ray_fleet", [], id="ray_fleet"),
    pytest.param("worktree", [], id="worktree"),
]


def test_every_benchmark_has_a_smoke_case() -> None:
    assert sorted({str(case.values[0]) for case in CASES}) == SCRIPTS


def _last_json(text: str) -> dict[str, object] | None:
    lines = text.strip().splitlines()
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@pytest.mark.parametrize(("script", "extra"), CASES)
def test_a_benchmarks_smoke_run_completes_and_prints_its_json_line(
    script: str, extra: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    argv = [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--smoke", *extra]
    # The benchmarks import the packages from the repository (and tests.fakes from its root).
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with out.open("wb") as sink:
        child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
        started = time.monotonic()
        printed_at = None
        hung_at_exit = False
        while child.poll() is None:
            now = time.monotonic()
            if printed_at is None and _last_json(out.read_text(errors="replace")):
                printed_at = now
            late = printed_at is not None and now - printed_at > EXIT_GRACE_S
            if late or now - started > SMOKE_TIMEOUT_S:
                hung_at_exit = late
                child.kill()
                child.wait()
                break
            time.sleep(0.2)
    text = out.read_text(errors="replace")
    result = _last_json(text)
    assert result is not None, (
        f"{script} {extra}: no JSON last line (exit {child.returncode})\n{text}"
    )
    assert str(result.get("benchmark", "")).startswith(script), text  # fleet_memory_hibernate
    # Killed only after its JSON line: the Ray driver's freeze at exit, not the script's fault.
    assert child.returncode == 0 or hung_at_exit, (
        f"{script} {extra}: exit {child.returncode}\n{text}"
    )
