"""A verb the control socket refuses fails at once (exit 4, one line), instead of waiting
for a supervisor that answers: the supervisor answers a refused peer's hello with a refusal
and the client raises it, where it used to wait out its whole start-up timeout."""

import json
import subprocess
import sys
import time

import psutil

from orchestrator.control._daemon_client import STOP_TIMEOUT
from tests.e2e.conftest import fleet_processes, running_fleet


def test_a_verb_from_inside_a_childs_run_is_refused_at_once(tmp_path):
    with running_fleet(tmp_path) as fleet:
        assert fleet.json("peek")["control"]["refused"] == 0  # starts the supervisor
        [daemon] = [p.pid for p in fleet_processes(fleet.home) if "serve" in p.cmdline()]
        # A hostile child that strips FLEET_CHILD but still carries its run's marker (what
        # every process a child starts inherits): the supervisor refuses its connection.
        env = {**fleet.env, "FLEET_RUN": f"t/a1/{daemon}"}
        env.pop("FLEET_CHILD", None)
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator", "--json", "spawn", "pwn"],
            cwd=fleet.repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=STOP_TIMEOUT,
            check=False,
        )
        took = time.monotonic() - started
        assert result.returncode == 4, (result.returncode, result.stdout, result.stderr)
        assert json.loads(result.stdout)["error"]["kind"] == "refused"
        [line] = result.stderr.splitlines()
        assert line.startswith("fleet spawn: "), line
        assert "serves the parent only" in line, line
        assert str(daemon) not in line  # the refusal names no pid
        assert took < 10, took  # not the STOP_TIMEOUT wait for a supervisor that answers
        # It reached the supervisor and was counted, spawned nothing, and started no other.
        peek = fleet.json("peek")
        assert peek["control"]["refused"] == 1
        assert peek["agents"] == []
        assert [p.pid for p in fleet_processes(fleet.home) if "serve" in p.cmdline()] == [daemon]
        assert psutil.Process(daemon).is_running()
