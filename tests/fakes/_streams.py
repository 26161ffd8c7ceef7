"""Real byte streams for tests: a connected trio socket pair, a mux link over one, exact
reads, and reproducible test bytes."""

import random
import socket
from collections.abc import Callable
from typing import Any

import trio

from ipc import MuxLink


def socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """Two connected trio streams over a real Unix socket pair."""
    a, b = socket.socketpair()
    return (
        trio.SocketStream(trio.socket.from_stdlib_socket(a)),
        trio.SocketStream(trio.socket.from_stdlib_socket(b)),
    )


def rng(seed: int | str) -> random.Random:
    """A generator of reproducible test bytes and sizes (never a secret)."""
    return random.Random(seed)  # noqa: S311 - reproducible test bytes, not a secret


async def linked(
    nursery: trio.Nursery,
    on_open: Any,
    ends: tuple[trio.abc.Stream, trio.abc.Stream] | None = None,
    *,
    wrap: Callable[[trio.abc.Stream], trio.abc.Stream] = lambda stream: stream,
    **options: Any,
) -> tuple[MuxLink, MuxLink]:
    """An opener and an acceptor (its streams to *on_open*) over *ends* (a real socket pair
    by default), each end through *wrap*, both serving in *nursery*."""
    a, b = ends or socket_pair()
    opener = MuxLink(wrap(a), opener=True, **options)
    acceptor = MuxLink(wrap(b), opener=False, **options)
    await nursery.start(acceptor.run, on_open)
    await nursery.start(opener.run)
    return opener, acceptor


async def receive_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    """*size* bytes of *stream*, no more; the test fails if it ends before."""
    got = bytearray()
    while len(got) < size:
        chunk = await stream.receive_some(size - len(got))
        assert chunk, f"closed after {len(got)} of {size} bytes"
        got += chunk
    return bytes(got)
