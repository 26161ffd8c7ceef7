"""Backend ``pi`` driving the real Pi CLIs (0.73.1 and 1.6.0) against the scripted model server."""

from pathlib import Path

import pytest

from child.backends._cli_env import PrivateDirs
from child.backends._digest import DIGEST_HEX, digest
from child.backends._pi import pi_argv
from tests.child.backends._cli import (
    failed_then_recovered,
    make_backend,
    paused_then_resumed,
    pi_loadout,
    stalled_then_resumed,
    steered,
    turns,
)
from tests.fakes.model_server import ModelServer

pytestmark = [pytest.mark.slow, pytest.mark.needs("pi", "pi-next")]

BINARIES = ["pi", "pi-next"]


@pytest.mark.parametrize("binary", BINARIES)
async def test_a_scout_reads_a_file_and_returns_the_final_text(tmp_path, binary):
    async with ModelServer() as srv:
        srv.script(
            "a",
            [
                {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]},
                {"text": "## Summary\nThe secret is 4217."},
            ],
        )
        backend, host = make_backend(binary, tmp_path, srv)
        [result] = await turns(backend, "find the secret")
        assert result.ok, result.error
        assert result.text == "## Summary\nThe secret is 4217."
        assert backend.has_queue is (binary == "pi-next")
        [start] = host.activities("tool_start")
        assert (start.tool, start.text) == ("read", '{"path":"notes.txt"}')
        assert start.input_digest == digest({"path": "notes.txt"})  # what the loop gate compares
        [end] = host.activities("tool_end")
        assert (end.text, end.failed, len(end.output_digest)) == ("ok", False, DIGEST_HEX)
        usage = host.activities("usage")[-1].usage
        assert usage is not None
        assert usage.tokens == 240
        assert (usage.input_tokens, usage.output_tokens) == (200, 40)
        requests = srv.requests("a")
        assert [r.api for r in requests] == ["chat", "chat"]
        assert requests[1].tool_results() == ["the secret is 4217\n"]
        assert "You are a scout." in str(requests[0].body["messages"][0])
        # The private directories are gone with the backend.
        assert list((tmp_path / "scratch").iterdir()) == []


@pytest.mark.parametrize("binary", BINARIES)
async def test_an_http_500_fails_the_turn_in_seconds_with_the_servers_message(tmp_path, binary):
    async with ModelServer() as srv:
        backend, _host = make_backend(binary, tmp_path, srv)
        failed, again = await failed_then_recovered(srv, backend)
        assert not failed.ok
        assert failed.error == "pi: the model request failed: 500 upstream exploded"
        assert (again.ok, again.text) == (True, "recovered")
        assert len(srv.requests("a")) == 2  # retries are off: one request per turn


@pytest.mark.parametrize("binary", BINARIES)
async def test_a_stalled_stream_is_aborted_by_our_watchdog(tmp_path, binary):
    async with ModelServer() as srv:
        backend, _host = make_backend(binary, tmp_path, srv, stall=2.0)
        stalled, elapsed, resumed = await stalled_then_resumed(srv, backend)
        assert not stalled.ok
        assert stalled.error.startswith("pi: no output for 2 s while waiting on the model")
        assert 1.95 <= elapsed < 15  # the stall limit is 2 s
        assert (resumed.ok, resumed.text) == (True, "fine again")


@pytest.mark.parametrize("binary", BINARIES)
async def test_pause_aborts_and_resume_continues_the_same_context(tmp_path, binary):
    async with ModelServer() as srv:
        backend, _host = make_backend(binary, tmp_path, srv)
        paused, resumed = await paused_then_resumed(srv, backend)
        assert paused.aborted
        assert paused.ok
        assert (resumed.ok, resumed.text) == (True, "resumed")
        second = srv.requests("a")[1].body["messages"]
        users = [m["content"] for m in second if m["role"] == "user"]
        assert "first task" in str(users[0])  # the same conversation continued
        assert "second task" in str(users[-1])


@pytest.mark.parametrize("binary", BINARIES)
async def test_steer_reaches_the_model_before_its_next_call(tmp_path, binary):
    async with ModelServer() as srv:
        srv.script(
            "a",
            [
                {
                    "hold": True,
                    "tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}],
                },
                {"text": "went east"},
            ],
        )
        backend, _host = make_backend(binary, tmp_path, srv)
        result = await steered(srv, backend)
        assert (result.ok, result.text) == (True, "went east")
        second = srv.requests("a")[1].body["messages"]
        assert "go east instead" in str(second[-1])


