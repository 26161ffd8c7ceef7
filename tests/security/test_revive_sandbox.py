"""A hostile child that is hibernated, woken, lost and revived keeps its sandbox every time.

Through the real ``fleet`` CLI (``fleet serve`` with hibernation on at once), a builtin worker
with ``bash`` whose model (the loopback scripted model server) runs the same probe in each life:
read the journal and the control token, write the parent's checkout and a host path, write its
own worktree, and say what it sees of ``/proc`` and its capabilities. The probe's output is what
the child sends its model next, so the test reads it from the model server's requests; the host
is checked too. Lives: spawned; woken from hibernation; revived after its supervisor was
SIGKILLed mid-turn.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from typing import Any

import pytest

from orchestrator._config import Config
from tests.fakes.model_server import ModelServer
from tests.faults.conftest import faults

__all__ = ["faults"]

pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]


def _json(faults: Any, *args: str, timeout: float = 60) -> dict[str, Any]:
    result = faults.cli(*args, "--json", timeout=timeout)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _until(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _probe(faults: Any, life: str) -> dict[str, Any]:
    session = faults.home / "sessions" / "t"
    token = Config(home=faults.home, session="t", workspace=faults.repo).paths.control_token
    command = "; ".join(
        [
            f"cat {session}/journal.jsonl >/dev/null 2>&1; echo journal=$?",
            f"cat {token} >/dev/null 2>&1; echo token=$?",
            f"ls {session} 2>/dev/null | tr '\\n' , ; echo",
            f"(echo {life} > {faults.repo}/planted-{life}) 2>/dev/null; echo repo=$?",
            f"(echo {life} > {faults.home}/planted-{life}) 2>/dev/null; echo home=$?",
            f"echo {life} > inside-{life}.txt; echo inside=$?",
            "grep CapEff /proc/self/status",
            "echo procs=$(ls /proc | grep -c '^[0-9]')",
        ]
    )
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


def _seen(srv: ModelServer, index: int) -> str:
    """The bash output the child sent its model in request *index*."""
    body = srv.requests("c1")[index].body
    tools = [m for m in body["messages"] if m["role"] == "tool"]
    content = tools[-1]["content"]
    return content if isinstance(content, str) else json.dumps(content)


def _check(faults: Any, seen: str, life: str) -> None:
    assert "journal=0" not in seen, (life, seen)
    assert "token=0" not in seen, (life, seen)
    assert "repo=0" not in seen, (life, seen)
    assert "inside=0" in seen, (life, seen)
    assert "CapEff:\t0000000000000000" in seen, (life, seen)
    procs = int(re.search(r"procs=(\d+)", seen).group(1))  # type: ignore[union-attr]
    assert procs < 20, (life, seen)  # its own pid namespace, not the host's
    listed = seen.split("token=", 1)[1].splitlines()[1]
    assert "journal" not in listed, (life, listed)
    assert "control" not in listed, (life, listed)
    assert not (faults.repo / f"planted-{life}").exists(), life
    assert not (faults.home / f"planted-{life}").exists(), life


def test_a_woken_and_a_revived_child_keep_their_sandbox(
    faults: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = faults.home / "sessions" / "t"
    faults.home.mkdir(parents=True, exist_ok=True)
    (faults.home / "config.yaml").write_text("subagents:\n  hibernate_after_s: 0\n")
    agents = faults.scripts / "agents"  # a user-scope definition (FLEET_AGENTS_DIR)
    agents.mkdir()
    front = {"name": "runner", "description": "runs", "tools": ["read", "bash"], "mode": "worktree"}
    (agents / "runner.md").write_text(f"---\n{json.dumps(front)}\n---\nYou run things.\n")
    monkeypatch.setenv("FLEET_AGENTS_DIR", str(agents))
    with ModelServer() as srv:
        srv.script(
            "c1",
            [
                _probe(faults, "first"),
                {"text": "## Summary\nfirst"},
                _probe(faults, "woken"),
                {"text": "## Summary\nwoken"},
                {"stall": True, "text": "partial"},
            ],
        )
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        _json(faults, "spawn", "--agent", "runner", "--model", model, "probe")
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nfirst"
        _check(faults, _seen(srv, 1), "first")
        worktree = session / "worktrees" / "a1"
        assert (worktree / "inside-first.txt").read_text() == "first\n"

        # It hibernates at once (no process), and a resume wakes it.
        _until(lambda: _json(faults, "peek", "a1")["agents"][0]["state"] == "hibernated")
        _json(faults, "resume", "a1", "again")
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nwoken"
        _check(faults, _seen(srv, 3), "woken")
        assert (worktree / "inside-woken.txt").read_text() == "woken\n"

        # Its supervisor dies mid-turn; the next one revives it.
        _until(lambda: _json(faults, "peek", "a1")["agents"][0]["state"] == "hibernated")
        _json(faults, "resume", "a1", "a third time")
        _until(lambda: len(srv.requests("c1")) == 5)
        daemon = int((session / "supervisor.lock").read_text().strip())
        os.kill(daemon, signal.SIGKILL)
        _until(lambda: faults.processes() == [], timeout=15)
        srv.script("c1", [_probe(faults, "revived"), {"text": "## Summary\nrevived"}])
        assert _json(faults, "revive", "a1")["revived"][0]["key"] == "a1"
        _until(lambda: _json(faults, "peek", "a1")["agents"][0]["state"] in {"idle", "hibernated"})
        _json(faults, "resume", "a1", "once more")
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nrevived"
        _check(faults, _seen(srv, len(srv.requests("c1")) - 1), "revived")
        assert (worktree / "inside-revived.txt").read_text() == "revived\n"
        [agent] = _json(faults, "peek", "a1")["agents"]
        assert agent["sandboxed"] is True, agent
        _json(faults, "discard", "a1")
