"""Authenticated ``ipc`` throughput against a raw trio Unix-socket echo, measured in one run.

Two processes, because that is how the supervisor and a child talk: this process is the
client and measures; a server process (this script with ``--serve``) runs both servers:

- ``ipc``: :class:`ipc.Listener` + :func:`ipc.accept_hello` + :meth:`ipc.Channel.serve`; the
  client is :func:`ipc.open_client`. Every frame is JSON-encoded, HMAC-token checked, schema
  validated and dispatched, on both sides. The request is an ``ownership`` request, which
  the server answers as the supervisor does: with an immediate handler, on the reader.
- ``raw``: a trio Unix socket carrying the same bytes (the ipc request frame, a ~200-byte JSON
  envelope) with the same 4-byte length framing, echoed back untouched.

Figures: round trips per second (one request in flight) and pipelined events per second
(fire-and-forget, closed by one round trip so every event was handled). Measurements
alternate raw/ipc over several rounds; each ratio is the median of the per-round ratios,
because these machines are noisy.
The last line printed is one JSON object with the two ratios.

Usage: ``python benchmarks/ipc_throughput.py [--seconds N] [--rounds R]``
"""

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

import ipc

OWNER = "bench"
HEADER = struct.Struct(">I")
SYNC = b"sync"
TARGET = 0.8
PAYLOAD = ipc.Ownership(paths=["src/fleet/orchestrator/core/_supervisor.py", "docs/*.md"])
EVENT = ipc.Event(activity="tool_update", tool="bash", text="running pytest -q tests/ipc")


# -- raw framing (the baseline: no JSON, no checks) ----------------------------------------


