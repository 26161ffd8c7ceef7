"""Our MCP server (``python -m child.backends._mcp``) over stdio, relaying to a real ToolRelay."""

import json
import os
import stat
import subprocess
import sys

import pytest
import trio

from child.backends._jsonl import RecordReader, encode
from child.backends._mcp import ToolRelay, claude_mcp_config, codex_mcp_config, relayed_tools
from tests.child.backends._backends import Host

pytestmark = pytest.mark.slow


async def _rpc(process, reader, ident, method, params):
    await process.stdin.send_all(
        encode({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
    )
    while True:
        message = await reader.receive()
        assert message is not None, "the MCP server exited"
        if message.get("id") == ident:
            return message


async def test_tools_list_and_call_reach_the_host(tmp_path, nursery):
    host = Host(answers=["east"])
    (tmp_path / "ws").mkdir()
    relay = ToolRelay.create(["read", "ask_parent", "todo"], host, str(tmp_path / "ws"), tmp_path)
    await nursery.start(relay.serve)
    assert stat.S_IMODE(os.stat(relay.socket_path).st_mode) == 0o600
    env = {"PATH": os.environ["PATH"], **relay.server_env()}
    process = await trio.lowlevel.open_process(
        relay.server_argv(), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert process.stdin is not None
    assert process.stdout is not None
    reader = RecordReader(process.stdout)
    try:
        with trio.fail_after(30):
            init = await _rpc(
                process,
                reader,
                1,
                "initialize",
                {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"},
                },
            )
            assert init["result"]["serverInfo"]["name"] == "fleet"
            await process.stdin.send_all(
                encode({"jsonrpc": "2.0", "method": "notifications/initialized"})
            )
            listed = await _rpc(process, reader, 2, "tools/list", {})
            names = sorted(t["name"] for t in listed["result"]["tools"])
            assert names == ["ask_parent", "todo"]
            called = await _rpc(
                process,
                reader,
                3,
                "tools/call",
                {"name": "ask_parent", "arguments": {"question": "Which way?"}},
            )
            todo = await _rpc(
                process,
                reader,
                4,
                "tools/call",
                {
                    "name": "todo",
                    "arguments": {"op": "write", "items": [{"text": "look"}, {"text": "report"}]},
                },
            )
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
    assert called["result"]["content"] == [{"type": "text", "text": "east"}]
    assert not called["result"].get("isError")
    assert host.questions == ["Which way?"]
    assert not todo["result"].get("isError"), todo
    [progress] = [e.progress for e in host.activities("todo")][-1:]
    assert progress is not None
    assert progress.total == 2


async def test_a_caller_without_the_token_gets_nothing(tmp_path, nursery):
    relay = ToolRelay.create(["ask_parent"], Host(), str(tmp_path), tmp_path)
    await nursery.start(relay.serve)
    with trio.fail_after(10):
        stream = await trio.open_unix_socket(str(relay.socket_path))
        async with stream:
            await stream.send_all(encode({"token": "guess", "tool": "ask_parent", "args": {}}))
            assert await RecordReader(stream).receive() is None


def test_the_configurations_carry_the_token_only_in_the_env(tmp_path):
    relay = ToolRelay.create(["ask_parent", "subagent", "read"], Host(), str(tmp_path), tmp_path)
    assert relayed_tools(["read", "subagent", "ask_parent"]) == ["ask_parent", "subagent"]
    claude = json.loads(claude_mcp_config(relay))["mcpServers"]["fleet"]
    assert claude["command"] == sys.executable
    assert relay.token not in " ".join(claude["args"])
    assert claude["env"]["FLEET_MCP_TOKEN"] == relay.token
    codex = codex_mcp_config(relay)
    assert "[mcp_servers.fleet.env]" in codex
    assert f'FLEET_MCP_TOKEN = "{relay.token}"' in codex
