"""Fixtures for end-to-end tests: a real git repo, a private FLEET_HOME, the real CLI."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest

from orchestrator._config import SessionPaths
from orchestrator._runtime import session_runtime

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "README.md").write_text("# sample\n\nThe answer is 42.\n")
    (path / "src").mkdir(exist_ok=True)
    (path / "src" / "app.py").write_text("def main():\n    return 42\n")
    env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=path, env=env, check=True, capture_output=True)
    return path


def fleet_processes(home: Path) -> list[psutil.Process]:
    """Every live process that belongs to the fleet under *home*."""
    found = []
    marker = str(home)
    # Its sessions, not the home alone: every sandbox of every fleet names each other home
    # of the user it hides on its command line (``--tmpfs HOME``).
    sessions = str(home / "sessions")
    for process in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            if process.pid == os.getpid():
                continue
            cmdline = " ".join(process.info["cmdline"] or [])
            environ = process.info["environ"] or {}
            mine = sessions in cmdline or environ.get("FLEET_HOME") == marker
            if mine and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


@attrs.define
class Fleet:
    repo: Path
    home: Path
    scripts: Path
    env: dict[str, str]

    @property
    def paths(self) -> SessionPaths:
        """The session's state directory, and its sockets and secrets in the runtime root."""
        root = self.home / "sessions" / self.env["FLEET_SESSION"]
        return SessionPaths(root, runtime=session_runtime(root, self.env))

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=self.repo,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def json(self, *args: str, code: int = 0, timeout: float = 60) -> Any:
        result = self.run(*args, "--json", timeout=timeout)
        assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
        return json.loads(result.stdout)

    def script(self, name: str, text: str) -> str:
        path = self.scripts / f"{name}.yaml"
        path.write_text(textwrap.dedent(text))
        return f"scripted:{path}"


@contextlib.contextmanager
def running_fleet(
    tmp_path: Path,
    *,
    prefix: str = "flh-",
    session: str = "t",
    env: dict[str, str] | None = None,
    home_dir: str = "/tmp",
) -> Iterator[Fleet]:
    """A real CLI fleet on a private ``FLEET_HOME`` under *home_dir*; on exit its supervisor
    is stopped and no process of it may survive."""
    home = Path(tempfile.mkdtemp(prefix=prefix, dir=home_dir))
    # A second fleet of the test (another home_dir) gets its own repository and scripts.
    suffix = "" if home_dir == "/tmp" else f"-{home.name}"
    scripts = tmp_path / f"scripts{suffix}"
    scripts.mkdir()
    full = {**os.environ, **GIT_ENV, "FLEET_HOME": str(home), "FLEET_SESSION": session}
    full.pop("FLEET_MODEL", None)
    full.update(env or {})
    repo = make_repo(tmp_path / f"repo{suffix}")
    fleet = Fleet(repo=repo, home=home, scripts=scripts, env=full)
    try:
        yield fleet
    finally:
        fleet.run("serve", "--stop", timeout=90)
        deadline = time.monotonic() + 15
        while fleet_processes(home) and time.monotonic() < deadline:
            time.sleep(0.1)
        leftovers = fleet_processes(home)
        for process in leftovers:
            process.kill()
        shutil.rmtree(home, ignore_errors=True)
        assert not leftovers, f"fleet processes survived the test: {leftovers}"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with running_fleet(tmp_path) as fleet:
        yield fleet
