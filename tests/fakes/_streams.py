"""Real byte streams for tests: a connected trio socket pair, and reproducible test bytes."""

import random
import socket

import trio


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
