"""The set-up ``make test`` does: ``scripts/system-packages`` (one line, apt only for what is
missing, a clear failure before any test otherwise) and the Makefile's stamps (a second run
redoes nothing; a step reruns when its input changes or its product is gone)."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._needs import REPO

SCRIPT = REPO / "scripts" / "system-packages"
TOOLS = [
    "git",
    "tmux",
    "bwrap",
    "rg",
    "fdfind",
    "node",
    "npm",
    "ip",
    "unshare",
    "chromium",
    "chromedriver",
]
BASH = shutil.which("bash") or "/bin/bash"

# Stands in for apt-get: records its argv, and "installs" a package by adding its command.
FAKE_APT = """#!/bin/sh
echo "$*" >> {log}
[ "$1" = install ] && /bin/ln -s /bin/true {bin}/tmux
exit 0
"""


def tool_path(tmp_path: Path, tools: list[str], *, apt: bool) -> Path:
    """A PATH directory holding *tools* (stand-ins: only their presence is checked), ``id``
    and, with *apt*, a fake apt-get."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in tools:
        (bin_dir / name).symlink_to("/bin/true")
    (bin_dir / "id").symlink_to(shutil.which("id") or "/usr/bin/id")
    for name in ("mktemp", "tail", "rm"):
        (bin_dir / name).symlink_to(shutil.which(name) or f"/bin/{name}")
    if apt:
        fake = bin_dir / "apt-get"
        fake.write_text(FAKE_APT.format(log=tmp_path / "apt.log", bin=bin_dir))
        fake.chmod(0o755)
    return bin_dir


def system_packages(
    bin_dir: Path, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(SCRIPT)],
        env={"PATH": str(bin_dir), "PYTHON": python},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_all_present_is_one_line_and_no_apt(tmp_path):
    bin_dir = tool_path(tmp_path, TOOLS, apt=True)
    done = system_packages(bin_dir)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        "system packages: all present "
        "(git tmux bwrap rg fd node npm ip unshare venv chromium chromedriver)\n"
    )
    assert not (tmp_path / "apt.log").exists()


def test_missing_without_apt_fails_in_one_line_naming_it_and_how(tmp_path):
    bin_dir = tool_path(tmp_path, [t for t in TOOLS if t not in {"tmux", "bwrap"}], apt=False)
    started = time.monotonic()
    done = system_packages(bin_dir, python="/bin/false")  # a Python without venv
    assert time.monotonic() - started < 5
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        "system packages: missing tmux bwrap venv; install with: your package manager "
        "(Debian names: tmux bubblewrap python3-venv)\n"
    )


def test_missing_with_apt_installs_only_what_is_missing(tmp_path):
    bin_dir = tool_path(tmp_path, [t for t in TOOLS if t != "tmux"], apt=True)
    done = system_packages(bin_dir)
    if os.geteuid() != 0:
        # Not root: the same one line, with the command to run.
        assert done.returncode == 1
        assert done.stderr == (
            "system packages: missing tmux; install with: sudo apt-get install tmux\n"
        )
        assert not (tmp_path / "apt.log").exists()
        return
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout == "system packages: apt-get install tmux\n"
    assert (tmp_path / "apt.log").read_text().splitlines() == [
        "update -qq",
        "install -y -qq --no-install-recommends tmux",
    ]


# --- the Makefile's stamps ----------------------------------------------------------------------

#: each stamp's product, made before its stamp so that the stamp is newer
PRODUCTS = {
    ".make/system": None,
    ".make/clis": ".npm-prefix/bin/codex",
    ".make/venv": ".venv/bin/fleet",
    ".make/venv-test": ".venv/bin/pytest",
}


INPUTS = ("Makefile", "pyproject.toml", "scripts/system-packages", "scripts/install-agent-clis")


@pytest.fixture
def made(tmp_path):
    """A copy of the Makefile and its inputs, set up as a finished `make test` leaves it."""
    for name in (
        "Makefile",
        "pyproject.toml",
        "scripts/system-packages",
        "scripts/install-agent-clis",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tmp_path / name)
    moment = time.time() - 100
    for name in INPUTS:
        os.utime(tmp_path / name, (moment, moment))
    for stamp, product in PRODUCTS.items():
        for path in filter(None, [product, stamp]):
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).touch()
            moment += 1
            os.utime(tmp_path / path, (moment, moment))
    return tmp_path


def dry_run(directory: Path, target: str = "test") -> list[str]:
    """What `make TARGET` would run, one command per line."""
    # Not the flags of a `make test` that runs this suite.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def ran(commands: list[str], what: str) -> bool:
    return any(what in line for line in commands)


@pytest.mark.needs("make")
def test_a_second_make_test_redoes_no_set_up(made):
    test = ".venv/bin/python -m pytest -q -n 3 --dist loadgroup"
    assert dry_run(made) == [f"{test} --durations=15"]
    assert dry_run(made, "test-fast") == [f"{test} -m 'not slow'"]
    assert dry_run(made, "demo") == [".venv/bin/fleet demo"]


@pytest.mark.needs("make")
def test_a_step_reruns_when_its_input_changes_or_its_product_is_gone(made):
    os.utime(made / "scripts" / "install-agent-clis")
    commands = dry_run(made)
    assert ran(commands, "scripts/install-agent-clis")
    assert not ran(commands, "scripts/system-packages")
    assert not ran(commands, "pip")

    (made / ".make" / "clis").touch()
    (made / ".npm-prefix" / "bin" / "codex").unlink()
    assert ran(dry_run(made), "scripts/install-agent-clis")

    (made / ".make" / "clis").unlink()
    (made / ".npm-prefix" / "bin" / "codex").touch()
    (made / ".make" / "clis").touch()
    os.utime(made / "pyproject.toml")
    commands = dry_run(made)
    assert ran(commands, "install -q -e .")
    assert ran(commands, "install -q -e '.[test,dev]'")
    assert not ran(commands, "scripts/")
    # `make demo` sets up only the runtime, never the test extras nor the CLIs.
    demo = dry_run(made, "demo")
    assert ran(demo, "install -q -e .")
    assert not ran(demo, "[test,dev]")
    assert not ran(demo, "scripts/")
