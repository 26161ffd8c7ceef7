"""``fleet demo --ray``: the demo's three scouts on a local Ray cluster the demo starts itself.

The real CLI in its own process, with no ``FLEET_*`` setting and no cluster given: it must start
a cluster whose node has ``agent_slot`` (without one every child would queue for ever), connect
once although three launches race to, and take the cluster down with it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow


def ray_heads() -> set[int]:
    """Every live ``gcs_server`` (one per Ray cluster on this machine)."""
    found = set()
    for process in psutil.process_iter(["pid", "name"]):
        if process.info["name"] == "gcs_server":
            found.add(process.info["pid"])
    return found


def test_the_demo_runs_its_scouts_on_a_local_ray_cluster_and_takes_it_down(
    tmp_path: Path,
) -> None:
    before = ray_heads()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_"))}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "demo", "--ray", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    data = json.loads(done.stdout)
    assert data["surface"] == "ray"
    reports = data["reports"]
    assert [r["name"] for r in reports] == ["layout", "rounding", "tests"]
    assert all(r["state"] == "stopped" and r["error"] == "" for r in reports), reports
    assert "round_price" in reports[1]["last"]  # each scout really read the sample repository
    # The cluster it started went with it (the test's own clusters, if any, are left alone).
    leftover = {pid for pid in ray_heads() - before if psutil.pid_exists(pid)}
    assert not leftover, f"the demo left its Ray cluster running: {leftover}"
