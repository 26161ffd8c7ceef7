"""Backend ``claude`` driving the real Claude Code CLI against the scripted model server."""

import pytest

from child.backends._claude import claude_argv, claude_tools
from child.backends._cli_env import PrivateDirs
from child.backends._digest import DIGEST_HEX, digest
from tests.child.backends._cli import (
    ANTHROPIC_KEY_ENV,
    claude_loadout,
    failed_then_recovered,
    make_backend,
    paused_then_resumed,
    stalled_then_resumed,
    steered,
    turns,
)
from tests.fakes.model_server import ModelServer

pytestmark = [pytest.mark.slow, pytest.mark.needs("claude")]


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(ANTHROPIC_KEY_ENV, "sk-ant-scripted")


def model_calls(srv):
    return [r for r in srv.requests("a") if r.api == "messages"]


async def test_a_scout_reads_a_file_and_returns_the_final_text(tmp_path):
    notes = tmp_path / "ws" / "notes.txt"
    async with ModelServer() as srv:
        srv.script(
            "a",
            [
                {"tool_calls": [{"name": "Read", "arguments": {"file_path": str(notes)}}]},
                {"text": "## Summary\nThe secret is 4217.", "usage": {"input_tokens": 7}},
            ],
        )
        backend, host = make_backend("claude", tmp_path, srv)
        [result] = await turns(backend, "find the secret")
        assert result.ok, result.error
        assert result.text == "## Summary\nThe secret is 4217."
        [start] = host.activities("tool_start")
        assert start.tool == "Read"
        assert start.text.startswith('{"file_path":"/')
        assert start.input_digest == digest({"file_path": str(notes)})  # for the loop gate
        [end] = host.activities("tool_end")
        assert (end.tool, end.text) == ("Read", "ok")
        assert (end.failed, len(end.output_digest)) == (False, DIGEST_HEX)
        usage = host.activities("usage")[-1].usage
        assert usage is not None
        assert usage.tokens == 100 + 7 + 2 * 20
        assert (usage.input_tokens, usage.output_tokens) == (100 + 7, 2 * 20)
        assert usage.cost_usd is not None
        assert usage.cost_usd > 0
        calls = model_calls(srv)
        assert len(calls) == 2
        assert "the secret is 4217" in calls[1].tool_results()[0]
        names = [t["name"] for t in calls[0].body["tools"]]
        assert names == ["Glob", "Grep", "Read", "mcp__fleet__ask_parent"]
        assert "You are a scout." in str(calls[0].body["system"])
        assert list((tmp_path / "scratch").iterdir()) == []


async def test_an_http_500_fails_the_turn_with_the_servers_message(tmp_path):
    async with ModelServer() as srv:
        backend, _host = make_backend("claude", tmp_path, srv)
        failed, again = await failed_then_recovered(srv, backend)
        assert not failed.ok
        assert failed.error.startswith("claude: API Error: 500 upstream exploded")
        assert "\n" not in failed.error
        assert (again.ok, again.text) == (True, "recovered")
        assert len(model_calls(srv)) == 2


async def test_a_stalled_stream_is_interrupted_by_our_watchdog(tmp_path):
    async with ModelServer() as srv:
        backend, _host = make_backend("claude", tmp_path, srv, stall=2.0)
        stalled, elapsed, resumed = await stalled_then_resumed(srv, backend)
        assert not stalled.ok
        assert stalled.error.startswith("claude: no output for 2 s while waiting on the model")
        assert 1.95 <= elapsed < 15  # the stall limit is 2 s
        assert (resumed.ok, resumed.text) == (True, "fine again"), resumed.error


async def test_pause_interrupts_and_resume_continues_the_same_context(tmp_path):
    async with ModelServer() as srv:
        backend, _host = make_backend("claude", tmp_path, srv)
        # Paused after two requests: the HEAD probe, then the model call.
        paused, resumed = await paused_then_resumed(srv, backend, requests=2)
        assert (paused.ok, paused.aborted) == (True, True)
        assert (resumed.ok, resumed.text) == (True, "resumed")
        text = str(model_calls(srv)[1].body["messages"])
        assert "first task" in text
        assert "second task" in text


