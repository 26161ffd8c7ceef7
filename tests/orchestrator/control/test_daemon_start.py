"""A verb meets a supervisor that is stopping (its children first) or still starting: it
waits for it instead of failing, and ``serve --stop`` returns once the supervisor has ended."""

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from orchestrator.cli import _common
from orchestrator.cli._main import build_parser
from orchestrator.control._daemon_client import ensure_daemon, lock_holder
from tests.e2e.conftest import fleet_processes, running_fleet

pytestmark = pytest.mark.slow


def _daemon_pid(fleet) -> int:
    [pid] = [p.pid for p in fleet_processes(fleet.home) if "serve" in p.cmdline()]
    return pid


def _sleeper(pid: int) -> psutil.Process:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = []
        for process in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if process.cmdline()[:2] == ["sleep", "60"]:
                    found.append(process)
        if found:
            [sleeper] = found
            return sleeper
        time.sleep(0.05)
    raise AssertionError("the stubborn child's sleep never ran")


def test_serve_stop_returns_once_the_supervisor_and_its_children_have_ended(tmp_path):
    with running_fleet(tmp_path) as fleet:
        # A child that ignores SIGTERM: the kill ladder needs its grace, then SIGKILL.
        stubborn = "sh -c 'trap \"\" TERM; echo up; sleep 60'"
        fleet.json("spawn", "--agent", "worker", "--backend", "command", "--command", stubborn, "x")
        pid = _daemon_pid(fleet)
        # Its sleep runs (polled, not a fixed `wait --timeout 5` waited out).
        sleeper = _sleeper(pid)
        assert fleet.json("serve", "--stop") == {"stopped": True}
        # Stopped means the session is free and its children are gone, not only asked to go.
        assert lock_holder(fleet.home / "sessions" / "t" / "supervisor.lock") is None
        assert not sleeper.is_running() or sleeper.status() == psutil.STATUS_ZOMBIE
        psutil.Process(pid).wait(5)
        # The next command starts a fresh supervisor at once.
        assert fleet.json("peek")["agents"] == []
        assert _daemon_pid(fleet) != pid


def test_a_verb_waits_for_a_supervisor_that_still_holds_the_session(tmp_path):
    with running_fleet(tmp_path) as fleet:
        root = fleet.home / "sessions" / "t"
        root.mkdir(parents=True, mode=0o700)
        os.chmod(fleet.home, 0o700)
        os.chmod(fleet.home / "sessions", 0o700)
        fd = os.open(root / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"4242\n")  # as a supervisor stopping its children would
        log = root / "supervisor.log"

        def release() -> None:
            # Once the verb has met the holder (or a supervisor it started lost to it), let go.
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                if log.exists() and "another supervisor already runs" in log.read_text():
                    break
                time.sleep(0.05)
            time.sleep(0.5)
            os.close(fd)

        releaser = threading.Thread(target=release)
        releaser.start()
        try:
            result = fleet.run("peek", "--json")
        finally:
            releaser.join()
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["agents"] == []


# The supervisor this process starts outlives its Popen object, as a daemon should.
@pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")
def test_a_request_that_finds_the_supervisor_gone_goes_to_a_fresh_one(tmp_path, monkeypatch):
    with running_fleet(tmp_path) as fleet:
        assert fleet.run("peek").returncode == 0
        token = fleet.paths.control_token.read_text().strip()
        # It ends (its idle exit) just after it answered this command's ping.
        assert fleet.run("serve", "--stop").returncode == 0
        for name, value in fleet.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.chdir(fleet.repo)
        pinged = iter([token])
        monkeypatch.setattr(
            _common, "ensure_daemon", lambda c: next(pinged, None) or ensure_daemon(c)
        )
        args = build_parser().parse_args(["peek"])
        assert _common.call(args, "peek", {"agents": []})["agents"] == []
        assert next(pinged, None) is None  # the stale token was used, then a fresh supervisor


def test_a_command_with_another_runtime_dir_is_told_where_the_supervisor_serves(tmp_path):
    """The control socket is in the per-user runtime root: a command run with another
    ``XDG_RUNTIME_DIR`` than its supervisor finds no socket, and says so at once in one line
    instead of waiting for the supervisor to end."""
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    with running_fleet(tmp_path, env={"XDG_RUNTIME_DIR": str(xdg)}) as fleet:
        assert fleet.json("peek")["agents"] == []
        assert str(xdg) in str(fleet.paths.control_socket)
        elsewhere = {k: v for k, v in fleet.env.items() if k != "XDG_RUNTIME_DIR"}
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator", "peek"],
            cwd=fleet.repo,
            env=elsewhere,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert time.monotonic() - started < 30
        assert result.returncode == 5, result
        [line] = result.stderr.strip().splitlines()
        assert "XDG_RUNTIME_DIR" in line
        assert str(fleet.paths.runtime) in line
        assert fleet.json("peek")["agents"] == []  # the supervisor still serves its own
