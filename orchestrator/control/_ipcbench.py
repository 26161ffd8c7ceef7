"""``fleet bench``'s IPC figure: authenticated round trips against a raw echo, in one run.

Both sides live in this process, on a socket pair each, so the figure needs no server: the
``ipc`` side is the real handshake, the real channel (JSON codec, token check, schema, the
reader's dispatch) answering an ``ownership`` request as the supervisor does, on the reader;
the ``raw`` side echoes the same bytes with the same 4-byte framing and nothing else. Rounds
alternate raw/ipc; the ratio is the median of the per-round ratios (``benchmarks/
ipc_throughput.py`` is the two-process version, with pipelined events too).
"""

import socket
import statistics
import struct
import time
from typing import Any

import trio

import ipc

__all__ = ["answer_ownership", "measure_ipc", "request_rate"]

_HEADER = struct.Struct(">I")
_OWNER = "bench"
_PAYLOAD = ipc.Ownership(paths=["src/app.py", "docs/*.md"])


def _pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return (
        trio.SocketStream(trio.socket.from_stdlib_socket(a)),
        trio.SocketStream(trio.socket.from_stdlib_socket(b)),
    )


async def _read_frame(stream: trio.SocketStream, buffer: bytearray) -> bytes:
    while True:
        if len(buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(buffer)
            end = _HEADER.size + size
            if len(buffer) >= end:
                body = bytes(buffer[_HEADER.size : end])
                del buffer[:end]
                return body
        data = await stream.receive_some(65536)
        if not data:
            raise trio.BrokenResourceError("closed")
        buffer += data


async def _raw(seconds: float, body: bytes) -> float:
    near, far = _pair()
    frame = _HEADER.pack(len(body)) + body

    async def echo() -> None:
        buffer = bytearray()
        while True:
            await near.send_all(_HEADER.pack(len(got := await _read_frame(near, buffer))) + got)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo)
        buffer, count, start = bytearray(), 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            await far.send_all(frame)
            await _read_frame(far, buffer)
            count += 1
        elapsed = time.perf_counter() - start
        nursery.cancel_scope.cancel()
    return count / elapsed


async def _ipc(seconds: float) -> float:
    near, far = _pair()
    token = ipc.derive_token(ipc.new_session_key(), _OWNER)

    async def handler(envelope: ipc.Envelope) -> ipc.Message:
        return ipc.Reply(ok=False, error="unexpected")

    async def ignore(envelope: ipc.Envelope) -> None:
        return None

    async def serve() -> None:
        channel, hello = await ipc.accept_hello(near, {_OWNER: token}.get)
        await channel.reply(hello.corr, ipc.Reply(ok=True))
        await channel.serve(handler, ignore, immediate=answer_ownership)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        client, _ = await ipc.hello_on(far, owner=_OWNER, token=token, hello=ipc.Hello(pid=1))
        nursery.start_soon(client.serve, handler, ignore)
        rate = await request_rate(client, seconds)
        nursery.cancel_scope.cancel()
    return rate


def answer_ownership(body: ipc.Message) -> ipc.Message | None:
    """An immediate handler answering ``ownership`` on the reader, as the supervisor does."""
    return ipc.Reply(ok=True) if isinstance(body, ipc.Ownership) else None


async def request_rate(client: ipc.Channel, seconds: float) -> float:
    """``ownership`` requests a second *client* (serving) gets answered, one in flight."""
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        await client.request(_PAYLOAD)
        count += 1
    return count / (time.perf_counter() - start)


def measure_ipc(seconds: float = 0.5, rounds: int = 3) -> dict[str, Any]:
    """Round trips per second, ipc and raw, and the median per-round ratio."""
    body = b'{"v":1,"token":"' + b"t" * 43 + b'","owner":"bench","corr":"1"}' + b" " * 120

    async def run() -> dict[str, Any]:
        raws, ipcs = [], []
        for _ in range(rounds):
            raws.append(await _raw(seconds, body))
            ipcs.append(await _ipc(seconds))
        return {
            "raw": raws,
            "ipc": ipcs,
            "ratio": statistics.median(i / r for i, r in zip(ipcs, raws, strict=True)),
        }

    return trio.run(run)
