"""Shared parts for the ``ipc`` tests: a real listening socket and authenticated channels.

Everything here is real: a Unix socket in a short pytest temp directory, the real handshake,
real channels. Helpers are handed out by fixtures because ``--import-mode=importlib`` gives
test modules no way to import this one.
"""

import json
import math
import os
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import ipc
from tests.fakes._tls import tls_pair

OWNER = "a1"
TYPE_NAMES = {cls: name for name, cls in ipc.MESSAGE_TYPES.items()}
CEILING = 10


@attrs.define(eq=False)
class Wire:
    """Session material for one test: the key, and the token lookup a supervisor would use."""

    key: bytes
    owners: set[str]

    def token(self, owner: str = OWNER) -> str:
        return ipc.derive_token(self.key, owner)

    def lookup(self, owner: str) -> str | None:
        return self.token(owner) if owner in self.owners else None

    def frame(
        self,
        message: ipc.Message,
        *,
        kind: str = "request",
        corr: str = "1",
        owner: str = OWNER,
        token: str | None = None,
    ) -> bytes:
        """One well-formed frame, as a hand-written peer would send it."""
        envelope = ipc.Envelope(
            v=1,
            token=self.token(owner) if token is None else token,
            owner=owner,
            corr=corr,
            kind=kind,  # type: ignore[arg-type]
            type=TYPE_NAMES[type(message)],
            body=message,
        )
        return ipc.encode_frame(ipc.encode_envelope(envelope))

    def event(self, text: str) -> bytes:
        return self.frame(ipc.Event(activity="status", text=text), kind="event", corr="")

    def raw_frame(self, obj: Any) -> bytes:
        """A frame whose body is *obj* as JSON (for hand-made invalid envelopes)."""
        return frame_of(json.dumps(obj).encode())

    def envelope(self, type_: str, body: dict[str, Any], **fields: Any) -> dict[str, Any]:
        """An envelope dict with valid values, overridden by *fields*."""
        obj: dict[str, Any] = {
            "v": 1,
            "token": self.token(),
            "owner": OWNER,
            "corr": "1",
            "kind": "request",
            "type": type_,
            "body": body,
        }
        obj.update(fields)
        return obj


def frame_of(body: bytes) -> bytes:
    """*body* behind a length prefix, whatever it is (no checks, unlike ``encode_frame``)."""
    return struct.pack(">I", len(body)) + body


@attrs.define(eq=False)
class Served:
    """A channel whose :meth:`ipc.Channel.serve` runs in the test's nursery, with recordings."""

    channel: ipc.Channel
    requests: list[ipc.Envelope] = attrs.Factory(list)
    finished: trio.Event = attrs.Factory(trio.Event)
    _send: trio.MemorySendChannel[ipc.Envelope] = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel[ipc.Envelope] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[ipc.Envelope](math.inf)

    async def handle(self, envelope: ipc.Envelope) -> ipc.Message:
        self.requests.append(envelope)
        return ipc.Reply(ok=True, data={"type": envelope.type, "n": len(self.requests)})

    async def on_event(self, envelope: ipc.Envelope) -> None:
        self._send.send_nowait(envelope)

    async def next_event(self) -> ipc.Envelope:
        with trio.fail_after(CEILING):
            return await self._receive.receive()

    def events_so_far(self) -> list[ipc.Envelope]:
        out = []
        while True:
            try:
                out.append(self._receive.receive_nowait())
            except trio.WouldBlock:
                return out

    async def wait_finished(self) -> None:
        with trio.fail_after(CEILING):
            await self.finished.wait()


Handler = Callable[[ipc.Envelope], Awaitable[ipc.Message]]
EventHandler = Callable[[ipc.Envelope], Awaitable[None]]


async def serve(
    nursery: trio.Nursery,
    channel: ipc.Channel,
    handler: Handler | None = None,
    on_event: EventHandler | None = None,
) -> Served:
    served = Served(channel=channel)

    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await channel.serve(
                handler or served.handle, on_event or served.on_event, task_status=task_status
            )
        finally:
            served.finished.set()

    await nursery.start(run)
    return served


@attrs.define(eq=False)
class FrameReader:
    """The raw side of a connection: read whole frames, or everything up to EOF."""

    stream: trio.abc.ReceiveStream
    decoder: ipc.FrameDecoder = attrs.Factory(ipc.FrameDecoder)
    frames: list[bytes] = attrs.Factory(list)

    async def next(self) -> ipc.Envelope:
        with trio.fail_after(CEILING):
            while not self.frames:
                data = await self.stream.receive_some()
                if not data:
                    raise EOFError("peer closed before a whole frame")
                self.frames += self.decoder.feed(data)
        return ipc.decode_envelope(self.frames.pop(0))

    async def next_raw(self) -> bytes:
        with trio.fail_after(CEILING):
            while not self.frames:
                data = await self.stream.receive_some()
                if not data:
                    raise EOFError("peer closed before a whole frame")
                self.frames += self.decoder.feed(data)
        return self.frames.pop(0)

    async def rest(self) -> bytes:
        """Every byte still unread when the peer closes (frames already split out included)."""
        chunks: list[bytes | bytearray] = [frame_of(frame) for frame in self.frames]
        self.frames.clear()
        if self.decoder.buffered:  # a partial frame counts as "the peer sent something"
            chunks.append(b"<partial frame>")
        with trio.fail_after(CEILING):
            while chunk := await self.stream.receive_some():
                chunks.append(chunk)
        return b"".join(chunks)


