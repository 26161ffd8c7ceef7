"""``scripts/suite-cpu``: a module's CPU time counted in a cgroup of its own, daemons included."""

import json
import subprocess
import sys

import pytest

from tests._needs import REPO

SCRIPT = REPO / "scripts" / "suite-cpu"

pytestmark = pytest.mark.needs("cgroup")


def test_a_module_run_alone_reports_its_cpu_and_the_floor(tmp_path):
    # A module whose test burns a second of CPU in a detached grandchild (setsid, not waited
    # for by pytest): rusage would miss it; the cgroup counts it.
    module = tmp_path / "test_burn.py"
    module.write_text(
        "import subprocess, sys, time\n\n"
        "def test_burn():\n"
        "    code = 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 1.0: pass'\n"
        "    subprocess.Popen(['setsid', sys.executable, '-c', code]).wait()\n"
    )
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(module)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["benchmark"] == "suite_cpu"
    assert result["total_cpu_s"] >= 1.0, result  # the grandchild's second is counted
    assert result["floor_s"] == pytest.approx(result["total_cpu_s"] / result["cores"], abs=0.1)


def test_a_failing_module_fails_the_run_and_names_its_log(tmp_path):
    module = tmp_path / "test_fails.py"
    module.write_text("def test_fails():\n    assert False\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(module)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert f"failed: {module}" in done.stdout
