"""Moving a channel's bytes: any trio stream, or a Unix socket's descriptor directly.

A :class:`Channel` reads with one task and writes whole frames, one writer at a time. For any
``trio.abc.Stream`` it uses ``receive_some`` and ``send_all``. For a ``trio.SocketStream`` it
goes one level down — ``os.read``/``os.write`` on the descriptor, parking with
``trio.lowlevel.wait_readable``/``wait_writable`` — because the stream's layers (an error
translator, a conflict detector, an async context manager around every call, an attempt to
read before waiting) were a fifth of a round trip's Python, paid on both sides.

Two semantics differ, and the channel relies on both:

- A write that fits in the socket buffer returns without yielding to the scheduler
  (:attr:`SocketIO.yields` is ``False``): a requester parks right after its write anyway, and
  a reader answering inline goes straight back to waiting, so a yield would only cost a pass
  through the scheduler. :meth:`Channel.send_event` yields itself.
- :attr:`torn` tells a cancelled write that had already written part of a frame (the stream
  can then never resync) from one that had written nothing.

Closing stays the stream's job (``aclose``): trio wakes a parked reader or writer with
``ClosedResourceError`` when its socket closes.
"""

import os
from typing import Final

import attrs
import trio

RECEIVE_SIZE: Final = 65536


@attrs.define(eq=False)
class StreamIO:
    """Any trio stream; ``send_all`` may be cancelled halfway, so a cancelled write is torn."""

    stream: trio.abc.Stream
    torn: bool = False
    yields: bool = attrs.field(default=True, init=False)

    async def receive(self) -> bytes:
        """Some bytes, or ``b""`` at EOF."""
        return bytes(await self.stream.receive_some(RECEIVE_SIZE))

    async def send(self, data: bytes) -> None:
        """Write all of *data* (the caller has checked for cancellation just before)."""
        try:
            await self.stream.send_all(data)
        except trio.Cancelled:
            self.torn = True
            raise


@attrs.define(eq=False)
class SocketIO:
    """A connected ``trio.SocketStream``, read and written through its descriptor."""

    socket: trio.socket.SocketType
    torn: bool = False
    yields: bool = attrs.field(default=False, init=False)

    def _fd(self) -> int:
        fd = self.socket.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("the socket was closed")
        return fd

    async def receive(self) -> bytes:
        """Some bytes, or ``b""`` at EOF; parks first (after a frame, nothing is waiting)."""
        while True:
            await trio.lowlevel.wait_readable(self.socket)
            try:
                return os.read(self._fd(), RECEIVE_SIZE)
            except BlockingIOError:
                continue  # a spurious wake-up
            except OSError as exc:
                raise trio.BrokenResourceError(f"receive failed: {exc}") from exc

    async def send(self, data: bytes) -> None:
        """Write all of *data*; yields only while the socket buffer is full."""
        try:
            sent = os.write(self._fd(), data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"send failed: {exc}") from exc
        if sent == len(data):
            return
        view = memoryview(data)
        while sent < len(view):
            try:
                await trio.lowlevel.wait_writable(self.socket)
            except trio.Cancelled:
                if sent:
                    self.torn = True
                raise
            try:
                sent += os.write(self._fd(), view[sent:])
            except BlockingIOError:
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"send failed: {exc}") from exc


def transport_for(stream: trio.abc.Stream) -> StreamIO | SocketIO:
    """The fastest way to move *stream*'s bytes that keeps the channel's rules."""
    if isinstance(stream, trio.SocketStream) and os.name == "posix":
        return SocketIO(socket=stream.socket)
    return StreamIO(stream=stream)
