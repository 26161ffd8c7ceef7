"""The supervisor daemon exits when it has held nothing for ``subagents.idle_exit_s``."""

from pathlib import Path

import psutil
import pytest

from orchestrator._config import load_config
from orchestrator._errors import UsageError
from tests.e2e.conftest import fleet_processes, running_fleet

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
        control = fleet.home / "sessions" / "t" / "control.sock"
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