async def test_a_missing_cli_is_a_one_line_error(tmp_path):
    async with ModelServer() as srv:
        backend, _host = make_backend("pi", tmp_path, srv)
        backend.binary = str(tmp_path / "no-such-pi")
        [result] = await turns(backend, "go")
    assert not result.ok
    assert result.error == (
        f"backend pi: {tmp_path / 'no-such-pi'} is not on PATH (install "
        "@earendil-works/pi-coding-agent (or @mariozechner/pi-coding-agent)@0.73.1 or newer, "
        "or point FLEET_PI_BIN at it and restart the supervisor: fleet serve --stop)"
    )
    assert "\n" not in result.error
    assert srv.requests() == []


def test_argv_maps_tools_effort_and_the_openai_endpoint(tmp_path):
    dirs = PrivateDirs.create(str(tmp_path), "pi")
    loadout = pi_loadout(tmp_path, "http://127.0.0.1:9", effort="high", tools=["read", "todo"])
    argv = pi_argv("pi", loadout, dirs)
    assert argv[:8] == [
        "pi",
        "--mode",
        "rpc",
        "--no-session",
        "--provider",
        "fleet",
        "--model",
        "fake-model",
    ]
    assert argv[argv.index("--tools") + 1] == "read,todo"
    assert argv[argv.index("--extension") + 1].endswith("child/pi_extension/fleet_tools.js")
    assert argv[argv.index("--thinking") + 1] == "high"
    prompt = Path(argv[argv.index("--append-system-prompt") + 1])
    assert prompt.read_text() == "You are a scout."
    no_tools = pi_argv("pi", pi_loadout(tmp_path, "http://x", tools=[]), dirs)
    assert "--no-tools" in no_tools
    assert "--tools" not in no_tools
    assert "--extension" not in no_tools


@pytest.mark.parametrize("binary", BINARIES)
async def test_ask_parent_and_todo_reach_the_runtime_through_our_extension(tmp_path, binary):
    async with ModelServer() as srv:
        srv.script(
            "a",
            [
                {"tool_calls": [{"name": "ask_parent", "arguments": {"question": "Which way?"}}]},
                {
                    "tool_calls": [
                        {"name": "todo", "arguments": {"op": "write", "items": [{"text": "go"}]}}
                    ]
                },
                {"text": "Going east, as told."},
            ],
        )
        backend, host = make_backend(
            binary, tmp_path, srv, tools=["read", "ask_parent", "todo"], answers=["east"]
        )
        [result] = await turns(backend, "find the way")
        requests = srv.requests("a")
    assert (result.ok, result.text) == (True, "Going east, as told."), result.error
    assert host.questions == ["Which way?"]
    assert requests[1].tool_results() == ["east"]
    assert "error" not in requests[2].tool_results()[-1].lower()
    [progress] = [e.progress for e in host.activities("todo")]
    assert progress is not None
    assert progress.total == 1
    names = {t["function"]["name"] for t in requests[0].body["tools"]}
    assert {"read", "ask_parent", "todo"} <= names


GATE = """
export default function gate(pi) {
  pi.on("tool_call", async (event, ctx) => {
    const road = await ctx.ui.select("Which road?", ["north", "east"]);
    const ok = await ctx.ui.confirm("Allow read?", `read ${event.input.path} via ${road}`);
    const note = await ctx.ui.editor("Notes", "");
    if (!ok || road !== "east" || note !== undefined) return { block: true, reason: "refused" };
  });
}
"""


@pytest.mark.parametrize("binary", BINARIES)
async def test_extension_dialogs_become_questions_to_the_parent(tmp_path, binary, monkeypatch):
    gate = tmp_path / "gate.js"
    gate.write_text(GATE)
    # A dialog-raising extension in our extension's place.
    monkeypatch.setattr("child.backends._pi.EXTENSION", gate)
    async with ModelServer() as srv:
        srv.script(
            "a",
            [
                {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]},
                {"text": "done"},
            ],
        )
        backend, host = make_backend(
            binary, tmp_path, srv, tools=["read", "ask_parent"], answers=["East", "yes"]
        )
        [result] = await turns(backend, "read the notes")
        requests = srv.requests("a")
    assert (result.ok, result.text) == (True, "done"), result.error
    assert host.questions == [
        "Which road? (one of: north; east)",
        "Allow read? read notes.txt via east (yes or no)",
    ]
    # The editor dialog was cancelled (undefined), the select matched case-insensitively.
    assert requests[1].tool_results() == ["the secret is 4217\n"]
