"""Backend ``codex`` driving the real ``codex app-server`` against the scripted model server."""

import psutil
import pytest
import trio

from child.backends._codex import codex_config, sandbox_mode
from tests.child.backends._cli import (
    closing,
    codex_loadout,
    failed_then_recovered,
    make_backend,
    stalled_then_resumed,
    steered,
    turn_while,
    turns,
    wait_for_requests,
)
from tests.fakes.model_server import ModelServer

pytestmark = [pytest.mark.slow, pytest.mark.needs("codex")]


def exec_call(cmd):
    return {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": cmd}}]}


async def test_a_scout_runs_a_read_only_command_and_returns_the_final_text(tmp_path):
    async with ModelServer() as srv:
        srv.script("a", [exec_call("cat notes.txt"), {"text": "## Summary\nThe secret is 4217."}])
        backend, host = make_backend("codex", tmp_path, srv)
        [result] = await turns(backend, "find the secret")
        assert result.ok, result.error
        assert result.text == "## Summary\nThe secret is 4217."
        [start] = host.activities("tool_start")
        assert start.tool == "exec"
        assert "cat notes.txt" in start.text
        assert [e.text for e in host.activities("tool_end")] == ["ok"]
        usage = host.activities("usage")[-1].usage
        assert usage is not None
        assert usage.tokens == 240
        assert (usage.input_tokens, usage.output_tokens) == (200, 40)
        calls = srv.requests("a")
        assert [r.api for r in calls] == ["responses", "responses"]
        assert "the secret is 4217" in calls[1].tool_results()[0]
        assert "You are a scout." in str(calls[0].body)
        # Only Codex's own home is kept (a revive resumes its thread from it), private.
        [kept] = (tmp_path / "scratch").iterdir()
        assert kept.name == "codex"
        assert kept.stat().st_mode & 0o077 == 0


async def test_identical_commands_get_identical_digests_and_a_failing_one_says_so(tmp_path):
    # What the supervisor's loop gate compares: the same call, the same result, a failure.
    same = exec_call("cat notes.txt")
    async with ModelServer() as srv:
        srv.script("a", [same, same, exec_call("cat missing.txt"), {"text": "done"}])
        backend, host = make_backend("codex", tmp_path, srv)
        [result] = await turns(backend, "read twice")
        assert result.ok, result.error
    starts, ends = host.activities("tool_start"), host.activities("tool_end")
    assert [len(s.input_digest) for s in starts] == [16, 16, 16]
    assert starts[0].input_digest == starts[1].input_digest != starts[2].input_digest
    assert ends[0].output_digest == ends[1].output_digest != ends[2].output_digest
    assert [e.failed for e in ends] == [False, False, True]


async def test_the_read_only_sandbox_refuses_a_write(tmp_path):
    async with ModelServer() as srv:
        srv.script("a", [exec_call("echo hacked > owned.txt"), {"text": "tried"}])
        backend, _host = make_backend("codex", tmp_path, srv)
        [result] = await turns(backend, "write something")
        assert result.ok, result.error
        assert not (tmp_path / "ws" / "owned.txt").exists()


async def test_an_http_500_fails_the_turn_in_seconds(tmp_path):
    async with ModelServer() as srv:
        backend, _host = make_backend("codex", tmp_path, srv)
        failed, again = await failed_then_recovered(srv, backend)
        assert not failed.ok
        # Codex hides 5xx bodies; it names the class of error.
        assert failed.error.startswith("codex: ")
        assert "internalServerError" in failed.error
        assert (again.ok, again.text) == (True, "recovered")
        assert len(srv.requests("a")) == 2


async def test_a_stalled_stream_is_interrupted_by_our_watchdog(tmp_path):
    async with ModelServer() as srv:
        backend, _host = make_backend("codex", tmp_path, srv, stall=2.0)
        stalled, elapsed, resumed = await stalled_then_resumed(srv, backend)
        assert not stalled.ok
        assert stalled.error.startswith("codex: no output for 2 s while waiting on the model")
        assert 1.95 <= elapsed < 15  # the stall limit is 2 s
        assert (resumed.ok, resumed.text) == (True, "fine again")


async def test_pause_interrupts_kills_the_running_command_and_resume_continues(tmp_path):
    marker = tmp_path / "ws" / "still-running"
    async with ModelServer() as srv:
        srv.script("a", [exec_call("sleep 300; echo done"), {"text": "resumed"}])
        backend, _host = make_backend("codex", tmp_path, srv)

        async def pause_when_the_command_runs():
            await wait_for_requests(srv, "a")
            while not backend._commands:  # noqa: ASYNC110 - polling the backend
                await trio.sleep(0.05)
            await _note_pids(backend, marker)
            await trio.sleep(0.3)
            await backend.abort()

        async with closing(backend):
            paused = await turn_while(backend, "first task", pause_when_the_command_runs)
            pids = [int(p) for p in marker.read_text().split()]
            resumed = await backend.run_turn("second task")
        assert (paused.ok, paused.aborted) == (True, True)
        assert pids
        assert not [p for p in pids if psutil.pid_exists(p) and _alive(p)]
        assert (resumed.ok, resumed.text) == (True, "resumed")
        assert "first task" in str(srv.requests("a")[-1].body)


async def _note_pids(backend, marker):
    marker.write_text(" ".join(str(p) for p in backend._commands.values()))


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def test_steer_joins_the_running_turn(tmp_path):
    async with ModelServer() as srv:
        srv.script("a", [{"hold": True, **exec_call("cat notes.txt")}, {"text": "went east"}])
        backend, _host = make_backend("codex", tmp_path, srv)
        result = await steered(srv, backend, ready=lambda: backend._turn_id)
        assert (result.ok, result.text) == (True, "went east")
        assert "Steer from parent: go east instead" in str(srv.requests("a")[1].body)


async def test_a_missing_cli_is_a_one_line_error(tmp_path):
    async with ModelServer() as srv:
        backend, _host = make_backend("codex", tmp_path, srv)
        backend.binary = "no-such-codex"
        [result] = await turns(backend, "go")
    assert not result.ok
    assert result.error == (
        "backend codex: no-such-codex is not on PATH (install @openai/codex@0.171.0 or newer, "
        "or point FLEET_CODEX_BIN at it and restart the supervisor: fleet serve --stop)"
    )


def test_config_and_sandbox_follow_the_loadout(tmp_path):
    scout = codex_loadout(tmp_path, "http://127.0.0.1:9", effort="high")
    assert sandbox_mode(scout) == "read-only"
    worker = codex_loadout(tmp_path, "http://x", mode="worktree", tools=["read", "edit"])
    assert sandbox_mode(worker) == "workspace-write"
    config = codex_config(scout, stall=5)
    assert 'model_reasoning_effort = "high"' in config
    assert 'base_url = "http://127.0.0.1:9/v1"' in config
    assert "stream_idle_timeout_ms = 10000" in config
    assert "request_max_retries = 0" in config


async def test_our_mcp_tools_are_offered_to_the_model(tmp_path):
    # Codex offers MCP tools as a Responses "namespace"; calling one needs a function_call
    # item with a "namespace" field, which the scripted server cannot emit (docs/backends.md).
    # The call path itself is covered with Claude Code and in test_mcp.py.
    async with ModelServer() as srv:
        srv.script("a", [{"text": "done"}])
        backend, _host = make_backend("codex", tmp_path, srv, tools=["read", "ask_parent", "todo"])
        [result] = await turns(backend, "list your tools")
        [request] = srv.requests("a")
    assert result.ok, result.error
    [fleet] = [t for t in request.body["tools"] if t.get("name") == "mcp__fleet"]
    assert fleet["type"] == "namespace"
    assert sorted(t["name"] for t in fleet["tools"]) == ["ask_parent", "todo"]
