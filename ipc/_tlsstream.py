"""TLS on the socket itself: a trio stream over a non-blocking :class:`ssl.SSLSocket`.

``trio.SSLStream`` runs TLS through a memory BIO: every record is copied between Python
buffers and the transport, each read and write is several Python calls, and the channel loses
the socket's fast path. Over the TLS door a remote child's round trips ran at 0.36 of the Unix
socket's that way. Here OpenSSL reads and writes the socket itself, and trio only waits for the
socket to be ready when OpenSSL says it must (``SSLWantReadError``/``SSLWantWriteError``).

One task may send while another receives (what a channel does), as trio's streams allow. TLS
1.3 (which both ends require) has no renegotiation, so a write never waits for the peer's
data; should one still report it must, it polls rather than waiting on readiness another
task already waits on. A closed or reset peer is :class:`trio.BrokenResourceError`, a use
after :meth:`aclose` :class:`trio.ClosedResourceError`, as with any trio stream.
"""

import os
import socket
import ssl
from typing import Final

import attrs
import trio

from ipc._lendwait import LendWait

__all__ = ["TLSIO", "OneAtATime", "SocketTLSStream", "drop_unread", "tls_over"]

#: The most bytes one read asks OpenSSL for.
RECEIVE_SIZE: Final = 65536
#: How long a read that OpenSSL says needs a write first waits before trying again.
_POLL_S: Final = 0.001
#: The most reads that drop unread bytes at close (64 KiB each).
_DRAIN_READS: Final = 16


class OneAtATime:
    """A section one task may be in at a time; a second is :class:`trio.BusyResourceError`."""

    def __init__(self, message: str) -> None:
        self._message = message
        self.held = False

    def __enter__(self) -> None:
        if self.held:
            raise trio.BusyResourceError(self._message)
        self.held = True

    def __exit__(self, *exc_info: object) -> None:
        self.held = False


class SocketTLSStream(trio.abc.Stream):
    """A TLS connection whose records OpenSSL reads and writes on the socket directly."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self._sock = sock
        self._closed = False
        self._io = TLSIO(stream=self)
        self._sending = OneAtATime("another task is sending on this stream")
        self._receiving = OneAtATime("another task is receiving on this stream")

    @property
    def socket(self) -> ssl.SSLSocket:
        return self._sock

    def peer_certificate(self) -> bytes | None:
        """The peer's certificate (DER) after the handshake; None when it sent none."""
        return self._sock.getpeercert(binary_form=True)

    def _check(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")

    async def do_handshake(self) -> None:
        """Complete the TLS handshake (both ends' certificates checked by the context)."""
        while True:
            self._check()
            try:
                self._sock.do_handshake()
            except ssl.SSLWantReadError:
                await trio.lowlevel.wait_readable(self._sock)
            except ssl.SSLWantWriteError:
                await trio.lowlevel.wait_writable(self._sock)
            except (ssl.SSLError, OSError) as exc:
                raise trio.BrokenResourceError(f"TLS handshake failed: {exc}") from exc
            else:
                return

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with self._sending:
            self._check()
            frame = bytes(data)
            sent = self._io.try_send(frame)
            if sent != len(frame):
                await self._io.send_rest(frame, sent)
            await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        with self._sending:
            self._check()
            await trio.lowlevel.wait_writable(self._sock)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        with self._receiving:
            size = RECEIVE_SIZE if max_bytes is None else max_bytes
            if size < 1:
                raise ValueError("max_bytes must be >= 1")
            while True:
                self._check()
                await self._io.wait()
                data = self._io.read(size)
                if data is not None:
                    return data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self._sock)
            drop_unread(self._sock.fileno())
            self._sock.close()
        await trio.lowlevel.checkpoint()


