"""Usage that adds and survives (#37): what ``fleet usage`` says is what the model server
billed, through hibernation (a woken child reports from zero), a supervisor SIGKILL (the next
supervisor reads the journal) and a revive.

Driven through the real ``fleet`` CLI: a builtin child on the loopback scripted model server,
which bills 100 input and 20 output tokens for every answer it completes.
"""

import json
import os
import signal
import time
from typing import Any

import pytest

from tests.fakes.model_server import ModelServer

pytestmark = pytest.mark.slow

BILL = 120  # tokens per completed answer (the model server's default usage)


def _json(faults, *args: str) -> dict[str, Any]:
    result = faults.cli(*args, "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _until(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _state(faults) -> str:
    return str(_json(faults, "peek", "a1")["agents"][0]["state"])


def _usage(faults) -> tuple[int, int, int]:
    report = _json(faults, "usage")
    [child] = [a for a in report["agents"] if a["key"] == "a1"]
    # What the gateway metered (the ledger's source of truth) agrees, life after life.
    assert child["metered_tokens"] == child["tokens"], child
    return child["tokens"], child["input_tokens"], report["session"]["tokens"]


def test_usage_adds_over_hibernation_and_survives_a_supervisor_kill_and_a_revive(faults):
    (faults.home / "config.yaml").write_text("subagents:\n  hibernate_after_s: 0\n")
    with ModelServer() as srv:
        srv.script(
            "c1",
            [
                {"text": "one"},
                {"text": "two"},
                {"text": "three"},
                {"stall": True, "text": "never"},
                {"text": "four"},
            ],
        )
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        _json(faults, "spawn", "--model", model, "turn one")
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "one"
        for turn, answer in (("turn two", "two"), ("turn three", "three")):
            _until(lambda: _state(faults) == "hibernated")
            _json(faults, "resume", "a1", turn)  # wakes it: a new process, counting from 0
            assert _json(faults, "wait", "a1")["settled"][0]["report"] == answer
        billed = 3 * BILL
        assert _usage(faults) == (billed, 300, billed)

        _until(lambda: _state(faults) == "hibernated")
        _json(faults, "resume", "a1", "turn four")
        _until(lambda: len(srv.requests("c1")) == 4)  # stalled in its model call
        session = faults.home / "sessions" / "t"
        os.kill(int((session / "supervisor.lock").read_text().strip()), signal.SIGKILL)
        _until(lambda: faults.processes() == [], timeout=15)
        # The next supervisor says what the last one said (the stalled call billed nothing).
        assert _usage(faults) == (billed, 300, billed)

        _json(faults, "resume", "a1", "turn five")  # revives the lost child first
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "four"
        assert _usage(faults) == (4 * BILL, 400, 4 * BILL)
        _json(faults, "stop", "a1")
        assert _usage(faults) == (4 * BILL, 400, 4 * BILL)
    assert len(srv.requests("c1")) == 5