class RawFrames:
    """Just enough framing for the baseline: split a byte stream on 4-byte lengths."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def next(self) -> bytes | None:
        while True:
            if len(self.buffer) >= HEADER.size:
                (size,) = HEADER.unpack_from(self.buffer)
                end = HEADER.size + size
                if len(self.buffer) >= end:
                    body = bytes(self.buffer[HEADER.size : end])
                    del self.buffer[:end]
                    return body
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.buffer += data


def raw_frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


# -- server process ----------------------------------------------------------------------------


async def raw_connection(stream: trio.SocketStream) -> None:
    frames = RawFrames(stream)
    mode = await frames.next()
    count = 0
    async with stream:
        while (body := await frames.next()) is not None:
            if body == SYNC:
                await stream.send_all(raw_frame(str(count).encode()))
            elif mode == b"echo":
                await stream.send_all(raw_frame(body))
            else:
                count += 1


async def ipc_connection(stream: trio.SocketStream, key: bytes) -> None:
    channel, hello = await ipc.accept_hello(stream, lambda owner: ipc.derive_token(key, owner))
    await channel.reply(hello.corr, ipc.Reply(ok=True))
    count = 0

    async def handler(envelope: ipc.Envelope) -> ipc.Message:
        if isinstance(envelope.body, ipc.Control):
            return ipc.Reply(ok=True, data={"events": count})
        return ipc.Reply(ok=True)

    def immediate(body: ipc.Message) -> ipc.Message | None:
        # As the supervisor serves a child's ownership request: on the reader, no task.
        return ipc.Reply(ok=True) if isinstance(body, ipc.Ownership) else None

    async def on_event(envelope: ipc.Envelope) -> None:
        nonlocal count
        count += 1

    await channel.serve(handler, on_event, immediate=immediate)


async def serve(directory: Path, key: bytes) -> None:
    listener = ipc.Listener(path=directory / "ipc.sock")
    async with trio.open_nursery() as nursery:
        # Binds first: it makes the private directory the raw socket lives in too.
        await nursery.start(listener.serve, lambda stream: ipc_connection(stream, key))
        raw_sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await raw_sock.bind(os.fspath(directory / "raw.sock"))
        raw_sock.listen(16)
        raw_listener = trio.SocketListener(raw_sock)
        nursery.start_soon(trio.serve_listeners, raw_connection, [raw_listener])
        print("ready", flush=True)
        # The parent closes our stdin when it is done.
        await trio.to_thread.run_sync(sys.stdin.read)
        nursery.cancel_scope.cancel()


# -- client (this process) --------------------------------------------------------------------


async def raw_connect(path: Path, mode: bytes) -> tuple[trio.SocketStream, RawFrames]:
    """A raw connection whose server echoes (``echo``) or counts (``sink``) what it gets."""
    stream = await trio.open_unix_socket(os.fspath(path))
    await stream.send_all(raw_frame(mode))
    return stream, RawFrames(stream)


async def raw_roundtrips(path: Path, payload: bytes, seconds: float) -> float:
    stream, frames = await raw_connect(path, b"echo")
    frame = raw_frame(payload)
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        await stream.send_all(frame)
        assert await frames.next() == payload
        count += 1
    elapsed = time.perf_counter() - start
    await stream.aclose()
    return count / elapsed


async def raw_pipelined(path: Path, payload: bytes, seconds: float) -> float:
    stream, frames = await raw_connect(path, b"sink")
    frame = raw_frame(payload)
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        await stream.send_all(frame)
        count += 1
    await stream.send_all(raw_frame(SYNC))
    handled = await frames.next()
    elapsed = time.perf_counter() - start
    assert handled == str(count).encode(), (handled, count)
    await stream.aclose()
    return count / elapsed


async def open_ipc(path: Path, key: bytes) -> ipc.Channel:
    channel, _reply = await ipc.open_client(
        path, owner=OWNER, token=ipc.derive_token(key, OWNER), hello=ipc.Hello(pid=os.getpid())
    )
    return channel


async def _ignore_requests(envelope: ipc.Envelope) -> ipc.Message:
    return ipc.Reply(ok=False, error="the benchmark client serves nothing")


async def _ignore_events(envelope: ipc.Envelope) -> None:
    return None


async def ipc_roundtrips(path: Path, key: bytes, seconds: float) -> float:
    channel = await open_ipc(path, key)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.serve, _ignore_requests, _ignore_events)
        count = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            await channel.request(PAYLOAD)
            count += 1
        elapsed = time.perf_counter() - start
        await channel.aclose()
    return count / elapsed


async def ipc_pipelined(path: Path, key: bytes, seconds: float) -> float:
    channel = await open_ipc(path, key)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.serve, _ignore_requests, _ignore_events)
        count = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            await channel.send_event(EVENT)
            count += 1
        reply = await channel.request(ipc.Control(op="count"), timeout=120)
        elapsed = time.perf_counter() - start
        assert isinstance(reply, ipc.Reply)
        assert reply.data == {"events": count}, (reply.data, count)
        await channel.aclose()
    return count / elapsed


def wire_bytes(message: ipc.Message, kind: str, key: bytes) -> bytes:
    envelope = ipc.Envelope(
        v=1,
        token=ipc.derive_token(key, OWNER),
        owner=OWNER,
        corr="12345",
        kind=kind,  # type: ignore[arg-type]
        type={cls: name for name, cls in ipc.MESSAGE_TYPES.items()}[type(message)],
        body=message,
    )
    return ipc.encode_envelope(envelope)


async def measure(directory: Path, key: bytes, seconds: float, rounds: int) -> dict[str, float]:
    request_bytes = wire_bytes(PAYLOAD, "request", key)
    event_bytes = wire_bytes(EVENT, "event", key)
    samples: dict[str, list[float]] = {
        name: [] for name in ("raw_rt", "ipc_rt", "raw_events", "ipc_events")
    }
    raw_path, ipc_path = directory / "raw.sock", directory / "ipc.sock"
    for _ in range(rounds):
        samples["raw_rt"].append(await raw_roundtrips(raw_path, request_bytes, seconds))
        samples["ipc_rt"].append(await ipc_roundtrips(ipc_path, key, seconds))
        samples["raw_events"].append(await raw_pipelined(raw_path, event_bytes, seconds))
        samples["ipc_events"].append(await ipc_pipelined(ipc_path, key, seconds))
    result = {name: statistics.median(values) for name, values in samples.items()}
    # Each round's raw and ipc figures were taken seconds apart, under the same load: the
    # median of per-round ratios is steadier than a ratio of medians on a busy machine.
    result["rt_ratio"] = statistics.median(
        ipc / raw for ipc, raw in zip(samples["ipc_rt"], samples["raw_rt"], strict=True)
    )
    result["ev_ratio"] = statistics.median(
        ipc / raw for ipc, raw in zip(samples["ipc_events"], samples["raw_events"], strict=True)
    )
    result["request_bytes"] = len(request_bytes)
    result["event_bytes"] = len(event_bytes)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement (default 1)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run that checks the script works (its figures mean nothing)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds = 0.05, 1
    if args.serve is not None:
        key = bytes.fromhex(sys.stdin.readline().strip())  # never on argv
        trio.run(serve, args.serve, key)
        return

    key = ipc.new_session_key()
    with tempfile.TemporaryDirectory(prefix="ipcb-") as tmp:
        directory = Path(tmp) / "run"
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", os.fspath(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdin is not None
        assert server.stdout is not None
        try:
            server.stdin.write(key.hex() + "\n")
            server.stdin.flush()
            if server.stdout.readline().strip() != "ready":
                raise SystemExit("benchmark server did not start")
            figures = trio.run(measure, directory, key, args.seconds, args.rounds)
        finally:
            server.stdin.close()
            server.wait(timeout=30)

    rt_ratio = figures["rt_ratio"]
    ev_ratio = figures["ev_ratio"]
    print(
        f"ipc throughput: 2 processes, {args.rounds} rounds x {args.seconds:g} s; "
        "medians, ratio = median of per-round ratios"
    )
    print(f"{'figure':<26}{'raw trio':>12}{'ipc':>12}{'ratio':>8}")
    print(
        f"{'round trips/s':<26}{figures['raw_rt']:>12,.0f}{figures['ipc_rt']:>12,.0f}"
        f"{rt_ratio:>8.2f}"
    )
    print(
        f"{'pipelined events/s':<26}{figures['raw_events']:>12,.0f}"
        f"{figures['ipc_events']:>12,.0f}{ev_ratio:>8.2f}"
    )
    print(
        f"frame bodies: request {figures['request_bytes']:.0f} B, "
        f"event {figures['event_bytes']:.0f} B; target ratio >= {TARGET}"
    )
    print(
        json.dumps(
            {
                "benchmark": "ipc_throughput",
                "roundtrip_ratio": round(rt_ratio, 3),
                "pipelined_ratio": round(ev_ratio, 3),
                "target": TARGET,
            }
        )
    )


if __name__ == "__main__":
    main()
