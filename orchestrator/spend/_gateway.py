"""The model gateway: one child's model traffic, relayed by the supervisor, keyed and metered.

The egress proxy hands a child's tunnel to its model endpoint to :meth:`Gateway.serve` instead
of dialling it: the child speaks plain HTTP/1.1 (its base URL is ``http://``, a port of the
relay in its sandbox, even when the model's own URL is ``https``), read here with ``h11``. A
tunnel that opens with a TLS handshake instead — a client dialling the model host itself — is
refused and logged: the gateway makes the upstream TLS connection, and the child holds only a
placeholder key (:mod:`._keyless`). Each request is

- refused when a hard cap is reached (:attr:`Gateway.refusal` says why): a ``403`` with a JSON
  error body both OpenAI and Anthropic clients show (``error.message``), never retried;
- otherwise relayed upstream with ``httpx`` (TLS when the upstream is ``https``): every
  credential header the child sent (``authorization``, ``x-api-key``, ``api-key``) is dropped
  and, on a model call (:func:`is_model_call`: a ``POST`` to a model API, a ``GET`` of the
  model list), the real one the supervisor holds (:attr:`Gateway.credentials`) is set, so a
  child needs only a placeholder and cannot spend the key on the provider's other APIs;
  ``accept-encoding: identity`` so what passes can be read;
- streamed back as it arrives (SSE or whole), each byte fed to a :class:`Meter`; when the
  response ends its bill goes to :attr:`Gateway.on_usage` — the ledger's own count.

A request body over :data:`MAX_BODY` bytes, a malformed request or a broken upstream is answered
with one status line; the gateway never raises into the proxy.
"""

import contextlib
import functools
import json
import os
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import attrs
import h11
import httpx
import trio

import ipc
from orchestrator.spend._metering import Meter, Metered
from orchestrator.spend._pacing import Pacing, retry_after

__all__ = [
    "ANTHROPIC_URL",
    "MAX_BODY",
    "MAX_RETRIES",
    "MODEL_PATHS",
    "Gateway",
    "gateway_url",
    "is_model_call",
    "model_gateway",
]

MAX_BODY: Final = 32 << 20
#: How often one request is retried after a 429/529 cooldown before the child gets the answer.
MAX_RETRIES: Final = 5
_CHUNK: Final = 65536
#: The first byte of a TLS record carrying a handshake (a ClientHello).
_TLS_HANDSHAKE: Final = b"\x16"
_DIRECT: Final = (
    "a TLS connection straight to the model endpoint; the gateway serves the child's model "
    "in plain HTTP at the base URL fleet gives it (children hold no key)"
)
_CREDENTIALS: Final = frozenset({"authorization", "x-api-key", "api-key"})
_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
    }
)


def _tls() -> ssl.SSLContext:
    """The system's trust store (``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured: a corporate
    CA, or a test's), loaded once per setting (loading it per connection cost ~0.3 s)."""
    return _trust(os.environ.get("SSL_CERT_FILE", ""), os.environ.get("SSL_CERT_DIR", ""))


@functools.cache
def _trust(_file: str, _directory: str) -> ssl.SSLContext:
    return ssl.create_default_context()


#: The model URL an ``anthropic`` model without one reaches.
ANTHROPIC_URL: Final = "https://api.anthropic.com"


def gateway_url(model: ipc.ModelSpec) -> str:
    """The model URL a gateway serves for *model*: its base URL (an ``anthropic`` model's
    default when it names none); "" for a model the gateway cannot serve (a script, or a
    name only an agent CLI resolves, with that CLI's own endpoint and credentials)."""
    if model.kind == "openai":
        return model.base_url
    if model.kind == "anthropic":
        return model.base_url or ANTHROPIC_URL
    return ""


def _model_of(body: bytes | bytearray) -> str:
    """The ``model`` a request body names ("" when it names none)."""
    try:
        value = json.loads(body).get("model") if body[:1] == b"{" else None
    except (ValueError, AttributeError):
        return ""
    return value[:200] if isinstance(value, str) else ""


#: The paths (their ends: the base URL's own path comes first) of the model APIs the gateway
#: keys: OpenAI Chat Completions, Completions and Responses, Anthropic Messages (and its
#: token count).
MODEL_PATHS: Final = (
    "/chat/completions",
    "/completions",
    "/responses",
    "/messages",
    "/messages/count_tokens",
)


def is_model_call(method: str, target: str) -> bool:
    """Whether a request is a model call the real key may go on: a ``POST`` to a model API
    (a token count too), or a ``GET`` of the model list."""
    path = target.split("?", 1)[0].rstrip("/")
    if method == "POST":
        return path.endswith(MODEL_PATHS)
    return method == "GET" and (path.endswith("/models") or "/models/" in path)


