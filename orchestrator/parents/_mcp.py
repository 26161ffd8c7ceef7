"""``fleet mcp``: an MCP server on stdio for one parent session.

Every tool is one request to the session's supervisor over the control client, which this
server starts on demand (again, if the supervisor ended by its idle rule while the parent
lived). Errors are MCP tool errors carrying the one-line message and the ``kind`` of
``--json``. Resources: ``fleet://fleet`` (the peek JSON; ``notifications/resources/updated``
on every change) and ``fleet://brief`` (the moderator brief). When a child settles, fails or
asks, the parent also gets a ``notifications/message``. The loop runs on trio (through anyio),
the control client's own event loop.
"""

import contextlib
import json
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Final

import anyio
import mcp_types as types
import trio
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPDeprecationWarning

from orchestrator._config import Config
from orchestrator._errors import FleetError, Unreachable
from orchestrator.control._client import call_async, op_timeout, read_token
from orchestrator.control._daemon_client import ensure_daemon
from orchestrator.parents import _watch
from orchestrator.parents._tools import BY_NAME, TOOLS

FLEET_URI: Final = "fleet://fleet"
BRIEF_URI: Final = "fleet://brief"
POLL: Final = 1.0

INSTRUCTIONS: Final = (
    "fleet runs child coding agents for you. Decompose the work into independent tasks, spawn "
    "one child per task, keep doing only what no child does, wait for their reports (or react "
    "to fleet's notifications), peek before you steer, and stop each child when its work is done."
)


class Fleet:
    """The session's supervisor as this server sees it: control calls, started on demand."""

    def __init__(self, config: Config, *, settings: Mapping[str, Any] | None = None) -> None:
        self.config = config
        self.settings = {k: v for k, v in (settings or {}).items() if v is not None}
        self.token: str | None = None
        self._starting = trio.Lock()

    async def start(self) -> None:
        """Start (or find) the supervisor; concurrent callers share one start."""
        async with self._starting:
            self.token = await trio.to_thread.run_sync(ensure_daemon, self.config)
            if self.settings:
                await self._raw("configure", self.settings)

    async def start_early(self) -> None:
        """Begin the start while the parent is still connecting; a failure waits for a call."""
        with contextlib.suppress(FleetError):
            await self.start()

    async def call(self, op: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        if self.token is None:
            await self.start()
        try:
            return await self._raw(op, payload)
        except Unreachable:
            # A supervisor that still answers had its reasons (a timeout): no second try. One
            # that ended (idle rule, crash) never ran the request: start the next, try again.
            if await self._alive():
                raise
            await self.start()
            return await self._raw(op, payload)

    async def _alive(self) -> bool:
        try:
            await self._raw("ping", {})
        except FleetError:
            return False
        return True

    async def _raw(self, op: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        paths = self.config.paths
        token = read_token(paths.control_token)  # a restarted supervisor has a new one
        return await call_async(paths.control_socket, token, op, payload, timeout=op_timeout(op))


def error_result(kind: str, message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)],
        structured_content={"error": {"kind": kind, "message": message}},
        is_error=True,
    )


