"""Moving a channel's bytes: any trio stream, or a Unix socket's descriptor directly.

A :class:`Channel` reads with one task (``await wait()``, then ``read()``) and writes whole
frames, one writer at a time. For any ``trio.abc.Stream`` it uses ``receive_some`` and
``send_all``; for the TLS door's stream the ``SSLSocket`` directly
(:class:`ipc._tlsstream.TLSIO`); for a stream of a node link the link itself (:class:`MuxIO`:
the link's reader routes the channel's frames, no hand-off). For a ``trio.SocketStream`` it
goes one level down — ``os.read``/``os.write`` on the descriptor, parking with
``trio.lowlevel.wait_readable``/``wait_writable`` — because the stream's layers (an error
translator, a conflict detector, an async context manager around every call, an attempt to
read before waiting) were a fifth of a round trip's Python, paid on both sides.

Writing is split so the common case costs no scheduler pass: ``try_send`` writes what the
socket takes now without yielding, and only what is left goes through ``send_rest``, which
waits. A requester parks right after its write anyway, and a reader answering inline goes
straight back to waiting, so a yield there would only cost a pass through the scheduler;
:meth:`Channel.send_event` yields itself every few events when the write did not. Two more rules:

- :attr:`torn` tells a cancelled write that had already written part of a frame (the stream
  can then never resync) from one that had written nothing.
- A descriptor number is never used after its socket could have been closed: the channel
  closes its stream through the transport only.

The transport closes the stream (``aclose``); trio wakes a parked reader or writer with
``ClosedResourceError`` when its socket closes.
"""

import functools
import os
from collections.abc import Awaitable, Callable
from typing import Final

import attrs
import trio

from ipc._lendwait import LendWait
from ipc._mux import MuxStream, Sink
from ipc._tlsstream import TLSIO, SocketTLSStream

RECEIVE_SIZE: Final = 65536


@attrs.define(eq=False)
class StreamIO:
    """Any trio stream; ``send_all`` may be cancelled halfway, so a cancelled write is torn."""

    stream: trio.abc.Stream
    torn: bool = False

    _received: bytes | None = None

    async def wait(self) -> None:
        """Receive some bytes, for :meth:`read`."""
        self._received = bytes(await self.stream.receive_some(RECEIVE_SIZE))

    def read(self) -> bytes | None:
        """What :meth:`wait` received: some bytes, or ``b""`` at EOF."""
        data, self._received = self._received, None
        return data

    def try_send(self, data: bytes) -> int:
        """Nothing can be written without awaiting: 0."""
        return 0

    async def send_rest(self, data: bytes, sent: int) -> None:
        """Write *data* (``sent`` is 0); always yields."""
        try:
            await self.stream.send_all(data)
        except trio.Cancelled:
            self.torn = True
            raise

    async def aclose(self) -> None:
        """Close the stream."""
        await self.stream.aclose()


