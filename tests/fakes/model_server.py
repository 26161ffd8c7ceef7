"""A loopback scripted model server for driving real agent CLIs (and our own clients) offline.

One HTTP/1.1 server on ``127.0.0.1:<ephemeral>`` speaks three model APIs, streamed (SSE) and
plain JSON, on any path prefix ``/c/<child>``:

- ``POST /v1/chat/completions`` — OpenAI chat completions (Pi, our builtin ``openai`` model);
- ``POST /v1/messages[?beta=true]`` — Anthropic Messages (Claude Code); ``HEAD`` answers 404;
- ``POST /v1/responses`` — OpenAI Responses (Codex);
- ``POST /v1beta/models/<model>:streamGenerateContent`` (``:generateContent``) — Gemini (Gemini
  CLI, with ``GOOGLE_GEMINI_BASE_URL`` = the base URL).

A child can also be *played* instead of scripted: ``srv.play(child, player)`` calls
``player(request)`` for each of its model requests and serves the turn it returns, so a test's
model can read the tools a client offers and the results it sent back (a parent model).

Each child has its own script (see `tests.fakes._script`) and cursor: every model request takes
the child's next turn, whatever the API. A child without a script of its own walks the default
script with its own cursor; requests without a ``/c/<child>`` prefix belong to child
``"default"``. A request past the end of a script gets an HTTP 500 naming the child, so a test
that under-scripts fails loudly. Every request, model or not, is recorded::

    with ModelServer() as srv:
        srv.script("child-a", [{"tool_calls": [{"name": "read", "arguments": {"path": "x"}}]},
                               {"text": "done"}])
        run_cli(base_url=srv.base_url("child-a"))   # "http://127.0.0.1:PORT/c/child-a"
        assert srv.requests("child-a")[1].tool_results() == ["contents of x"]

The server runs its own trio loop in a background thread, so sync tests, trio tests
(``async with ModelServer()``) and subprocesses can all use it. Closing cancels everything in
flight: stalled streams end (the client sees the connection drop) and the thread is joined.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import unquote

import attrs
import trio

from tests.fakes._http import Connection, HttpError, HttpRequest
from tests.fakes._script import ScriptError, ToolCall, Turn, Usage, parse_script
from tests.fakes._wire import Api, Reply, error_json, render_json, render_stream

if TYPE_CHECKING:
    import types
    from collections.abc import Callable, Mapping, Sequence

    from tests.fakes._tls import TestCA

__all__ = ["DEFAULT_CHILD", "ModelServer", "Request", "ScriptError", "ToolCall", "Turn", "Usage"]

DEFAULT_CHILD = "default"
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0
_CHILD_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_PREFIXED = re.compile(r"/c/([^/]+)(/.*)?")
_APIS: dict[str, Api] = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
}
_GEMINI = re.compile(r"/v1(?:beta|alpha)?/models/[^/:]+:(?:streamGenerateContent|generateContent)")


@attrs.frozen(kw_only=True)
class Request:
    """One request as the server received it."""

    child: str
    api: Api | None  # None: not a model call (HEAD, unknown path)
    method: str
    path: str  # without the /c/<child> prefix and without the query
    query: str
    headers: Mapping[str, str]  # lower-cased names
    body: Any  # parsed JSON, or None when the body was empty or not JSON
    raw: bytes
    turn: int | None  # index of the script turn served; None when none was

    @property
    def stream(self) -> bool:
        if self.api == "gemini":
            return self.path.endswith(":streamGenerateContent")
        return isinstance(self.body, dict) and self.body.get("stream") is True

    def tool_names(self) -> list[str]:
        """The names of the tools the client offered in this request (Responses namespaces as
        ``namespace/name``, the name a played turn calls them by)."""
        body = self.body if isinstance(self.body, dict) else {}
        names: list[str] = []
        for tool in _dicts(body.get("tools")):
            if self.api == "gemini":
                names += [str(d.get("name")) for d in _dicts(tool.get("functionDeclarations"))]
            elif self.api == "chat":
                names.append(str((tool.get("function") or {}).get("name")))
            elif tool.get("type") == "namespace":
                names += [f"{tool.get('name')}/{t.get('name')}" for t in _dicts(tool.get("tools"))]
            else:
                names.append(str(tool.get("name")))
        return names

    def tool_schemas(self) -> dict[str, Any]:
        """Each offered tool's input schema by :meth:`tool_names` name."""
        body = self.body if isinstance(self.body, dict) else {}
        found: dict[str, Any] = {}
        for tool in _dicts(body.get("tools")):
            if self.api == "gemini":
                for d in _dicts(tool.get("functionDeclarations")):
                    found[str(d.get("name"))] = d.get("parametersJsonSchema") or d.get("parameters")
            elif self.api == "chat":
                function = tool.get("function") or {}
                found[str(function.get("name"))] = function.get("parameters")
            elif tool.get("type") == "namespace":
                for t in _dicts(tool.get("tools")):
                    found[f"{tool.get('name')}/{t.get('name')}"] = t.get("parameters")
            else:
                found[str(tool.get("name"))] = tool.get("input_schema") or tool.get("parameters")
        return found

    def tool_results(self) -> list[str]:
        """The text of every tool result the client sent back in this request, oldest first."""
        body = self.body if isinstance(self.body, dict) else {}
        if self.api == "chat":
            return [
                _flatten(message.get("content"))
                for message in _dicts(body.get("messages"))
                if message.get("role") == "tool"
            ]
        if self.api == "messages":
            return [
                _flatten(block.get("content"))
                for message in _dicts(body.get("messages"))
                if message.get("role") == "user"
                for block in _dicts(message.get("content"))
                if block.get("type") == "tool_result"
            ]
        if self.api == "responses":
            return [
                _flatten(item.get("output"))
                for item in _dicts(body.get("input"))
                if item.get("type") == "function_call_output"
            ]
        if self.api == "gemini":
            return [
                _flatten(_gemini_output(part["functionResponse"].get("response")))
                for content in _dicts(body.get("contents"))
                for part in _dicts(content.get("parts"))
                if isinstance(part.get("functionResponse"), dict)
            ]
        return []


