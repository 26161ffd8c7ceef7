"""The supervisor daemon exits when it has held nothing for ``subagents.idle_exit_s``."""

import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import trio

from orchestrator._config import Config, load_config
from orchestrator._errors import UsageError
from orchestrator.control._daemon import exit_when_idle, idle_exit_after
from orchestrator.control._daemon_client import PARENT_EXIT_S, PARENT_EXIT_VARIABLE
from orchestrator.control._server import ControlServer
from orchestrator.core._requests import Question
from orchestrator.core._supervisor import open_supervisor
from tests.e2e.conftest import fleet_processes, make_repo, running_fleet

REPORT = "turns:\n  - steps:\n      - reply: done\n"


def _daemon_pid(home: Path) -> int:
    [pid] = [p.pid for p in fleet_processes(home) if "serve" in p.cmdline() and "-m" in p.cmdline()]
    return pid


def _ends_within(pid: int, seconds: float) -> bool:
    try:
        psutil.Process(pid).wait(seconds)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


@pytest.mark.slow
def test_an_idle_supervisor_exits_and_one_with_a_retained_child_stays(tmp_path):
    with running_fleet(tmp_path, env={"FLEET_IDLE_EXIT_S": "1"}) as fleet:
        model = fleet.script("report", REPORT)
        fleet.json("spawn", "--model", model, "look")
        fleet.json("wait", "a1", "--timeout", "30")
        pid = _daemon_pid(fleet.home)
        # An idle child is retained: the supervisor keeps it, well past the idle period.
        assert not _ends_within(pid, 3.0)
        assert fleet.json("peek")["agents"][0]["key"] == "a1"
        fleet.json("stop", "a1")
        assert _ends_within(pid, 10.0)
        control = fleet.paths.control_socket
        assert not control.exists()
        # The next verb starts a fresh supervisor.
        assert fleet.json("peek")["agents"] == []
        assert _daemon_pid(fleet.home) != pid


def test_idle_exit_is_read_from_the_config_file_and_checked(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEET_IDLE_EXIT_S", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    assert load_config(session="s", cwd=tmp_path, home=home).idle_exit_s == 1800
    (home / "config.yaml").write_text("subagents:\n  idle_exit_s: 0\n")
    assert load_config(session="s", cwd=tmp_path, home=home).idle_exit_s == 0
    (home / "config.yaml").write_text("subagents:\n  idle_exit_s: -1\n")
    with pytest.raises(UsageError, match="idle_exit_s -1"):
        load_config(session="s", cwd=tmp_path, home=home)
    monkeypatch.setenv("FLEET_IDLE_EXIT_S", "soon")
    with pytest.raises(UsageError, match="FLEET_IDLE_EXIT_S"):
        load_config(session="s", cwd=tmp_path, home=home)


async def test_the_idle_rule_waits_for_quiet_with_nothing_held(tmp_path):
    home = Path(tempfile.mkdtemp(prefix="fli-", dir="/tmp"))
    try:
        config = Config(home=home, session="t", workspace=make_repo(tmp_path / "repo"))
        async with open_supervisor(config) as sup:
            server = ControlServer(sup=sup, token=secrets.token_hex(8))
            sup.questions["q1"] = Question(id="q1", key="a1", text="which?")
            with trio.move_on_after(0.8):
                await exit_when_idle(server, 0.2)
            assert not server.shutdown.is_set()  # an open question holds it
            del sup.questions["q1"]
            server.serving = 1
            with trio.move_on_after(0.8):
                await exit_when_idle(server, 0.2)
            assert not server.shutdown.is_set()  # so does a request being served
            server.serving = 0
            with trio.fail_after(2):
                await exit_when_idle(server, 0.2)
            assert server.shutdown.is_set()
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize(
    ("idle_exit_s", "parent", "after"),
    [
        (1800.0, None, 1800.0),  # a user's supervisor: the configured idle exit
        (1800.0, "10", 10.0),  # started for a parent: its short grace
        (5.0, "10", 5.0),  # a shorter configured one still wins
        (0.0, "10", 0.0),  # 0 is "never", which a parent does not override
        (1800.0, "nan", 1800.0),
        (1800.0, "-3", 1800.0),
        (1800.0, "soon", 1800.0),
    ],
)
def test_a_supervisor_started_for_a_parent_exits_after_its_short_grace(
    idle_exit_s, parent, after
) -> None:
    environ = {} if parent is None else {PARENT_EXIT_VARIABLE: parent}
    assert idle_exit_after(idle_exit_s, environ) == after


@pytest.mark.slow
def test_the_supervisor_fleet_mcp_started_ends_when_its_parent_goes(tmp_path):
    """The MCP client (a parent) connects, spawns nothing, and leaves: the supervisor that
    ``fleet mcp`` started on demand ends within its grace, not after the 1800 s default."""
    with running_fleet(tmp_path, prefix="fmx-") as fleet:
        env = {k: v for k, v in fleet.env.items() if k != "FLEET_IDLE_EXIT_S"}
        env.pop(PARENT_EXIT_VARIABLE, None)
        mcp = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "mcp"],
            cwd=fleet.repo,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                daemons = [p for p in fleet_processes(fleet.home) if "serve" in p.cmdline()]
                if daemons:
                    break
                time.sleep(0.2)
            [daemon] = daemons
            assert not _ends_within(daemon.pid, 3.0)  # its parent is still there
        finally:
            assert mcp.stdin is not None
            mcp.stdin.close()  # the parent goes away
            mcp.wait(30)
        assert _ends_within(daemon.pid, PARENT_EXIT_S + 30)