def _describe(exc: BaseException) -> str:
    """What went wrong, in one line: httpx's own message is empty for a TLS failure."""
    cause: BaseException | None = exc
    while cause is not None and not str(cause).strip():
        cause = cause.__cause__ or cause.__context__
    text = str(cause if cause is not None else type(exc).__name__)
    return " ".join(text.split())[:300]


def _origin_form(target: str) -> str:
    """The path and query of a request *target* (an absolute-form ``http://host/path`` too)."""
    if target.startswith(("http://", "https://")):
        parts = urlsplit(target)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return target if target.startswith("/") else "/" + target


def _error_body(message: str) -> bytes:
    return json.dumps(
        {"type": "error", "error": {"type": "fleet_refused", "message": message}}
    ).encode()


@attrs.define(eq=False)
class Gateway:
    """One child's model gateway (see the module docstring)."""

    #: The real endpoint: ``scheme://host[:port]`` (the child's request path is kept).
    upstream: str
    on_usage: Callable[[Metered], None]
    #: The headers that carry the real credential (``{"x-api-key": "sk-..."}``); empty: the
    #: child's own credential headers pass (a loopback model that needs none).
    credentials: Mapping[str, str] = attrs.Factory(dict)
    #: Why no further model request may go out (a hard cap reached), or None.
    refusal: Callable[[], str | None] = lambda: None
    #: Each request refused or failed, for the run log: (what, why).
    on_refused: Callable[[str, str], None] = lambda _what, _why: None
    client: httpx.AsyncClient | None = None
    timeout: float = 600.0
    #: The session's provider gates; None: unpaced, a 429 goes straight to the child.
    pacing: Pacing | None = None
    #: A request waits on its provider's cooldown (``peek`` shows the line).
    on_wait: Callable[[str], None] = lambda _line: None

    async def serve(self, stream: trio.abc.Stream, first: bytes = b"") -> None:
        """Serve HTTP/1.1 requests on *stream* (the bytes *first* already read) until it
        closes; every request relayed, metered or refused."""
        connection = h11.Connection(h11.SERVER)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            first = first or bytes(await stream.receive_some(_CHUNK))
        if first[:1] == _TLS_HANDSHAKE:
            # A client that dials the model host itself (the real key's way past us): refused.
            self.on_refused(self.upstream, _DIRECT)
            return
        connection.receive_data(first)
        async with contextlib.AsyncExitStack() as stack:
            client = self.client
            if client is None:
                client = await stack.enter_async_context(
                    httpx.AsyncClient(timeout=self.timeout, trust_env=False, verify=_tls())
                )
            with contextlib.suppress(
                trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError
            ):
                while await self._one(stream, connection, client):
                    connection.start_next_cycle()

    async def _one(
        self, stream: trio.abc.Stream, connection: h11.Connection, client: httpx.AsyncClient
    ) -> bool:
        """One request and its response; whether the connection may carry another."""
        request = await _next(stream, connection)
        if not isinstance(request, h11.Request):
            return False
        body = bytearray()
        while True:
            event = await _next(stream, connection)
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    await self._answer(stream, connection, 413, "request body too large")
                    return False
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                return False
        target = _origin_form(request.target.decode("ascii", "replace"))
        refusal = self.refusal()
        if refusal is not None:
            self.on_refused(target, refusal)
            await self._answer(stream, connection, 403, refusal)
            return connection.our_state is h11.DONE and connection.their_state is h11.DONE
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in request.headers
            if name.lower().decode("latin-1") not in _HOP
            and (not self.credentials or name.lower().decode("latin-1") not in _CREDENTIALS)
        ]
        method = request.method.decode("ascii", "replace")
        model_call = is_model_call(method, target)
        # The real key goes only on a model request: a child cannot spend it on the provider's
        # other APIs (files, fine-tunes, an organisation's settings) through us.
        headers += [
            *(self.credentials.items() if model_call else ()),
            ("accept-encoding", "identity"),
        ]
        paced = self.pacing is not None and model_call
        gate = self.pacing.gate(self.upstream, _model_of(body)) if paced and self.pacing else None
        for attempt in range(MAX_RETRIES + 1):
            if gate is not None:
                if gate.cooling:
                    self.on_wait(f"waiting on {gate.key} ({gate.cooling:.0f} s cooldown)")
                await gate.turn()
            outgoing = client.build_request(
                method,
                self.upstream.rstrip("/") + target,
                headers=headers,
                content=bytes(body),
            )
            try:
                response = await client.send(outgoing, stream=True)
            except httpx.HTTPError as exc:
                self.on_refused(target, f"upstream failed: {_describe(exc)}")
                message = f"fleet gateway: upstream failed: {_describe(exc)}"
                await self._answer(stream, connection, 502, message)
                return False
            if gate is None or self.pacing is None or response.status_code not in (429, 529):
                break
            wait = retry_after(response.headers.get("retry-after"))
            gate.cool(wait)  # every child's request to this provider waits it out
            if wait > self.pacing.patience or attempt == MAX_RETRIES:
                break  # the child gets the 429 (a role's fallback may take over)
            await response.aclose()
        async with contextlib.aclosing(response):
            meter = Meter(streaming="event-stream" in response.headers.get("content-type", ""))
            reply = [
                (name, value)
                for name, value in response.headers.multi_items()
                if name.lower() not in _HOP and name.lower() != "content-encoding"
            ]
            await stream.send_all(
                connection.send(
                    h11.Response(
                        status_code=response.status_code,
                        headers=reply,
                        reason=response.reason_phrase.encode("latin-1", "replace"),
                    )
                )
                or b""
            )
            try:
                async for chunk in response.aiter_raw(_CHUNK):
                    meter.feed(chunk)
                    await stream.send_all(connection.send(h11.Data(data=chunk)) or b"")
            except httpx.HTTPError as exc:
                self.on_refused(target, f"upstream broke off: {_describe(exc)}")
                return False
            finally:
                usage = meter.usage()
                if not usage.empty:
                    self.on_usage(usage)
            await stream.send_all(connection.send(h11.EndOfMessage()) or b"")
        return connection.our_state is h11.DONE and connection.their_state is h11.DONE

    async def _answer(
        self, stream: trio.abc.Stream, connection: h11.Connection, status: int, message: str
    ) -> None:
        body = _error_body(message)
        headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
        data = connection.send(h11.Response(status_code=status, headers=headers)) or b""
        data += connection.send(h11.Data(data=body)) or b""
        data += connection.send(h11.EndOfMessage()) or b""
        await stream.send_all(data)