@attrs.define(eq=False)
class TLSIO:
    """A :class:`~ipc._tlsstream.SocketTLSStream` (the TLS door), read and written through its
    ``SSLSocket`` the way :class:`SocketIO` uses a descriptor: a write that the socket takes
    now costs no scheduler pass, and a read waits only when OpenSSL holds nothing decrypted.
    The reader lends it to a requester as a Unix socket (:mod:`ipc._lending`): the lender
    reads through the same ``SSLSocket`` (one TLS state, one reader at a time) and waits, as
    the reader does, only when OpenSSL holds nothing decrypted.

    OpenSSL's rule for a write it could not finish (``SSLWantWriteError``) is that the retry
    passes the same bytes: :meth:`try_send` then reports 0 written, so :meth:`send_rest` retries
    from where it stood; and such a write may have put part of a record on the wire, so a
    cancellation after one leaves the stream torn.
    """

    stream: "SocketTLSStream"
    torn: bool = False
    _closed: bool = False
    #: A write OpenSSL started and must be retried with the same bytes.
    _started: bool = False
    #: A read that OpenSSL said needs a write first (TLS 1.3 never renegotiates: a key update
    #: at most): the next wait polls instead of parking on readability.
    _read_wants_write: bool = False
    #: A write that OpenSSL said needs a read first: the retry polls instead of parking on
    #: writability, which a writable socket would answer at once, over and over.
    _send_wants_read: bool = False
    #: Where a requester the reader lent the stream to waits (ipc._lendwait).
    lender: LendWait = attrs.field(init=False)

    @lender.default
    def _make_lender(self) -> LendWait:
        return LendWait(fd=self.stream.socket.fileno())

    async def wait(self) -> None:
        """Await until a read may return something."""
        if self._closed:
            raise trio.ClosedResourceError("the socket was closed")
        sock = self.stream.socket
        if sock.pending():  # decrypted already: no need to wait for the socket
            await trio.lowlevel.checkpoint()
        elif self._read_wants_write:
            self._read_wants_write = False
            await trio.sleep(_POLL_S)
        else:
            await trio.lowlevel.wait_readable(sock)

    async def lend_wait(self) -> None:
        """Await until a read may return something, as a lender (see :mod:`ipc._lending`)."""
        if self._closed or self._read_wants_write or self.stream.socket.pending():
            await self.wait()  # a close, a poll, or OpenSSL's decrypted bytes: as the reader
        else:
            await self.lender.wait()

    def interrupt_lender(self) -> None:
        """Wake a task parked in :meth:`lend_wait` with ``ClosedResourceError``."""
        self.lender.interrupt()

    def read(self, size: int = RECEIVE_SIZE) -> bytes | None:
        """Some bytes, ``b""`` at the end, or ``None`` when no whole record is in yet."""
        if self._closed:
            raise trio.ClosedResourceError("the socket was closed")
        try:
            return self.stream.socket.recv(size)
        except ssl.SSLWantReadError:
            return None
        except ssl.SSLWantWriteError:
            self._read_wants_write = True
            return None
        except ssl.SSLZeroReturnError:
            return b""
        except (ssl.SSLError, OSError) as exc:
            raise trio.BrokenResourceError(f"TLS receive failed: {exc}") from exc

    def try_send(self, data: bytes | memoryview) -> int:
        """Write all of *data* now (OpenSSL writes whole), or 0 if the socket cannot take it."""
        if self._closed:
            raise trio.ClosedResourceError("the socket was closed")
        try:
            sent = self.stream.socket.send(data)
        except ssl.SSLWantWriteError:
            self._started = True
            return 0
        except ssl.SSLWantReadError:
            self._started = self._send_wants_read = True
            return 0
        except (ssl.SSLError, OSError) as exc:
            raise trio.BrokenResourceError(f"TLS send failed: {exc}") from exc
        self._started = False
        return sent

    async def send_rest(self, data: bytes, sent: int) -> None:
        """Write *data* from offset *sent* on, waiting while the socket buffer is full."""
        view = memoryview(data)
        while sent < len(view):
            try:
                if self._send_wants_read:
                    self._send_wants_read = False
                    await trio.sleep(_POLL_S)
                else:
                    await trio.lowlevel.wait_writable(self.stream.socket)
            except trio.Cancelled:
                if sent or self._started:
                    self.torn = True
                raise
            sent += self.try_send(view[sent:])

    async def aclose(self) -> None:
        """Close the stream."""
        self._closed = True
        self.interrupt_lender()
        await self.stream.aclose()


def drop_unread(fd: int) -> None:
    """Read and drop what the peer of non-blocking socket *fd* sent and nobody will read (a
    plain-TCP client's bytes after a failed handshake; a child's hello its door refused before
    it came), so that the close is an end of file for the peer, not a reset; at most 1 MiB."""
    for _ in range(_DRAIN_READS):
        try:
            if not os.read(fd, 65536):
                return
        except OSError:  # nothing more to read now (it is non-blocking), or already gone
            return


def tls_over(
    tcp: trio.SocketStream,
    context: ssl.SSLContext,
    *,
    server_side: bool = False,
    server_hostname: str | None = None,
) -> SocketTLSStream:
    """Take *tcp*'s socket over (the trio stream must not be used again) and wrap it in TLS;
    call :meth:`SocketTLSStream.do_handshake` before anything else."""
    trio_sock = tcp.socket
    raw = socket.socket(fileno=trio_sock.detach())
    raw.setblocking(False)  # noqa: FBT003 - the socket module's own signature
    return SocketTLSStream(
        context.wrap_socket(
            raw,
            server_side=server_side,
            server_hostname=server_hostname,
            do_handshake_on_connect=False,
            suppress_ragged_eofs=True,
        )
    )