async def test_steer_reaches_the_running_turn_at_its_next_model_call(tmp_path):
    notes = tmp_path / "ws" / "notes.txt"
    async with ModelServer() as srv:
        srv.script(
            "a",
            [
                {
                    "hold": True,
                    "tool_calls": [{"name": "Read", "arguments": {"file_path": str(notes)}}],
                },
                {"text": "went east"},
            ],
        )
        backend, _host = make_backend("claude", tmp_path, srv)
        result = await steered(srv, backend, requests=2)
        assert (result.ok, result.text) == (True, "went east")
        assert "Steer from parent: go east instead" in str(model_calls(srv)[1].body["messages"])


async def test_a_steer_during_the_last_model_call_settles_after_the_follow_up(tmp_path):
    async with ModelServer() as srv:
        srv.script("a", [{"hold": True, "text": "went west"}, {"text": "went east after all"}])
        backend, _host = make_backend("claude", tmp_path, srv)
        result = await steered(srv, backend, requests=2)
        assert (result.ok, result.text) == (True, "went east after all")


async def test_a_missing_cli_is_a_one_line_error(tmp_path):
    async with ModelServer() as srv:
        backend, _host = make_backend("claude", tmp_path, srv)
        backend.binary = "no-such-claude"
        [result] = await turns(backend, "go")
    assert not result.ok
    assert result.error == (
        "backend claude: no-such-claude is not on PATH (install @anthropic-ai/claude-code@2.1.0 "
        "or newer, or point FLEET_CLAUDE_BIN at it and restart the supervisor: fleet serve --stop)"
    )
    assert srv.requests() == []


def test_tools_map_to_claude_code_built_ins(tmp_path):
    assert claude_tools(["read", "grep", "find", "ls", "todo", "ask_parent"]) == [
        "Read",
        "Grep",
        "Glob",
    ]
    dirs = PrivateDirs.create(str(tmp_path), "claude")
    worker = claude_loadout(tmp_path, "http://x", tools=["read", "edit", "write", "bash"])
    argv = claude_argv("claude", worker, dirs)
    assert "--tools=Read,Edit,Write,Bash" in argv
    assert "--allowedTools=Read,Edit,Write,Bash" in argv
    assert argv[argv.index("--permission-mode") + 1] == "acceptEdits"
    assert argv[argv.index("--model") + 1] == "claude-fake"
    scout = claude_argv("claude", claude_loadout(tmp_path, "http://x"), dirs)
    assert scout[scout.index("--permission-mode") + 1] == "default"
    assert "--effort" not in scout
    for ours, theirs in [("minimal", "low"), ("high", "high"), ("xhigh", "xhigh")]:
        argv = claude_argv("claude", claude_loadout(tmp_path, "http://x", effort=ours), dirs)
        assert argv[argv.index("--effort") + 1] == theirs
    assert "--effort" not in claude_argv(
        "claude", claude_loadout(tmp_path, "x", effort="off"), dirs
    )


async def test_ask_parent_reaches_the_parent_through_our_mcp_server(tmp_path):
    async with ModelServer() as srv:
        srv.script(
            "a",
            [
                {
                    "tool_calls": [
                        {"name": "mcp__fleet__ask_parent", "arguments": {"question": "Which way?"}}
                    ]
                },
                {"text": "Going east, as told."},
            ],
        )
        backend, host = make_backend("claude", tmp_path, srv, answers=["east"])
        [result] = await turns(backend, "find the way")
        calls = model_calls(srv)
    assert (result.ok, result.text) == (True, "Going east, as told.")
    assert calls[1].tool_results() == ["east"], calls[1].tool_results()
    assert host.questions == ["Which way?"]
    names = [t["name"] for t in calls[0].body["tools"]]
    assert "mcp__fleet__ask_parent" in names
    assert [e.tool for e in host.activities("tool_start")] == ["mcp__fleet__ask_parent"]
