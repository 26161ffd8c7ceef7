"""The few bytes of HTTP/1.1 the scripted model server needs, over a trio stream.

Keep-alive, ``Content-Length`` request bodies (what every client under test sends), chunked
response bodies for server-sent events. Anything else is answered with an error and the
connection is closed: a test server should fail loudly, not guess. Every read is bounded in size
and time.
"""

from __future__ import annotations

import json
from http import HTTPStatus

import attrs
import trio

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 8 * 1024 * 1024
# A pooled client connection may sit idle between a test's requests; closing it sooner than the
# client expects makes some clients fail their next request instead of reconnecting.
IDLE_TIMEOUT_S = 120.0
BODY_TIMEOUT_S = 30.0
_READ_CHUNK = 65536


class HttpError(Exception):
    """The peer sent something this server will not parse; answer `status` and close."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}")
        self.status = status
        self.reason = reason


@attrs.frozen(kw_only=True)
class HttpRequest:
    method: str
    target: str  # path plus query, as sent
    headers: dict[str, str]  # lower-cased names; repeated headers joined with ", "
    body: bytes

    @property
    def keep_alive(self) -> bool:
        return "close" not in self.headers.get("connection", "").lower()


@attrs.define(eq=False)
class Connection:
    """One client connection: reads requests in order, writes whole or streamed responses."""

    stream: trio.abc.Stream
    _buffer: bytearray = attrs.field(factory=bytearray)

    async def next_request(self) -> HttpRequest | None:
        """The next request, or None when the client closed (or idled out) between requests."""
        head = None
        with trio.move_on_after(IDLE_TIMEOUT_S):
            head = await self._read_head()
        if head is None:
            return None
        method, target, headers = _parse_head(head)
        body = await self._read_body(headers)
        return HttpRequest(method=method, target=target, headers=headers, body=body)

    async def _read_head(self) -> bytes | None:
        while b"\r\n\r\n" not in self._buffer:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise HttpError(431, f"request head exceeds {MAX_HEAD_BYTES} bytes")
            if not await self._fill():
                if self._buffer:
                    raise HttpError(400, "connection closed inside a request head")
                return None
        head, _, rest = bytes(self._buffer).partition(b"\r\n\r\n")
        if len(head) > MAX_HEAD_BYTES:
            raise HttpError(431, f"request head exceeds {MAX_HEAD_BYTES} bytes")
        self._buffer[:] = rest
        return head

    async def _read_body(self, headers: dict[str, str]) -> bytes:
        if "transfer-encoding" in headers:
            raise HttpError(411, "chunked request bodies are not supported; send Content-Length")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise HttpError(400, "Content-Length is not an integer") from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise HttpError(413, f"request body of {length} bytes exceeds {MAX_BODY_BYTES}")
        with trio.move_on_after(BODY_TIMEOUT_S) as deadline:
            while len(self._buffer) < length:
                if not await self._fill():
                    raise HttpError(400, "connection closed inside a request body")
        if deadline.cancelled_caught:
            raise HttpError(408, f"request body not received within {BODY_TIMEOUT_S} s")
        body = bytes(self._buffer[:length])
        del self._buffer[:length]
        return body

    async def _fill(self) -> bool:
        data = await self.stream.receive_some(_READ_CHUNK)
        self._buffer += data
        return bool(data)

    async def send_json(
        self,
        status: int,
        payload: object,
        *,
        keep_alive: bool = True,
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        body = json.dumps(payload).encode()
        await self.send_whole(status, body, "application/json", keep_alive=keep_alive, extra=extra)

    async def send_whole(
        self,
        status: int,
        body: bytes,
        content_type: str,
        *,
        keep_alive: bool = True,
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        """A complete response; ``keep_alive=False`` announces that the server will close."""
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        headers += extra or []
        if not keep_alive:
            headers.append(("Connection", "close"))
        await self.stream.send_all(_head(status, headers) + body)

    async def send_empty(self, status: int) -> None:
        """A bodiless answer, e.g. to HEAD (whose reply must not carry a body)."""
        await self.stream.send_all(_head(status, [("Content-Length", "0")]))

    async def start_events(self) -> None:
        headers = [
            ("Content-Type", "text/event-stream"),
            ("Cache-Control", "no-cache"),
            ("Transfer-Encoding", "chunked"),
        ]
        await self.stream.send_all(_head(200, headers))

    async def send_event(self, frame: bytes) -> None:
        await self.stream.send_all(b"%x\r\n%b\r\n" % (len(frame), frame))

    async def end_events(self) -> None:
        await self.stream.send_all(b"0\r\n\r\n")


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    # Scripts may use codes outside the standard registry (Anthropic's 529 "overloaded").
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    lines = [f"HTTP/1.1 {status} {phrase}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, f"malformed request line {request_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise HttpError(400, f"malformed header line {line[:80]!r}")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return parts[0], parts[1], headers
