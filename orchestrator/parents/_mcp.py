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
from orchestrator.parents import _present, _watch
from orchestrator.parents._tools import BY_NAME, INSTRUCTIONS, MAX_DEPTH, TOOLS, outcome
from orchestrator.parents._wire import TOO_DEEP, GuardedStdin

FLEET_URI: Final = "fleet://fleet"
BRIEF_URI: Final = "fleet://brief"
POLL: Final = 1.0

PROGRESS_EVERY: Final = 2.0


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
    """An error every client shows its model: text only (a structured content would have to
    match a declared output schema, and Gemini CLI and opencode check even an error's)."""
    text = json.dumps({"error": {"kind": kind, "message": " ".join(message.split())}})
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def ok_result(data: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(data, ensure_ascii=False))],
        structured_content=data,
    )


def build_server(fleet: Fleet) -> tuple[Server[Any], "Watcher"]:
    watcher = Watcher(fleet)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        watcher.attach(ctx.session)
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=tool.name, description=tool.description, input_schema=tool.input_schema
                )
                for tool in TOOLS
            ]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        watcher.attach(ctx.session)
        tool = BY_NAME.get(params.name)
        if tool is None:
            return error_result(
                "usage", f"{params.name}: no such tool (tools: {', '.join(BY_NAME)})"
            )
        arguments = params.arguments or {}
        if TOO_DEEP in arguments:
            return error_result(
                "usage",
                f"{tool.name}: arguments nested deeper than {MAX_DEPTH} levels",
            )
        try:
            op, payload = tool.request(arguments)
            if op == "wait":
                data = await _waiting(fleet, ctx, payload)
            else:
                data = await fleet.call(op, payload)
        except FleetError as exc:
            message = str(exc)
            prefix = f"{tool.name}: "
            return error_result(
                exc.kind, message if message.startswith(prefix) else prefix + message
            )
        except Exception as exc:
            return error_result("internal", f"{tool.name}: internal error: {_first(exc)}")
        watcher.poke()
        try:
            return ok_result(outcome(op, data))
        except FleetError as exc:
            return error_result(exc.kind, str(exc))

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
            peek = _present.shape("peek", await fleet.call("peek", {}))
            text, mime = json.dumps(peek, ensure_ascii=False), "application/json"
        elif uri == BRIEF_URI:
            text, mime = (
                _present.shape("brief", await fleet.call("brief", {}))["text"],
                "text/plain",
            )
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


def _first(exc: BaseException) -> str:
    """The first real error in *exc* (an exception group's innermost), in one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


async def _waiting(fleet: Fleet, ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """``wait``, sending ``notifications/progress`` (the working children) while it blocks
    when the caller gave a progress token."""
    token = (getattr(ctx, "meta", None) or {}).get("progress_token")
    if token is None:
        return await fleet.call("wait", payload)
    data: dict[str, Any] | None = None
    error: FleetError | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_beat, fleet, ctx, token)
        try:
            data = await fleet.call("wait", payload)
        except FleetError as exc:  # raised here, outside the nursery: never a group
            error = exc
        finally:
            nursery.cancel_scope.cancel()
    if error is not None:
        raise error
    assert data is not None  # noqa: S101 - set unless it raised
    return data


async def _beat(fleet: Fleet, ctx: Any, token: str | int) -> None:
    tick = 0
    while True:
        try:
            peek = await fleet.call("peek", {})
        except FleetError:
            peek = {}
        working = [a for a in peek.get("agents", []) if a.get("state") in _present.WORKING]
        message = _present.progress_line(working, len(peek.get("questions", [])))
        try:
            await ctx.session.send_progress_notification(
                token, float(tick), None, message, related_request_id=ctx.request_id
            )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return
        tick += 1
        await trio.sleep(PROGRESS_EVERY)


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
    stdin: Any = GuardedStdin()
    async with (
        stdio_server(stdin=stdin) as (read_stream, write_stream),
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(fleet.start_early)  # the parent need not wait for it to list tools
        nursery.start_soon(watcher.run)
        await server.run(read_stream, write_stream, options)
        nursery.cancel_scope.cancel()


def run(config: Config, *, settings: Mapping[str, Any] | None = None) -> None:
    anyio.run(serve_stdio, Fleet(config, settings=settings), backend="trio")