async def _next(stream: trio.abc.Stream, connection: h11.Connection) -> object:
    """The next h11 event, reading from *stream* as needed (None: the peer closed)."""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = bytes(await stream.receive_some(_CHUNK))
            connection.receive_data(data)
            if not data and connection.their_state is not h11.DONE:
                event = connection.next_event()
                return None if event is h11.NEED_DATA else event
            continue
        if event is h11.PAUSED:
            return None
        return event


class Metering(Protocol):
    """What a child's gateway reports to (``spend._budgets.Budgets``)."""

    @property
    def pacing(self) -> Pacing | None: ...
    def on_metered(self, run: Any, metered: Metered) -> None: ...
    def refusal(self, key: str) -> str | None: ...


class Logged(Protocol):
    @property
    def key(self) -> str: ...
    def gateway_refused(self, what: str, why: str) -> None: ...
    def provider_wait(self, line: str) -> None: ...


def model_gateway(
    spend: Metering,
    run: Logged,
    model: ipc.ModelSpec,
    allowed: Iterable[str],
    environ: Mapping[str, str],
) -> dict[tuple[str, int], Callable[[trio.abc.Stream, bytes], Awaitable[None]]]:
    """The egress proxy's model handler for *run*: its model's endpoint (:func:`gateway_url`,
    ``http`` or ``https``), when that is on its allowlist, served by a :class:`Gateway`
    (metered, capped; the real key of ``model.api_key_env`` from *environ* set on the way out,
    over TLS of the gateway's own when the endpoint is ``https``); else nothing."""
    parts = urlsplit(gateway_url(model))
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        return {}
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return {}
    pair = (parts.hostname.lower(), port)
    if f"{pair[0]}:{port}" not in {a.lower() for a in allowed} and (
        f"[{pair[0]}]:{port}" not in {a.lower() for a in allowed}
    ):
        return {}
    key = environ.get(model.api_key_env, "") if model.api_key_env else ""
    credentials: dict[str, str] = {}
    if key:
        credentials = (
            {"x-api-key": key} if model.kind == "anthropic" else {"authorization": f"Bearer {key}"}
        )
    host = f"[{pair[0]}]" if ":" in pair[0] else pair[0]
    gateway = Gateway(
        upstream=f"{parts.scheme}://{host}:{port}",
        on_usage=lambda metered: spend.on_metered(run, metered),
        credentials=credentials,
        refusal=lambda: spend.refusal(run.key),
        on_refused=run.gateway_refused,
        pacing=spend.pacing,
        on_wait=run.provider_wait,
    )
    return {pair: gateway.serve}