@attrs.define(eq=False)
class ModelServer:
    """The scripted model server; use it as a (sync or async) context manager. With *tls* (a
    :class:`tests.fakes._tls.TestCA`) it serves HTTPS with a leaf that CA signed, standing in
    for a provider: :meth:`base_url` is then ``https://``."""

    tls: TestCA | None = None
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _scripts: dict[str, tuple[Turn, ...]] = attrs.field(factory=dict, init=False)
    _default: tuple[Turn, ...] = attrs.field(default=(), init=False)
    _players: dict[str, Callable[[Request], Mapping[str, Any] | Turn]] = attrs.field(
        factory=dict, init=False
    )
    _cursors: dict[str, int] = attrs.field(factory=dict, init=False)
    _requests: list[Request] = attrs.field(factory=list, init=False)
    _thread: threading.Thread | None = attrs.field(default=None, init=False)
    _started: threading.Event = attrs.field(factory=threading.Event, init=False)
    _port: int | None = attrs.field(default=None, init=False)
    _token: trio.lowlevel.TrioToken | None = attrs.field(default=None, init=False)
    _scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    #: Set by :meth:`release`: held turns answer from then on.
    _released: trio.Event | None = attrs.field(default=None, init=False)
    _failure: BaseException | None = attrs.field(default=None, init=False)
    #: A provider's rate limit (:meth:`rate_limit`): the window, its Retry-After, when it ends.
    _window: float = attrs.field(default=0.0, init=False)
    _retry_after: str = attrs.field(default="", init=False)
    _closed_until: float | None = attrs.field(default=None, init=False)
    #: When (``time.monotonic()``) and to which child each 429 of the rate limit was answered.
    limited: list[tuple[float, str]] = attrs.field(factory=list, init=False)

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Bind and serve in a background thread; returns once the port is known."""
        if self._thread is not None:
            raise RuntimeError("ModelServer.start: already started; use a new ModelServer")
        self._thread = threading.Thread(target=self._run, name="model-server", daemon=True)
        self._thread.start()
        if not self._started.wait(_START_TIMEOUT_S) or self._port is None:
            self.close()
            raise RuntimeError(
                f"ModelServer.start: not listening after {_START_TIMEOUT_S} s: {self._failure!r}"
            )

    def close(self) -> None:
        """Stop serving: cancel in-flight (also stalled) responses, join the thread.

        Re-raises, once, any exception that crashed the server loop, so a server bug fails the
        test that hit it instead of passing as a client timeout.
        """
        thread = self._thread
        if thread is None:
            return
        if self._scope is not None and self._token is not None:
            # RunFinished: the loop already ended on its own (it crashed): nothing to cancel.
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        thread.join(_STOP_TIMEOUT_S)
        if thread.is_alive():
            raise RuntimeError(f"ModelServer.close: thread still running after {_STOP_TIMEOUT_S} s")
        failure, self._failure = self._failure, None
        if failure is not None:
            raise RuntimeError(f"ModelServer crashed while serving: {failure!r}") from failure

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        await trio.to_thread.run_sync(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        await trio.to_thread.run_sync(self.close)

    # --- the test's side -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(
                "ModelServer.port: the server is not started; use it in a with block"
            )
        return self._port

    def base_url(self, child: str = DEFAULT_CHILD) -> str:
        """The root a client appends ``/v1/...`` to: ``http://127.0.0.1:PORT/c/<child>``."""
        _check_child(child)
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://127.0.0.1:{self.port}/c/{child}"

    def script(self, child: str, turns: Sequence[Mapping[str, Any] | Turn]) -> None:
        """Give `child` its own script (replacing any earlier one) and rewind its cursor."""
        _check_child(child)
        parsed = parse_script(turns)
        with self._lock:
            self._scripts[child] = parsed
            self._cursors[child] = 0

    def play(self, child: str, player: Callable[[Request], Mapping[str, Any] | Turn]) -> None:
        """Answer `child`'s model requests with ``player(request)`` (a turn dict or `Turn`),
        called on the server's thread, one request at a time; it replaces any script."""
        _check_child(child)
        with self._lock:
            self._players[child] = player
            self._scripts.pop(child, None)

    def default_script(self, turns: Sequence[Mapping[str, Any] | Turn]) -> None:
        """The script of every child that has none of its own (each child keeps its own cursor)."""
        parsed = parse_script(turns)
        with self._lock:
            self._default = parsed

    def release(self) -> None:
        """Let every held turn (``"hold": True``) answer, those waiting now and any to come."""
        if self._released is not None and self._token is not None:
            # run_sync_soon: callable from any thread, also from a test's own trio loop.
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._released.set)

    def rate_limit(self, window: float, retry_after: str) -> None:
        """Answer the next model request, and every one for *window* seconds after it, with
        ``429`` and ``Retry-After: <retry_after>`` (a provider's limit; the script waits)."""
        with self._lock:
            self._window, self._retry_after, self._closed_until = window, retry_after, None

    def _limited_now(self, child: str) -> bool:
        with self._lock:
            if not self._window:
                return False
            now = time.monotonic()
            if self._closed_until is None:
                self._closed_until = now + self._window
            if now >= self._closed_until:
                return False
            self.limited.append((now, child))
            return True

    def requests(self, child: str | None = None) -> list[Request]:
        """Every request received so far (for `child`, or for all), in arrival order."""
        with self._lock:
            return [r for r in self._requests if child is None or r.child == child]

    # --- serving -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # handed to the test thread by close()
            self._failure = exc
        finally:
            self._started.set()  # also when startup failed, so start() does not wait in vain

    async def _serve(self) -> None:
        plain = await trio.open_tcp_listeners(0, host="127.0.0.1")
        listeners: list[trio.abc.Listener[Any]] = list(plain)
        if self.tls is not None:
            context = self.tls.server_context()
            listeners = [trio.SSLListener(each, context, https_compatible=True) for each in plain]
        with trio.CancelScope() as scope:
            self._scope = scope
            self._token = trio.lowlevel.current_trio_token()
            self._released = trio.Event()
            self._port = plain[0].socket.getsockname()[1]
            self._started.set()
            await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.abc.Stream) -> None:
        connection = Connection(stream)
        async with stream:
            try:
                while True:
                    try:
                        request = await connection.next_request()
                    except HttpError as exc:
                        payload = {"error": {"message": exc.reason, "type": "invalid_request"}}
                        await connection.send_json(exc.status, payload, keep_alive=False)
                        return
                    if request is None or not await self._answer(connection, request):
                        return
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the client hung up mid-response: its business, not a server failure

    async def _answer(self, connection: Connection, http: HttpRequest) -> bool:
        """Record and answer one request; False when the connection must close afterwards."""
        path, _, query = http.target.partition("?")
        child, rest = _route(path)
        api = (
            (_APIS.get(rest) or ("gemini" if _GEMINI.fullmatch(rest) else None))
            if (http.method == "POST")
            else None
        )
        body = _parse_json(http.body)
        if api is not None and isinstance(body, dict) and self._limited_now(child):
            message = "model server: rate limited"
            extra = [("Retry-After", self._retry_after)]
            await connection.send_json(429, error_json(api, 429, message), extra=extra)
            return http.keep_alive
        served = api is not None and isinstance(body, dict)
        request = Request(
            child=child,
            api=api,
            method=http.method,
            path=rest,
            query=query,
            headers=http.headers,
            body=body,
            raw=http.body,
            turn=None,
        )
        turn_index, turn = self._take_turn(child, request) if served else (None, None)
        with self._lock:
            self._requests.append(attrs.evolve(request, turn=turn_index))
        if http.method == "HEAD":
            await connection.send_empty(404)
            return http.keep_alive
        if api is None:
            message = f"model server: no model API at {http.method} {http.target}"
            await connection.send_json(404, {"error": {"message": message}}, keep_alive=False)
            return False
        if not isinstance(body, dict):
            message = "model server: request body is not a JSON object"
            await connection.send_json(400, error_json(api, 400, message), keep_alive=False)
            return False
        if turn is None:
            count = len(self._script_of(child))
            message = (
                f"model server: script for child {child!r} is exhausted after {count} turns;"
                " script more turns"
            )
            await connection.send_json(500, error_json(api, 500, message), keep_alive=False)
            return False
        reply = Reply(
            turn=turn, model=str(body.get("model", "scripted")), reply_id=f"{child}-{turn_index}"
        )
        await trio.sleep(turn.delay)
        if turn.hold and self._released is not None:
            await self._released.wait()
        await _serve_turn(connection, api, reply, stream=request.stream)
        return http.keep_alive

    def _script_of(self, child: str) -> tuple[Turn, ...]:
        return self._scripts.get(child, self._default)

    def _take_turn(self, child: str, request: Request) -> tuple[int | None, Turn | None]:
        player = self._players.get(child)
        if player is not None:
            with self._lock:
                index = self._cursors.get(child, 0)
                self._cursors[child] = index + 1
            # A player's mistake is the test's: it fails the test through close().
            played = player(request)
            return index, played if isinstance(played, Turn) else parse_script([played])[0]
        with self._lock:
            script = self._script_of(child)
            index = self._cursors.get(child, 0)
            if index >= len(script):
                return None, None
            self._cursors[child] = index + 1
            return index, script[index]


