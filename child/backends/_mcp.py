"""The child tools (``ask_parent``, ``todo``, ``discuss``, ``subagent``) for Claude Code and Codex,
as an MCP server.

Two halves, because the agent CLI starts its MCP servers itself (stdio transport):

- :class:`ToolRelay` runs inside the child runtime, beside the backend. It listens on a Unix
  socket in the backend's private 0700 directory and runs each relayed call with the real
  :class:`~child.backends.Host` (so ``ask_parent`` becomes an IPC question to the parent) or
  the child's own ``todo`` checklist (whose progress feeds ``peek``).
- ``python -m child.backends._mcp`` is the MCP server the CLI starts: the ``mcp`` SDK's
  low-level server on its stdio transport, run on trio (the SDK is written against anyio). It
  lists the tools and forwards each ``tools/call`` to the relay, one JSON line each way, with a
  per-child token that reaches it only through the 0600 MCP configuration (never argv).
"""

import contextlib
import json
import os
import secrets
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import trio

import ipc
from child.backends._base import Host
from child.backends._host_tools import build_host_tools
from child.backends._jsonl import RecordReader, encode
from child.tools import Progress, Tool, ToolContext, build_tools

MCP_TOOLS: Final = ("ask_parent", "todo", "discuss", "subagent")
SERVER: Final = "fleet"
SOCKET_ENV: Final = "FLEET_MCP_SOCKET"
TOKEN_ENV: Final = "FLEET_MCP_TOKEN"  # noqa: S105 - the variable's name, not a secret
TOOLS_ENV: Final = "FLEET_MCP_TOOLS"


def relayed_tools(tools: list[str]) -> list[str]:
    """The loadout's tools this server offers (the rest are the CLI's own)."""
    return [tool for tool in MCP_TOOLS if tool in tools]


@attrs.define(eq=False)
class ToolRelay:
    """The child-runtime half: runs relayed tool calls for the MCP server process."""

    tools: Mapping[str, Tool]
    ctx: ToolContext
    socket_path: Path
    token: str = attrs.Factory(lambda: secrets.token_hex(32))
    _listener: trio.SocketListener | None = None

    @classmethod
    def create(cls, names: list[str], host: Host, workspace: str, directory: Path) -> "ToolRelay":
        def on_progress(progress: Progress) -> None:
            event = ipc.Progress(
                done=progress.done,
                total=progress.total,
                current=progress.current,
                next=list(progress.next),
            )
            host.emit(ipc.Event(activity="todo", progress=event))

        async def may_write(path: Path) -> str | None:
            return None  # the todo checklist writes no file

        ctx = ToolContext(workspace=Path(workspace), may_write=may_write, on_progress=on_progress)
        wanted = set(relayed_tools(names))
        tools: dict[str, Tool] = dict(build_host_tools(wanted, host))
        if "todo" in wanted:
            tools.update(build_tools(["todo"], ctx))
        return cls(tools=tools, ctx=ctx, socket_path=directory / "mcp.sock")

    def schemas(self) -> list[dict[str, Any]]:
        return [
            {"name": t.name, "description": t.description, "inputSchema": t.parameters}
            for t in self.tools.values()
        ]

    def server_env(self) -> dict[str, str]:
        """The MCP server process's variables (for the 0600 MCP configuration)."""
        return {
            SOCKET_ENV: str(self.socket_path),
            TOKEN_ENV: self.token,
            TOOLS_ENV: json.dumps(self.schemas()),
        }

    def server_argv(self) -> list[str]:
        return [sys.executable, "-I", "-m", "child.backends._mcp"]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept relayed calls until cancelled (run it in the backend's owning nursery)."""
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                # Left by this child's earlier process (a revive): its private dir is kept.
                os.unlink(self.socket_path)
        await sock.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        task_status.started()
        try:
            await trio.serve_listeners(self._handle, [listener])
        finally:
            self.socket_path.unlink(missing_ok=True)

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            request = await RecordReader(stream, max_bytes=4 << 20).receive()
            if not isinstance(request, dict) or not secrets.compare_digest(
                str(request.get("token", "")), self.token
            ):
                return  # not our MCP server: say nothing
            name = str(request.get("tool", ""))
            args = request.get("args")
            tool = self.tools.get(name)
            if tool is None or not isinstance(args, dict):
                reply = {"text": f"{name}: no such tool here", "is_error": True}
            else:
                result = await tool.run(self.ctx, args)
                reply = {"text": result.text, "is_error": result.is_error}
            await stream.send_all(encode(reply))


async def _relay_call(name: str, args: dict[str, Any]) -> tuple[str, bool]:
    """The MCP-server half of one call: ask the child runtime over its socket."""
    stream = await trio.open_unix_socket(os.environ[SOCKET_ENV])
    async with stream:
        token = os.environ[TOKEN_ENV]
        await stream.send_all(encode({"token": token, "tool": name, "args": args}))
        reply = await RecordReader(stream, max_bytes=4 << 20).receive()
    if not isinstance(reply, dict):
        return f"{name}: the fleet child runtime gave no answer", True
    return str(reply.get("text", "")), bool(reply.get("is_error"))


async def _serve_stdio() -> None:
    import mcp_types as types  # noqa: PLC0415 - the SDK loads only in the server process
    from mcp.server.lowlevel import Server  # noqa: PLC0415
    from mcp.server.stdio import stdio_server  # noqa: PLC0415

    schemas = json.loads(os.environ.get(TOOLS_ENV, "[]"))
    tools = [
        types.Tool(name=s["name"], description=s["description"], input_schema=s["inputSchema"])
        for s in schemas
    ]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        text, is_error = await _relay_call(params.name, dict(params.arguments or {}))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], is_error=is_error
        )

    server = Server(SERVER, version="1", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> int:
    """``python -m child.backends._mcp``: serve MCP on stdio until the CLI closes it."""
    missing = [name for name in (SOCKET_ENV, TOKEN_ENV) if not os.environ.get(name)]
    if missing:
        print(
            f"child.backends._mcp: {missing[0]} is not set (the fleet child starts this)",
            file=sys.stderr,
        )
        return 2
    trio.run(_serve_stdio)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def write_private(path: Path, text: str) -> None:
    """Write a 0600 file (it holds the relay token)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def claude_mcp_config(relay: ToolRelay) -> str:
    """``--mcp-config`` JSON for Claude Code."""
    argv = relay.server_argv()
    server = {"type": "stdio", "command": argv[0], "args": argv[1:], "env": relay.server_env()}
    return json.dumps({"mcpServers": {SERVER: server}})


def codex_mcp_config(relay: ToolRelay) -> str:
    """The ``[mcp_servers.fleet]`` tables of Codex's ``config.toml`` (JSON strings are TOML)."""
    argv = relay.server_argv()
    lines = [
        "",
        f"[mcp_servers.{SERVER}]",
        f"command = {json.dumps(argv[0])}",
        f"args = {json.dumps(argv[1:])}",
        "startup_timeout_sec = 60",
        # ask_parent waits for a person: no tool timeout that a human answer could hit.
        "tool_timeout_sec = 86400",
        "",
        f"[mcp_servers.{SERVER}.env]",
    ]
    lines += [f"{name} = {json.dumps(value)}" for name, value in relay.server_env().items()]
    return "\n".join(lines) + "\n"