@attrs.define(eq=False)
class SocketIO:
    """A connected ``trio.SocketStream``, read and written through its descriptor.

    The stream must be closed through :meth:`aclose` only: the descriptor number is kept,
    and must never be used once the socket could have been closed (the number is reused).
    """

    stream: trio.SocketStream
    torn: bool = False
    _closed: bool = False
    _fd: int = attrs.field(init=False)
    # Where a requester the reader lent the socket to waits (ipc._lendwait).
    lender: LendWait = attrs.field(init=False)
    wait: Callable[[], Awaitable[None]] = attrs.field(init=False)
    """Await until the socket is readable (trio's own wait: no wrapper frame per read)."""

    @_fd.default
    def _descriptor(self) -> int:
        return self.stream.socket.fileno()

    @lender.default
    def _make_lender(self) -> LendWait:
        return LendWait(fd=self._fd)

    @wait.default
    def _make_wait(self) -> Callable[[], Awaitable[None]]:
        # A close while parked wakes the wait with ClosedResourceError (notify_closing).
        return functools.partial(trio.lowlevel.wait_readable, self._fd)

    def read(self) -> bytes | None:
        """Some bytes, ``b""`` at EOF, or ``None`` after a spurious wake-up."""
        if self._closed:  # closed after the wake-up, before the reader ran again
            raise trio.ClosedResourceError("the socket was closed")
        try:
            return os.read(self._fd, RECEIVE_SIZE)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise trio.BrokenResourceError(f"receive failed: {exc}") from exc

    def try_send(self, data: bytes) -> int:
        """Write what the socket takes now, without yielding; the count written."""
        if self._closed:
            raise trio.ClosedResourceError("the socket was closed")
        try:
            return os.write(self._fd, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"send failed: {exc}") from exc

    async def send_rest(self, data: bytes, sent: int) -> None:
        """Write *data* from offset *sent* on, waiting while the socket buffer is full."""
        view = memoryview(data)
        while sent < len(view):
            try:
                await trio.lowlevel.wait_writable(self._fd)
            except trio.Cancelled:
                if sent:
                    self.torn = True
                raise
            sent += self.try_send(view[sent:])  # type: ignore[arg-type]  # os.write takes any buffer

    async def lend_wait(self) -> None:
        """Await until the socket is readable, as a lender (see :mod:`ipc._lending`)."""
        if self._closed:
            raise trio.ClosedResourceError("the socket was closed")
        await self.lender.wait()

    def interrupt_lender(self) -> None:
        """Wake a task parked in :meth:`lend_wait` with ``ClosedResourceError``."""
        self.lender.interrupt()

    async def aclose(self) -> None:
        """Close the stream; the descriptor is not used again."""
        self._closed = True
        self.interrupt_lender()
        await self.stream.aclose()


@attrs.define(eq=False)
class MuxIO:
    """A stream of a node link (:class:`ipc.MuxStream`): a write within its credit goes
    out at once without yielding, and while the channel's reader waits with nothing
    buffered, the link's reader hands it the stream's bytes through :attr:`sink` (set by
    the channel while it serves), so they are routed without waking the channel's reader.
    """

    stream: MuxStream
    torn: bool = False
    #: Routes bytes on the link's reader; ``True`` when the channel's reader must take over.
    sink: Sink | None = None
    try_send: Callable[[bytes], int] = attrs.field(init=False)
    """Send what the stream's credit allows now, without yielding; the count sent (the
    stream's own method: no wrapper frame per write)."""

    @try_send.default
    def _stream_try_send(self) -> Callable[[bytes], int]:
        return self.stream.try_send

    async def wait(self) -> None:
        """Await until a read may return something (or the sink handed over)."""
        await self.stream.wait_readable(self.sink)

    def read(self) -> bytes | None:
        """Some bytes, ``b""`` at the end, or ``None`` when nothing is buffered."""
        return self.stream.read_now(RECEIVE_SIZE)

    async def send_rest(self, data: bytes, sent: int) -> None:
        """Send *data* from offset *sent* on, waiting for credit."""
        try:
            await self.stream.send_all(memoryview(data)[sent:])
        except trio.Cancelled:
            if sent or self.stream.send_torn:
                self.torn = True
            raise

    async def aclose(self) -> None:
        """Close the stream."""
        await self.stream.aclose()


Transport = StreamIO | SocketIO | TLSIO | MuxIO
#: The transports a channel's reader lends to a requester (:mod:`ipc._lending`).
LENDABLE: Final = (SocketIO, TLSIO)


def transport_for(stream: trio.abc.Stream) -> Transport:
    """The fastest way to move *stream*'s bytes that keeps the channel's rules."""
    if isinstance(stream, trio.SocketStream) and os.name == "posix":
        return SocketIO(stream=stream)
    if isinstance(stream, SocketTLSStream):
        return TLSIO(stream=stream)
    if isinstance(stream, MuxStream):
        return MuxIO(stream=stream)
    return StreamIO(stream=stream)
