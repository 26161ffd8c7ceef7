"""A verb that reaches a supervisor started with other settings says so, in one line."""

import hashlib
import json
from typing import Any

import pytest
import trio

from orchestrator._config import load_config
from orchestrator._digests import drifted, start_digests
from orchestrator.control._client import call_async, read_token
from tests.e2e.conftest import running_fleet

KEY = "sk-a-provider-key-of-the-caller"


def _ping(fleet) -> dict[str, Any]:
    paths = fleet.paths
    token = read_token(paths.control_token)
    return trio.run(lambda: call_async(paths.control_socket, token, "ping", {}, timeout=10.0))


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("fleet: warning: ")]


@pytest.mark.slow
def test_a_verb_names_the_settings_the_running_supervisor_started_without(tmp_path):
    with running_fleet(tmp_path) as fleet:
        started = fleet.run("peek")
        assert started.returncode == 0
        assert _warnings(started.stderr) == []
        assert _warnings(fleet.run("peek").stderr) == []
        env = {**fleet.env, "FLEET_PI_BIN": "/opt/pi/bin/pi", "OPENAI_API_KEY": KEY}
        fleet.env, plain = env, fleet.env
        result = fleet.run("peek", "--json")
        assert result.returncode == 0
        [line] = _warnings(result.stderr)
        assert "FLEET_PI_BIN, OPENAI_API_KEY" in line
        assert "fleet serve --stop" in line
        assert KEY not in result.stderr + result.stdout
        # The ping carries keyed hashes only: neither the key nor its plain hash.
        ping = fleet.run("peek", "--allow-unsandboxed")
        [line] = _warnings(ping.stderr)
        assert "--allow-unsandboxed" in line
        log = (fleet.home / "sessions" / "t" / "supervisor.log").read_text()
        assert KEY not in log
        assert KEY not in json.dumps(_ping(fleet))
        # Restarted with the caller's settings, the supervisor matches them.
        assert fleet.run("serve", "--stop").returncode == 0
        assert _warnings(fleet.run("peek").stderr) == []
        assert _warnings(fleet.run("peek").stderr) == []
        answer = json.dumps(_ping(fleet))
        assert KEY not in answer
        assert hashlib.sha256(KEY.encode()).hexdigest()[:16] not in answer
        fleet.env = plain
        [line] = _warnings(fleet.run("peek").stderr)
        assert "FLEET_PI_BIN, OPENAI_API_KEY" in line


def test_digests_are_keyed_and_compare_what_differs(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEET_MODEL", raising=False)
    config = load_config(session="s", cwd=tmp_path, home=tmp_path)
    mine = start_digests(config, {"OPENAI_API_KEY": KEY}, "token-1")
    theirs = start_digests(config, {"OPENAI_API_KEY": KEY}, "token-1")
    assert drifted(mine, theirs) == []
    assert start_digests(config, {"OPENAI_API_KEY": KEY}, "token-2") != mine
    other = start_digests(config, {"OPENAI_API_KEY": "sk-other"}, "token-1")
    assert drifted(mine, other) == ["OPENAI_API_KEY"]
    assert drifted(mine, {}) == []  # a supervisor that does not report its settings
    # No model of the caller's is no opinion; a model the supervisor lacks is a difference.
    modelled = load_config(session="s", cwd=tmp_path, home=tmp_path, model="scripted:x.yaml")
    with_model = start_digests(modelled, {"OPENAI_API_KEY": KEY}, "token-1")
    assert drifted(mine, with_model) == []
    assert drifted(with_model, theirs) == ["--default-model/FLEET_MODEL"]