@attrs.define(eq=False)
class RawSession:
    """An authenticated server channel facing a hand-driven client socket."""

    wire: Wire
    served: Served
    stream: trio.abc.Stream
    reader: FrameReader

    @property
    def server(self) -> ipc.Channel:
        return self.served.channel

    async def sync(self, text: str = "sync") -> None:
        """Send a valid event and wait for it: every earlier frame has then been handled."""
        await self.stream.send_all(self.wire.event(text))
        while (await self.served.next_event()).body != ipc.Event(activity="status", text=text):
            pass


@pytest.fixture
def wire() -> Wire:
    return Wire(key=ipc.new_session_key(), owners={OWNER})


@pytest.fixture
def sock_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # tmp_path can exceed sun_path (108 bytes) with a long test name; mktemp("s") stays short.
    directory = tmp_path_factory.mktemp("s")
    directory.chmod(0o700)
    return directory / "ipc.sock"


@pytest.fixture
async def listener(sock_path: Path) -> AsyncIterator[trio.SocketListener]:
    owner = ipc.Listener(path=sock_path)
    bound = await owner.ensure_bound()
    yield bound
    await owner.aclose()


@attrs.define(eq=False)
class Pair:
    server: ipc.Channel
    client: ipc.Channel
    hello: ipc.Envelope


@pytest.fixture
async def connect(
    wire: Wire, sock_path: Path, listener: trio.SocketListener
) -> AsyncIterator[Callable[..., Awaitable[Pair]]]:
    """Open an authenticated (server, client) channel pair over the real socket."""
    opened: list[ipc.Channel] = []

    async def run(*, owner: str = OWNER, request_timeout: float = ipc.DEFAULT_TIMEOUT) -> Pair:
        wire.owners.add(owner)
        result: dict[str, ipc.Channel] = {}

        async def client() -> None:
            result["client"], _ = await ipc.open_client(
                sock_path,
                owner=owner,
                token=wire.token(owner),
                hello=ipc.Hello(pid=os.getpid(), backend="test"),
                request_timeout=request_timeout,
            )

        with trio.fail_after(CEILING):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client)
                stream = await listener.accept()
                server, hello = await ipc.accept_hello(
                    stream, wire.lookup, request_timeout=request_timeout
                )
                await server.reply(hello.corr, ipc.Reply(ok=True))
        opened.extend((server, result["client"]))
        return Pair(server=server, client=result["client"], hello=hello)

    yield run
    for channel in opened:
        await channel.aclose()


@pytest.fixture
async def raw_client(sock_path: Path) -> AsyncIterator[Callable[[], Awaitable[trio.SocketStream]]]:
    """A bare connected socket: the test writes whatever bytes it likes."""
    opened: list[trio.SocketStream] = []

    async def run() -> trio.SocketStream:
        with trio.fail_after(CEILING):
            stream = await trio.open_unix_socket(os.fspath(sock_path))
        opened.append(stream)
        return stream

    yield run
    for stream in opened:
        await stream.aclose()


async def _raw_session(
    nursery: trio.Nursery,
    wire: Wire,
    stream: trio.abc.Stream,
    accept: Callable[[], Awaitable[tuple[ipc.Channel, ipc.Envelope]]],
    handler: Handler | None,
) -> RawSession:
    await stream.send_all(wire.frame(ipc.Hello(pid=os.getpid()), corr="0"))
    with trio.fail_after(CEILING):
        server, hello = await accept()
    await server.reply(hello.corr, ipc.Reply(ok=True))
    reader = FrameReader(stream=stream)
    assert (await reader.next()).corr == "0"
    served = await serve(nursery, server, handler)
    return RawSession(wire=wire, served=served, stream=stream, reader=reader)


@pytest.fixture
def raw_session(
    wire: Wire,
    listener: trio.SocketListener,
    raw_client: Callable[[], Awaitable[trio.SocketStream]],
) -> Callable[..., Awaitable[RawSession]]:
    """Hello by hand, then a serving server channel (handler and on_event recorded)."""

    async def run(nursery: trio.Nursery, handler: Handler | None = None) -> RawSession:
        stream = await raw_client()

        async def accept() -> tuple[ipc.Channel, ipc.Envelope]:
            return await ipc.accept_hello(await listener.accept(), wire.lookup)

        return await _raw_session(nursery, wire, stream, accept, handler)

    return run


@pytest.fixture
async def raw_tls_session(
    wire: Wire, tmp_path: Path
) -> AsyncIterator[Callable[..., Awaitable[RawSession]]]:
    """As ``raw_session``, over TLS on loopback TCP (``ipc.SocketTLSStream`` both ends)."""
    opened: list[trio.abc.Stream] = []

    async def run(nursery: trio.Nursery, handler: Handler | None = None) -> RawSession:
        client, server_end = await tls_pair(tmp_path, nursery)
        opened.extend((client, server_end))

        async def accept() -> tuple[ipc.Channel, ipc.Envelope]:
            return await ipc.accept_hello(server_end, wire.lookup, peer_checked=True)

        return await _raw_session(nursery, wire, client, accept, handler)

    yield run
    for stream in opened:
        await stream.aclose()


@pytest.fixture
def serve_channel() -> Callable[..., Awaitable[Served]]:
    """``await serve_channel(nursery, channel, handler=None, on_event=None) -> Served``."""
    return serve
