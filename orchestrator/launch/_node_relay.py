"""One child's bytes, both ways, between its socket and its stream on the node's link.

A carried child speaks its channel over a socket pair; the node host holds the other end and
relays it over a :class:`ipc.MuxStream` of the link to the supervisor's door. Every message
of every child of the node crosses here twice, so the relay costs no task wake-up it can
avoid:

- **To the child.** While the relay waits with nothing buffered, the link's reader hands it
  the stream's bytes (:meth:`ipc.MuxStream.wait_readable`'s sink) and it writes them to the
  child's socket at once. Only what the socket does not take now is left to the relay's task,
  which waits for the socket to drain; meanwhile the stream buffers at most its window and
  the supervisor waits for credit, so a child that never reads costs at most one window and
  one chunk.
- **From the child.** The relay's task reads the socket's descriptor when it is readable and
  sends within the stream's credit without yielding (:meth:`ipc.MuxStream.try_send`: onto
  the TLS socket at once when the link's writer is idle); only a send beyond the credit waits.

When either side ends (the child closes or dies, the stream is closed or the link breaks),
both are closed: the supervisor's channel sees its stream close, the child its end of file.
"""

import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Final

import trio

import ipc

log = logging.getLogger("orchestrator")

#: The most bytes one read from the child's socket takes.
CHUNK: Final = 65536


class Relay:
    """Relays one child's socket (non-blocking, the relay's from now on) and its stream."""

    def __init__(self, connection: socket.socket, stream: ipc.MuxStream) -> None:
        connection.setblocking(False)  # noqa: FBT003 - the socket module's own signature
        self._connection = connection
        self._fd = connection.fileno()
        self._stream = stream
        self._pending = b""  # bytes for the child its socket has not taken yet
        self._child_gone = False  # a write to the child failed: it closed or died

    async def run(self) -> None:
        """Relay until either side ends; then close both."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._ended_by, self._from_child, nursery)
                nursery.start_soon(self._ended_by, self._to_child, nursery)
        except Exception as exc:  # never into the host's loop: the node's other children run there
            log.info("a child's relay ended: %r", exc)
        finally:
            with trio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await self._stream.aclose()
                trio.lowlevel.notify_closing(self._connection)  # trio's rule: notify, then close
                ipc.drop_unread(self._fd)  # so the child sees its end of file, not a reset
                self._connection.close()

    @staticmethod
    async def _ended_by(direction: Callable[[], Awaitable[None]], nursery: trio.Nursery) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await direction()
        nursery.cancel_scope.cancel()

    # -- from the child ---------------------------------------------------------------------

    async def _from_child(self) -> None:
        stream, fd = self._stream, self._fd
        while True:
            await trio.lowlevel.wait_readable(fd)
            try:
                data = os.read(fd, CHUNK)
            except BlockingIOError:
                continue
            except OSError:  # reset: the child is gone
                return
            if not data:
                return
            sent = stream.try_send(data)
            if sent != len(data):
                await stream.send_all(memoryview(data)[sent:])

    # -- to the child -----------------------------------------------------------------------

    async def _to_child(self) -> None:
        while not self._child_gone:
            if self._pending:
                await self._drain()
            elif (data := await self._receive()) is not None:
                if not data:
                    return  # the supervisor closed the stream
                self._pending = data

    async def _receive(self) -> bytes | None:
        """The stream's next bytes, ``b""`` at its end, or ``None`` when the link's reader
        wrote them already (or left what the child's socket did not take, which goes first)."""
        await self._stream.wait_readable(self._write_now)
        if self._pending or self._child_gone:
            return None
        return self._stream.read_now(CHUNK)

    def _write_now(self, data: bytes) -> bool:
        """The stream's sink, on the link's reader: write to the child now, never wait.
        ``True`` (the relay's task takes over) when the socket did not take it all."""
        sent = self._write(data)
        if sent == len(data):
            return self._child_gone  # gone: the relay's task wakes to end the relay
        self._pending = data[sent:]
        return True

    async def _drain(self) -> None:
        """Write what is pending as the child's socket takes it."""
        await trio.lowlevel.wait_writable(self._fd)
        sent = self._write(self._pending)
        self._pending = self._pending[sent:]

    def _write(self, data: bytes) -> int:
        try:
            return os.write(self._fd, data)
        except BlockingIOError:
            return 0
        except OSError:  # the child closed its end or died: the relay ends, the bytes are moot
            self._child_gone = True
            return len(data)
