"""``@pytest.mark.needs``: a test that needs something absent fails in its set-up, at once, in
one line naming what is missing and how to get it; never a skip, never a timeout."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests._needs import REPO

TESTS = """
import pytest

@pytest.mark.needs({names})
def test_it(tmp_path):
    open({ran!r}, "w").close()
"""


def run_pytest(
    tmp_path: Path, names: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """pytest on one test marked ``needs(names)``, with this suite's hooks and settings."""
    ran = tmp_path / "ran"
    test = tmp_path / "test_x.py"
    test.write_text(textwrap.dedent(TESTS.format(names=names, ran=str(ran))))
    command = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", "pyproject.toml"]
    command += ["--rootdir", str(REPO), "-q", "-p", "no:cacheprovider", "--durations=0"]
    command += ["--durations-min=0", "-rA", str(test)]
    done = subprocess.run(
        command,
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO)} | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, ran


def setup_seconds(output: str) -> float:
    [seconds] = re.findall(r"^([\d.]+)s setup ", output, re.MULTILINE)
    return float(seconds)


def error_section(output: str) -> list[str]:
    """The lines pytest prints for the set-up error, between its header and the next rule."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if "ERROR at setup of test_it" in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("====="))
    return lines[start + 1 : end]


def test_a_command_missing_from_path_fails_the_test_in_its_setup_in_one_line(tmp_path):
    done, ran = run_pytest(tmp_path, '"git", "tmux"', PATH=str(tmp_path / "empty"))
    assert done.returncode == 1, done.stdout + done.stderr
    line = (
        "needs git: not on PATH; `make test` installs it (scripts/system-packages: apt-get "
        "install git)"
    )
    assert error_section(done.stdout) == [line]
    assert "skipped" not in done.stdout
    assert "1 error" in done.stdout
    assert not ran.exists()  # the test's body never started
    assert setup_seconds(done.stdout) < 1.0


def test_a_missing_pinned_cli_names_its_path_and_the_script(tmp_path):
    empty = tmp_path / "npm-bin"
    empty.mkdir()
    done, ran = run_pytest(tmp_path, '"pi-next"', FLEET_TEST_NPM_BIN=str(empty))
    assert done.returncode == 1, done.stdout + done.stderr
    line = f"needs pi-next: {empty}/pi-next is missing; `make test` installs it"
    assert error_section(done.stdout) == [f"{line} (scripts/install-agent-clis)"]
    assert not ran.exists()
    assert setup_seconds(done.stdout) < 1.0


def test_what_is_present_runs_the_test(tmp_path):
    (tmp_path / "npm-bin").mkdir()
    pi = tmp_path / "npm-bin" / "pi"
    pi.write_text("#!/bin/sh\n")
    pi.chmod(0o755)
    done, ran = run_pytest(tmp_path, '"sh", "pi"', FLEET_TEST_NPM_BIN=str(pi.parent))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert ran.exists()
