"""The fault suite's harness: real processes, the real clock, short configured budgets.

Every scenario runs real ``python -m child`` processes (or a deliberately misbehaving stand-in,
``_rogue.py``, launched the same way) against a real supervisor, then checks the invariants
every failure must keep: one terminal state, the slot, lane and locks given back, the failure
shown in exactly one ``wait`` note, and no process left alive. Teardown fails a test that leaves
any process of its ``FLEET_HOME`` behind.

``FLEET_FAULTS_PREFIX`` (set by ``benchmarks/fault_soak.py``) names the directory prefix for each
test's ``FLEET_HOME``, so an outside scan can count orphans the suite itself missed.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
import trio

from orchestrator._config import Config
from orchestrator._records import TERMINAL, State
from orchestrator.core._supervisor import Supervisor

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}
ROGUE = Path(__file__).with_name("_rogue.py")
#: How long a process may take to disappear after its supervisor says it ended.
REAP_SLACK = 5.0


def home_prefix() -> str:
    return os.environ.get("FLEET_FAULTS_PREFIX", "/tmp/flf-")


def fleet_processes(home: Path) -> list[psutil.Process]:
    """Every live, non-zombie process of the fleet under *home* (by argv or environment)."""
    marker = str(home)
    # Its sessions, not the home alone: every sandbox of every fleet names each other home of
    # the user it hides on its command line (``--tmpfs HOME``), a parallel test's included.
    sessions = str(home / "sessions")
    found = []
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


def running(pids: list[int]) -> list[int]:
    """Those of *pids* still running (zombies count as gone)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            continue
    return alive


@attrs.define
class Faults:
    """One scenario's world: a git repository, scripts, agents and a private FLEET_HOME."""

    home: Path
    repo: Path
    scripts: Path
    daemon: bool = False

    def script(self, name: str, text: str) -> str:
        path = self.scripts / f"{name}.yaml"
        path.write_text(textwrap.dedent(text))
        return f"scripted:{path}"

    def agent(self, name: str, **front: Any) -> None:
        directory = self.repo / ".fleet" / "agents"
        directory.mkdir(parents=True, exist_ok=True)
        header = json.dumps({"name": name, "description": f"fault agent {name}", **front})
        (directory / f"{name}.md").write_text(f"---\n{header}\n---\nYou are a test agent.\n")

    def config(self, **overrides: Any) -> Config:
        settings: dict[str, Any] = {"agents_scope": "project", "kill_grace": 1.0, **overrides}
        return Config(home=self.home, session="t", workspace=self.repo, **settings)

    def rogue(self) -> str:
        """An interpreter path for ``Config(python=...)``: children named ``rogue-<act>``
        misbehave as ``_rogue.py`` says, every other child is the real one."""
        wrapper = self.scripts / "rogue-python"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {ROGUE} "$@"\n')
        wrapper.chmod(0o755)
        return str(wrapper)

    def rogue_config(self, **overrides: Any) -> Config:
        """Rogues speak the wire themselves: no sandbox, and a model nobody will run."""
        model = self.script("unused", "turns: []\n")
        return self.config(
            python=self.rogue(), sandbox="off", allow_unsandboxed=True, model=model, **overrides
        )

    def processes(self) -> list[psutil.Process]:
        return fleet_processes(self.home)

    def child_process(self, key: str) -> psutil.Process:
        """The ``python -m child`` process of *key* (inside bwrap when it is sandboxed), known
        by its run marker; a fork of the fork server carries the server's command line and is
        known by its name."""
        for process in self.processes():
            cmdline = process.info["cmdline"] or []
            marker = (process.info["environ"] or {}).get("FLEET_RUN", "")
            if (
                marker.startswith(f"t/{key}/")
                and cmdline[1:4] == ["-I", "-m", "child"]
                and os.path.basename(cmdline[0]) != "bwrap"
            ):
                return process
            with contextlib.suppress(psutil.Error):
                if "child._forkserver" in cmdline and process.name() == f"fleet {key}"[:15]:
                    return process
        raise AssertionError(f"no process for {key}")

    @staticmethod
    def tree(pid: int | None) -> list[int]:
        """*pid* and all its descendants now."""
        assert pid is not None
        try:
            return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
        except psutil.Error:
            return []

    def marked(self, key: str) -> list[int]:
        """Every process carrying *key*'s run marker in its environment, wherever it went."""
        marker = f"t/{key}/{os.getpid()}"
        return [
            process.pid
            for process in psutil.process_iter(["environ"])
            if (process.info["environ"] or {}).get("FLEET_RUN") == marker
        ]

    @staticmethod
    def cmdline(pid: int) -> list[str]:
        try:
            return psutil.Process(pid).cmdline()
        except psutil.Error:
            return []

    @staticmethod
    async def until(condition: Callable[[], bool]) -> None:
        """Poll *condition* (a state with no event of its own) until it holds."""
        while True:
            if condition():
                return
            await trio.sleep(0.02)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The real ``fleet`` command line against this scenario's FLEET_HOME."""
        self.daemon = True
        env = {**os.environ, **GIT_ENV, "FLEET_HOME": str(self.home), "FLEET_SESSION": "t"}
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=self.repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    async def ended(
        self,
        sup: Supervisor,
        key: str,
        *,
        state: State,
        kind: str | None = None,
        pids: Sequence[int] = (),
        capacity: int = 0,
        working: int = 0,
    ) -> dict[str, Any]:
        """Wait for *key* to end and check every invariant of an ending; return its note."""
        [note] = await sup.wait([key])
        record = sup.registry.find(key)
        assert record.state is state, (record.state, record.error)
        if kind is None:
            assert "failure" not in note
        else:
            assert note["failure"]["kind"] == kind, note["failure"]["tail"]
            assert note["failure"]["log"] == str(sup.paths.logs / f"{key}.log")
            assert "\n" not in note["failure"]["error"]
        # Later classifications (the kill's exit after a timeout) must not show it again.
        await trio.sleep(0.3)
        assert [n for n in sup.notes.pending if n["key"] == key] == []
        [again] = await sup.wait([key])
        assert "failure" not in again
        assert record.state in TERMINAL
        assert key not in sup.runs
        assert key not in sup.registry.records
        assert key not in sup.locks.snapshot()
        assert [q for q in sup.questions.values() if q.key == key] == []
        assert sup.capacity.used == capacity
        assert sup.lane.statistics()["working"] == working
        await self.gone(pids)
        return note

    async def gone(self, pids: Sequence[int]) -> None:
        """Every process of *pids* ends (zombies count as gone) within the reap slack."""
        with trio.move_on_after(REAP_SLACK):
            await self.until(lambda: not running(list(pids)))
        assert running(list(pids)) == [], f"processes survived: {running(list(pids))}"