def build_server(fleet: Fleet) -> tuple[Server[Any], "Watcher"]:
    watcher = Watcher(fleet)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        watcher.attach(ctx.session)
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=tool.name,
                    description=tool.description,
                    input_schema=tool.input_schema,
                    output_schema=tool.output_schema,
                )
                for tool in TOOLS
            ]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        watcher.attach(ctx.session)
        tool = BY_NAME.get(params.name)
        if tool is None:
            return error_result("usage", f"{params.name}: no such tool")
        try:
            payload = tool.build(dict(params.arguments or {}))
            data = await fleet.call(tool.control_op, payload)
        except FleetError as exc:
            message = str(exc)
            prefix = f"{tool.name}: "
            return error_result(
                exc.kind, message if message.startswith(prefix) else prefix + message
            )
        watcher.poke()
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(data))],
            structured_content=data,
        )

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        watcher.attach(ctx.session)
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    uri=FLEET_URI,
                    name="fleet",
                    description="the fleet as peek shows it (JSON); updated on every change",
                    mime_type="application/json",
                ),
                types.Resource(
                    uri=BRIEF_URI,
                    name="brief",
                    description="the moderator brief: what the fleet does, what needs you",
                    mime_type="text/plain",
                ),
            ]
        )

    async def read_resource(
        ctx: Any, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        watcher.attach(ctx.session)
        uri = str(params.uri)
        if uri == FLEET_URI:
            text, mime = json.dumps(await fleet.call("peek", {})), "application/json"
        elif uri == BRIEF_URI:
            text, mime = (await fleet.call("brief", {}))["text"], "text/plain"
        else:
            raise ValueError(f"{uri}: no such resource (fleet://fleet, fleet://brief)")
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, text=text, mime_type=mime)]
        )

    async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        watcher.attach(ctx.session)
        if str(params.uri) == FLEET_URI:
            watcher.subscribed = True
        return types.EmptyResult()

    async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        if str(params.uri) == FLEET_URI:
            watcher.subscribed = False
        return types.EmptyResult()

    async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
        watcher.attach(ctx.session)
        return types.EmptyResult()

    # The parents we serve speak the handshake era, whose logging and resources/subscribe the
    # SDK marks deprecated for the 2026-07-28 wire: they are what those parents hear.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        server: Server[Any] = Server(
            "fleet",
            instructions=INSTRUCTIONS,
            on_list_tools=list_tools,
            on_call_tool=call_tool,
            on_list_resources=list_resources,
            on_read_resource=read_resource,
            on_subscribe_resource=subscribe,
            on_unsubscribe_resource=unsubscribe,
            on_set_logging_level=set_level,
        )
    return server, watcher


class Watcher:
    """Polls ``peek``; each change is a resource update, each event a log message."""

    def __init__(self, fleet: Fleet, *, poll: float = POLL) -> None:
        self.fleet = fleet
        self.poll = poll
        self.session: Any = None
        self.subscribed = False
        self._wake = trio.Event()

    def attach(self, session: Any) -> None:
        if self.session is None:
            self.session = session
            self._wake.set()

    def poke(self) -> None:
        self._wake.set()

    async def run(self, notify: Callable[[Any], Any] | None = None) -> None:
        before: dict[str, Any] | None = None
        while True:
            with trio.move_on_after(self.poll):
                await self._wake.wait()
            self._wake = trio.Event()
            if self.session is None:
                continue
            try:
                after = await self.fleet.call("peek", {})
            except FleetError:
                continue
            if before is not None and _watch.fingerprint(after) == _watch.fingerprint(before):
                continue
            found = _watch.events(before, after) if before is not None else []
            before = after
            try:
                if self.subscribed:
                    await self.session.send_resource_updated(FLEET_URI)
                for event in found:
                    level = (
                        "error"
                        if event["event"] == "failed"
                        else "warning"
                        if event["event"] == "needs-input"
                        else "info"
                    )
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", MCPDeprecationWarning)
                        await self.session.send_log_message(level=level, data=event, logger="fleet")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return


async def serve_stdio(fleet: Fleet) -> None:
    server, watcher = build_server(fleet)
    options = server.create_initialization_options(NotificationOptions(resources_changed=False))
    async with stdio_server() as (read_stream, write_stream), trio.open_nursery() as nursery:
        nursery.start_soon(fleet.start_early)  # the parent need not wait for it to list tools
        nursery.start_soon(watcher.run)
        await server.run(read_stream, write_stream, options)
        nursery.cancel_scope.cancel()


def run(config: Config, *, settings: Mapping[str, Any] | None = None) -> None:
    anyio.run(serve_stdio, Fleet(config, settings=settings), backend="trio")