async def _serve_turn(connection: Connection, api: Api, reply: Reply, *, stream: bool) -> None:
    turn = reply.turn
    if turn.status is not None:
        if turn.body:
            await connection.send_whole(turn.status, turn.body.encode(), "text/plain")
        else:
            message = f"model server: scripted fault ({reply.reply_id})"
            await connection.send_json(turn.status, error_json(api, turn.status, message))
        return
    if not stream:
        await connection.send_json(200, render_json(api, reply))
        return
    rendered = render_stream(api, reply)
    await connection.start_events()
    if turn.stall:
        for frame in rendered.frames[: rendered.stall_at]:
            await connection.send_event(frame)
        await trio.sleep_forever()  # until close() cancels the server
    for frame in rendered.frames:
        await connection.send_event(frame)
    await connection.end_events()


def _route(path: str) -> tuple[str, str]:
    """Split ``/c/<child>/rest`` into (child, rest); anything else is the default child's."""
    match = _PREFIXED.fullmatch(path)
    if match is None:
        return DEFAULT_CHILD, path
    return unquote(match.group(1)), match.group(2) or "/"


def _check_child(child: str) -> None:
    if not _CHILD_ID.fullmatch(child):
        raise ValueError(
            f"ModelServer: child id {child!r} is not 1-64 characters of [A-Za-z0-9._-]; rename it"
        )


def _parse_json(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def _dicts(value: object) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _gemini_output(response: object) -> object:
    """Gemini CLI wraps a tool's result as ``{"output": text}`` (or ``{"error": text}``)."""
    if isinstance(response, dict) and len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return response


def _flatten(content: object) -> str:
    """A tool result's text: a plain string, or the text parts of a content list joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in content
        )
    return json.dumps(content)