def make_repo(path: Path) -> Path:
    (path / "src").mkdir(parents=True)
    (path / "README.md").write_text("# sample\n\nThe answer is 42.\n")
    (path / "src" / "app.py").write_text("def main():\n    return 42\n")
    env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=path, env=env, check=True, capture_output=True)
    return path


def reap_leftovers(home: Path) -> list[psutil.Process]:
    """Wait a little for *home*'s processes to go, then kill and return any that did not."""
    deadline = time.monotonic() + REAP_SLACK
    while fleet_processes(home) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftovers = fleet_processes(home)
    for process in leftovers:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.Error:
            continue
    return leftovers


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    # Short: socket paths must fit sun_path. Children inherit FLEET_HOME, which is how every
    # process of the scenario (grandchildren included) is found afterwards.
    prefix = Path(home_prefix())
    home = Path(tempfile.mkdtemp(prefix=prefix.name, dir=prefix.parent))
    monkeypatch.setenv("FLEET_HOME", str(home))
    monkeypatch.delenv("FLEET_MODEL", raising=False)
    monkeypatch.delenv("FLEET_SESSION", raising=False)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    world = Faults(home=home, repo=make_repo(tmp_path / "repo"), scripts=scripts)
    try:
        yield world
    finally:
        if world.daemon:
            world.cli("serve", "--stop", timeout=90)
        leftovers = reap_leftovers(home)
        # The supervisors' logs outlive the home (pytest keeps the last runs' tmp_path): a
        # supervisor's traceback is the only record of a crash under load.
        for n, log in enumerate(sorted(home.glob("sessions/*/supervisor.log"))):
            shutil.copyfile(log, tmp_path / f"supervisor-{n}.log")
        shutil.rmtree(home, ignore_errors=True)
        assert not leftovers, f"processes survived the scenario: {leftovers}"
