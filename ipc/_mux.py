"""Many byte streams over one connection: a node's children share its host's one TLS link.

Each remote child dialling the supervisor over its own mutual-TLS connection costs ~10 ms of
CPU a child. Instead the node's long-lived host process opens one link to the supervisor's
door (the host is the *opener*, the door the *acceptor*) and every child gets a
:class:`MuxStream` over it: an ordinary trio stream, so a :class:`~ipc.Channel` runs on it, hello
and token included, exactly as on a Unix socket.

Wire format. Every frame is a 9-byte header ``struct ">IBI"`` (stream id u32, kind u8, payload
length u32), then the payload:

- ``OPEN`` (1), opener only: the stream's name, UTF-8, 1..256 bytes. Ids are the opener's,
  nonzero and strictly increasing over the link's life (this module counts 1, 2, 3...). No
  answer: the opener may send DATA right after OPEN.
- ``DATA`` (2), either way: 1..:data:`MAX_CHUNK` bytes of the stream.
- ``CREDIT`` (3), either way: a u32 > 0, bytes of the stream its receiver consumed; the sender
  may send that many more.
- ``CLOSE`` (4), either way: an optional UTF-8 reason (at most 256 bytes). Its sender sends
  nothing more on the stream and drops what still arrives for it; DATA sent before it is
  delivered first. A stream is gone for a side once it sent or received CLOSE, and CLOSE is
  never answered (both sides may send one; each drops the other's).

Flow control: each stream starts with ``window`` bytes of credit each way (both ends are built
with the same window). A receiver buffers at most ``window`` unconsumed bytes a stream and
grants credit back in batches, once a quarter window is consumed and not yet granted, so a
short conversation sends no CREDIT at all.

The rules, because the peer may be hostile:

- The link's reader never waits on a stream's consumer: a stalled stream holds at most its
  window and never blocks its siblings (an acceptor buffers at most ``max_streams`` windows
  in all). A stream's reader parked in :meth:`MuxStream.wait_readable` may take its DATA
  on the link's reader instead (a *sink*, which must neither block nor raise: a channel
  routes its frames there, a relay writes them to its child's socket), so no task wakes
  for it.
- Frames go out through one writer task fed by a queue, so a cancelled
  :meth:`MuxStream.send_all` never tears the link; the queue holds at most the streams'
  credit in DATA, plus control frames (a peer that lets the CREDIT and CLOSE frames its own
  frames cause pile past :data:`_MAX_BACKLOG` bytes without reading ends the link). Over a
  TLS door connection a frame skips the queue when it is empty and the writer idle: the
  sending task writes it to the ``SSLSocket`` itself, synchronously (so nothing cancels it
  halfway either), and no task wakes; one OpenSSL could not finish goes first and alone
  through the writer, with the very same bytes, as OpenSSL requires.
- A protocol violation ends the whole link with :class:`~ipc.MuxError`: DATA beyond its
  credit or empty, a payload longer than its kind allows (checked from the header, before the
  payload is read), an unknown kind, OPEN from the acceptor or with an id not above the last
  or a name empty, too long or not UTF-8, DATA/CREDIT/CLOSE for an id never opened, CREDIT of
  0 or raising the credit to 2**31, a link ending inside a frame. Frames for a stream opened
  and since closed are dropped: that race is legitimate.
- The acceptor runs at most ``max_streams`` streams at once, each counted from its OPEN until
  its ``on_open`` task returns (a peer closing streams at once cannot pile up tasks); an OPEN
  beyond that is answered with CLOSE ``too many streams`` and never reaches ``on_open``.

What breaks how. When the link ends (EOF, a broken connection, a violation,
:meth:`MuxLink.aclose`), every open stream is broken: ``receive_some`` returns what was
buffered, then raises :class:`trio.BrokenResourceError`, as does ``send_all``. A stream the
peer closed gives its buffered bytes, then ``b""``; its ``send_all`` raises
:class:`trio.BrokenResourceError`. After a stream's own ``aclose`` its methods raise
:class:`trio.ClosedResourceError`. A ``send_all`` cancelled after it queued part of its data
leaves the stream's sending broken (``BrokenResourceError``; what was queued is still
delivered), as trio's streams are after a cancelled send; one cancelled before it queued
anything leaves the stream as it was.
"""

import struct
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final

import trio

from ipc._errors import MuxError
from ipc._tlsstream import TLSIO, OneAtATime, SocketTLSStream

__all__ = ["MAX_CHUNK", "MAX_STREAMS", "WINDOW", "MuxLink", "MuxStream"]

#: Bytes of credit a stream starts with each way, and the most a receiver buffers for it.
WINDOW: Final = 256 * 1024
#: The largest DATA payload, and what ``receive_some()`` returns at most by default.
MAX_CHUNK: Final = 64 * 1024
#: The most streams an acceptor runs at once.
MAX_STREAMS: Final = 1024

OPEN: Final = 1
DATA: Final = 2
CREDIT: Final = 3
CLOSE: Final = 4
_REPLIES: Final = frozenset({CREDIT, CLOSE})

_HEADER: Final = struct.Struct(">IBI")
_CREDIT: Final = struct.Struct(">I")
#: The longest stream name and CLOSE reason, in bytes.
_MAX_NAME: Final = 256
#: Credit must stay below this (a u32 increment must never wrap a signed 32-bit counter).
_CREDIT_LIMIT: Final = 1 << 31
_MAX_ID: Final = (1 << 32) - 1
#: The most bytes one read asks the link's stream for.
_RECEIVE_SIZE: Final = 65536
#: The writer joins queued frames into writes of about this size.
_WRITE_BATCH: Final = 256 * 1024
#: CREDIT and CLOSE frames (what a peer's frames make us send) queued and not yet written
#: beyond which the peer is taken to flood without reading: an honest peer's reader drains
#: them as they come.
_MAX_BACKLOG: Final = 4 * 1024 * 1024

OnOpen = Callable[["MuxStream"], Awaitable[None]]
#: Takes a stream's bytes on the link's reader; ``True`` to wake the stream's parked reader.
Sink = Callable[[bytes], bool]

_OPEN, _PEER_CLOSED, _BROKEN, _CLOSED = "open", "peer-closed", "broken", "closed"


class MuxStream(trio.abc.Stream):
    """One byte stream of a :class:`MuxLink`; made by :meth:`MuxLink.open` or handed to
    ``on_open``, never built directly."""

    def __init__(self, link: "MuxLink", stream_id: int, name: str) -> None:
        self.name = name
        self._link = link
        self._id = stream_id
        self._state = _OPEN
        self._why = ""  # what ended the stream, for the errors that say so
        self._buffer = bytearray()
        #: Bytes the peer may still send: buffered + consumed-not-granted + this == window.
        self._receivable = link._window
        self._ungranted = 0
        self._credit = link._window
        self._send_torn = False
        self._readable: trio.Event | None = None
        self._sink: Sink | None = None
        self._writable: trio.Event | None = None
        self._sending = OneAtATime("another task is sending on this stream")
        self._receiving = OneAtATime("another task is receiving on this stream")

    def __repr__(self) -> str:
        return f"<MuxStream {self._id} {self.name!r} {self._state}>"

    # -- sending ------------------------------------------------------------------------------

    def _check_send(self) -> None:
        if self._state == _CLOSED:
            raise trio.ClosedResourceError("the mux stream is closed")
        if self._state != _OPEN:
            raise trio.BrokenResourceError(f"mux stream {self.name!r}: {self._why}")
        if self._send_torn:
            raise trio.BrokenResourceError(
                f"mux stream {self.name!r}: an earlier send_all was cancelled halfway"
            )

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with self._sending:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._check_send()
            view = memoryview(data).cast("B")
            sent, waited = self._put(view, 0), False
            while sent < len(view):
                try:
                    await self._wait_writable()
                except trio.Cancelled:
                    if sent:
                        self._send_torn = True
                    raise
                waited = True
                self._check_send()
                sent = self._put(view, sent)
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()

    def try_send(self, data: bytes | bytearray | memoryview) -> int:
        """Send what the stream's credit allows of *data* now, without waiting: the count.

        Sent means queued on the link, or written already when its writer was idle (no task
        wakes for it). Raises as :meth:`send_all` does for a stream that cannot send.
        """
        if self._sending.held or self._state is not _OPEN or self._send_torn:
            with self._sending:  # raises as send_all would (BusyResourceError if it runs)
                self._check_send()
        return self._put(data.cast("B") if isinstance(data, memoryview) else data, 0)

    @property
    def send_torn(self) -> bool:
        """Whether a cancelled send left part of its data queued (the stream cannot resync)."""
        return self._send_torn

    def _put(self, data: bytes | bytearray | memoryview, sent: int) -> int:
        """Queue *data* (bytes, or a memoryview of them) from *sent* on as far as the credit
        goes; the new offset."""
        size = len(data)
        if not sent and size <= self._credit and size <= MAX_CHUNK:  # one frame, most often
            if size:
                self._credit -= size
                self._link._queue(_HEADER.pack(self._id, DATA, size) + data)
            return size
        view = memoryview(data)
        while sent < size and self._credit:
            count = min(self._credit, MAX_CHUNK, size - sent)
            self._credit -= count
            self._link._queue(_HEADER.pack(self._id, DATA, count) + view[sent : sent + count])
            sent += count
        return sent

    async def wait_send_all_might_not_block(self) -> None:
        with self._sending:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._check_send()
            if not self._credit:
                await self._wait_writable()
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()

    async def _wait_writable(self) -> None:
        event = self._writable = trio.Event()
        try:
            await event.wait()
        finally:
            self._writable = None

    # -- receiving ----------------------------------------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        with self._receiving:
            size = MAX_CHUNK if max_bytes is None else max_bytes
            if size < 1:
                raise ValueError("max_bytes must be >= 1")
            await trio.lowlevel.checkpoint_if_cancelled()
            while (data := self.read_now(size)) is None:
                await self._wait_data(None)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return data

    def read_now(self, max_bytes: int = MAX_CHUNK) -> bytes | None:
        """What is buffered (at most *max_bytes*), ``b""`` once the peer closed and all is
        read, ``None`` when nothing is in yet; raises as :meth:`receive_some` does."""
        if self._state == _CLOSED:
            raise trio.ClosedResourceError("the mux stream is closed")
        if self._buffer:
            data = bytes(self._buffer[:max_bytes])
            del self._buffer[:max_bytes]
            self._consumed(len(data))
            return data
        if self._state == _PEER_CLOSED:
            return b""
        if self._state == _BROKEN:
            raise trio.BrokenResourceError(f"mux stream {self.name!r}: {self._why}")
        return None

    async def wait_readable(self, sink: "Sink | None" = None) -> None:
        """Await until :meth:`read_now` may return something.

        While parked here with nothing buffered, DATA from the link goes to *sink* as it
        arrives, on the link's reader (the reader's task is not woken for it): the bytes are
        the sink's from then on, and it returns ``True`` to be disarmed and this wait to end
        (work it cannot do without awaiting). So a channel reads its stream without a hop
        from the link's reader to its own (:class:`ipc._transport.MuxIO`). A sink must never
        block or raise: it runs inside the link's reader, for every stream of the link.
        """
        with self._receiving:
            if self._buffer or self._state != _OPEN:
                await trio.lowlevel.checkpoint()
            else:
                await self._wait_data(sink)

    async def _wait_data(self, sink: "Sink | None") -> None:
        self._sink = sink
        event = self._readable = trio.Event()
        try:
            await event.wait()
        finally:
            self._readable = None
            self._sink = None

    def _consumed(self, count: int) -> None:
        """Grant credit back once a quarter window is consumed and not yet granted."""
        if self._state != _OPEN:
            return
        self._ungranted += count
        if self._ungranted >= self._link._grant_at:
            self._link._queue(_HEADER.pack(self._id, CREDIT, 4) + _CREDIT.pack(self._ungranted))
            self._receivable += self._ungranted
            self._ungranted = 0

    # -- closing ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Send CLOSE (unless the stream is already gone) and free the buffer; idempotent."""
        if self._state == _OPEN:
            self._link._forget(self._id)
            self._link._queue(_HEADER.pack(self._id, CLOSE, 0))
        self._end(_CLOSED, "closed")
        self._buffer = bytearray()
        await trio.lowlevel.checkpoint()

    def _end(self, state: str, why: str) -> None:
        """Leave the open state (only the stream's own close leaves another one)."""
        if self._state == _OPEN or state == _CLOSED:
            self._state, self._why = state, why
        if self._readable is not None:
            self._readable.set()
        if self._writable is not None:
            self._writable.set()

    # -- frames from the peer (called by the link's reader; never blocks) --------------------

    def _deliver(self, payload: bytes) -> None:
        if len(payload) > self._receivable:
            raise MuxError(
                f"mux link: DATA of {len(payload)} bytes on stream {self._id} exceeds its "
                f"credit of {self._receivable} bytes; the link is closed"
            )
        self._receivable -= len(payload)
        sink = self._sink
        if sink is not None:  # a reader parked with nothing buffered: the bytes are its
            self._consumed(len(payload))
            if sink(payload):
                self._sink = None
                if self._readable is not None:
                    self._readable.set()
            return
        self._buffer += payload
        if self._readable is not None:
            self._readable.set()

    def _grant(self, increment: int) -> None:
        if not 0 < increment < _CREDIT_LIMIT - self._credit:
            raise MuxError(
                f"mux link: CREDIT of {increment} on stream {self._id} (credit "
                f"{self._credit}) is 0 or overflows 2**31; the link is closed"
            )
        self._credit += increment
        if self._writable is not None:
            self._writable.set()


class MuxLink:
    """One connection carrying many :class:`MuxStream`; see the module docstring.

    Serve it with :meth:`run` (in a nursery, ``await nursery.start(link.run, on_open)``).
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        opener: bool,
        window: int = WINDOW,
        max_streams: int = MAX_STREAMS,
    ) -> None:
        if not 0 < window < _CREDIT_LIMIT:
            raise ValueError(f"window must be 1..2**31-1 bytes, not {window}")
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, not {max_streams}")
        self._window = window
        self._grant_at = max(1, window // 4)  # consumed bytes granted back as CREDIT at once
        self._stream = stream
        self._opener = opener
        self._max_streams = max_streams
        self._streams: dict[int, MuxStream] = {}
        self._last_id = 0
        self._running_handlers = 0
        self._outgoing: deque[bytes] = deque()
        self._backlog = 0  # bytes of control frames in _outgoing
        self._wake_writer = trio.Event()
        # A TLS door connection is read and written through its SSLSocket, as a channel
        # does (TLSIO), and a frame goes straight onto it when nothing is queued and the
        # writer is parked: no task wakes for it.
        self._tls = TLSIO(stream=stream) if isinstance(stream, SocketTLSStream) else None
        self._writing = False  # the writer is writing a batch
        self._pinned = False  # _outgoing[0] is a write OpenSSL started: it goes next, alone
        self._ended = False
        self._failure: BaseException | None = None
        self._io: trio.CancelScope | None = None
        self._handlers: trio.Nursery | None = None
        self._run_called = False

    @property
    def open_streams(self) -> int:
        """Streams open on this side (neither sent nor received CLOSE, link not ended)."""
        return len(self._streams)

    def open(self, name: str) -> MuxStream:
        """A new stream named *name*, usable at once (its OPEN is queued, no round trip).

        Opener only (``ValueError`` otherwise, or for a name not 1..256 bytes of UTF-8);
        :class:`trio.BrokenResourceError` once the link has ended.
        """
        if not self._opener:
            raise ValueError("only the opener of a mux link opens streams")
        encoded = name.encode()
        if not 0 < len(encoded) <= _MAX_NAME:
            raise ValueError(f"a mux stream name is 1..{_MAX_NAME} bytes, not {len(encoded)}")
        if self._ended:
            raise trio.BrokenResourceError("the mux link has ended")
        if self._last_id == _MAX_ID:
            raise trio.BrokenResourceError("the mux link has used every stream id: open another")
        self._last_id += 1
        stream = self._streams[self._last_id] = MuxStream(self, self._last_id, name)
        self._queue(_HEADER.pack(self._last_id, OPEN, len(encoded)) + encoded)
        return stream

    async def run(
        self,
        on_open: OnOpen | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve the link until it ends; ``task_status.started()`` once serving.

        On the acceptor each stream the peer opens goes to *on_open* in a task of its own
        (without *on_open* every OPEN is refused with CLOSE); when that task returns, the
        stream is closed if still open. Returns on the peer's clean EOF; raises
        :class:`~ipc.MuxError` on a violation and :class:`trio.BrokenResourceError` when the
        connection breaks. Either way every stream is broken and the connection closed, and
        run returns only once every *on_open* task has (their streams are broken, so a task
        doing stream I/O ends promptly). An *on_open* task's exception ends the link and
        propagates in an exception group, as any task's does from its nursery.
        """
        if self._run_called:
            raise RuntimeError("MuxLink.run serves a link once")
        self._run_called = True
        try:
            async with trio.open_nursery() as handlers:
                self._handlers = handlers
                async with trio.open_nursery() as io:
                    self._io = io.cancel_scope
                    if self._ended:  # closed before it ran
                        io.cancel_scope.cancel()
                    io.start_soon(self._write_loop)
                    task_status.started()
                    await self._read_loop(on_open)
                    io.cancel_scope.cancel()
                await trio.aclose_forcefully(self._stream)  # now, not once on_open tasks end
        finally:
            self._end(None)
            await trio.aclose_forcefully(self._stream)
        if self._failure is not None:
            raise self._failure

    async def aclose(self) -> None:
        """End the link: every stream broken, the connection closed. Idempotent."""
        self._end(None)
        await trio.aclose_forcefully(self._stream)

    # -- the link's end -----------------------------------------------------------------------

    def _end(self, failure: BaseException | None) -> None:
        """Break every stream and stop the reader and writer; the first cause wins."""
        if self._ended:
            return
        self._ended = True
        self._failure = failure
        why = "the mux link ended" if failure is None else f"the mux link ended: {failure}"
        for stream in self._streams.values():
            stream._end(_BROKEN, why)
        self._streams.clear()
        self._outgoing.clear()
        self._backlog = 0
        if self._io is not None:
            self._io.cancel()

    # -- writing ------------------------------------------------------------------------------

    def _queue(self, frame: bytes) -> None:
        if self._ended:
            return
        if self._tls is not None and not self._outgoing and not self._writing:
            try:
                if self._tls.try_send(frame):
                    return
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._end(trio.BrokenResourceError(f"the mux link's connection broke: {exc}"))
                return
            self._pinned = True  # OpenSSL may have sent part: the same bytes must follow
        self._outgoing.append(frame)
        if frame[4] in _REPLIES:
            self._backlog += len(frame)
            if self._backlog > _MAX_BACKLOG:
                self._end(
                    MuxError(
                        f"mux link: {self._backlog} bytes of control frames wait while the "
                        "peer does not read; the link is closed"
                    )
                )
                return
        self._wake_writer.set()

    async def _write_loop(self) -> None:
        outgoing = self._outgoing
        while True:
            if not outgoing:
                self._wake_writer = trio.Event()
                await self._wake_writer.wait()
                continue
            pinned, self._pinned = self._pinned, False
            if pinned:  # a write OpenSSL started: the same bytes go next, alone
                batch = [self._next_frame()]
            else:
                batch, size = [], 0
                while outgoing and size < _WRITE_BATCH:
                    batch.append(self._next_frame())
                    size += len(batch[-1])
            data = batch[0] if len(batch) == 1 else b"".join(batch)
            self._writing = True
            try:
                if self._tls is None:
                    await self._stream.send_all(data)
                elif (sent := 0 if pinned else self._tls.try_send(data)) != len(data):
                    await self._tls.send_rest(data, sent)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._end(trio.BrokenResourceError(f"the mux link's connection broke: {exc}"))
                return
            finally:
                self._writing = False

    def _next_frame(self) -> bytes:
        frame = self._outgoing.popleft()
        if frame[4] in _REPLIES:
            self._backlog -= len(frame)
        return frame

    # -- reading ------------------------------------------------------------------------------

    async def _read_loop(self, on_open: OnOpen | None) -> None:
        tls, left = self._tls, b""  # left: the start of a frame not whole yet
        try:
            while True:
                try:
                    if tls is None:
                        data = bytes(await self._stream.receive_some(_RECEIVE_SIZE))
                    else:
                        await tls.wait()
                        if (read := tls.read(_RECEIVE_SIZE)) is None:
                            continue
                        data = read
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._end(trio.BrokenResourceError(f"the mux link's connection broke: {exc}"))
                    return
                if not data:
                    self._end(_truncated(left))
                    return
                if left:
                    data = left + data
                left = data[self._frames(data, on_open) :]
        except MuxError as exc:
            self._end(exc)

    def _frames(self, data: bytes, on_open: OnOpen | None) -> int:
        """Act on every whole frame in *data*; the offset of the first one not whole."""
        start, end, header = 0, len(data), _HEADER.size
        while end - start >= header and not self._ended:  # ended by a frame's effect
            stream_id, kind, length = _HEADER.unpack_from(data, start)
            if kind != DATA or not 0 < length <= MAX_CHUNK:
                _check_length(stream_id, kind, length)  # before waiting for (or storing) it
            stop = start + header + length
            if stop > end:
                break
            payload = data[start + header : stop]
            start = stop
            if kind == OPEN:
                self._on_open_frame(stream_id, payload, on_open)
                continue
            stream = self._streams.get(stream_id)
            if stream is None:
                if stream_id == 0 or stream_id > self._last_id:
                    raise MuxError(
                        f"mux link: {_KIND_NAMES[kind]} for stream {stream_id}, which was "
                        "never opened; the link is closed"
                    )
                continue  # closed since: the race is legitimate
            if kind == DATA:
                stream._deliver(payload)
            elif kind == CREDIT:
                stream._grant(_CREDIT.unpack(payload)[0])
            else:
                self._forget(stream_id)
                reason = payload.decode(errors="replace") or "no reason given"
                stream._end(_PEER_CLOSED, f"closed by the peer ({reason})")
        return start

    def _on_open_frame(self, stream_id: int, payload: bytes, on_open: OnOpen | None) -> None:
        if self._opener:
            raise MuxError(f"mux link: OPEN of stream {stream_id} from the acceptor")
        if stream_id <= self._last_id:
            raise MuxError(
                f"mux link: OPEN of stream {stream_id}, not above the last id "
                f"{self._last_id}; the link is closed"
            )
        try:
            name = payload.decode()
        except UnicodeDecodeError:
            raise MuxError(
                f"mux link: OPEN of stream {stream_id} with a name that is not UTF-8; "
                "the link is closed"
            ) from None
        self._last_id = stream_id
        if on_open is None or self._handlers is None:
            self._refuse(stream_id, "not accepting streams")
        elif self._running_handlers >= self._max_streams:
            self._refuse(stream_id, "too many streams")
        else:
            stream = self._streams[stream_id] = MuxStream(self, stream_id, name)
            self._running_handlers += 1
            self._handlers.start_soon(self._serve, on_open, stream, name=f"mux stream {name}")

    def _refuse(self, stream_id: int, reason: str) -> None:
        encoded = reason.encode()
        self._queue(_HEADER.pack(stream_id, CLOSE, len(encoded)) + encoded)

    async def _serve(self, on_open: OnOpen, stream: MuxStream) -> None:
        try:
            await on_open(stream)
        finally:
            self._running_handlers -= 1
            await stream.aclose()

    def _forget(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)


_KIND_NAMES: Final = {OPEN: "OPEN", DATA: "DATA", CREDIT: "CREDIT", CLOSE: "CLOSE"}
#: The payload lengths each kind allows, inclusive.
_LENGTHS: Final = {
    OPEN: (1, _MAX_NAME),
    DATA: (1, MAX_CHUNK),
    CREDIT: (4, 4),
    CLOSE: (0, _MAX_NAME),
}


def _check_length(stream_id: int, kind: int, length: int) -> None:
    """Refuse a frame from its header alone: unknown kind, or a payload its kind forbids."""
    if kind not in _LENGTHS:
        raise MuxError(f"mux link: unknown frame kind {kind} on stream {stream_id}")
    low, high = _LENGTHS[kind]
    if not low <= length <= high:
        raise MuxError(
            f"mux link: {_KIND_NAMES[kind]} of stream {stream_id} with a {length}-byte "
            f"payload (allowed {low}..{high}); the link is closed"
        )


def _truncated(buffer: bytes) -> MuxError | None:
    """The failure of a link whose connection ended with *buffer* unparsed (None if empty)."""
    if not buffer:
        return None
    return MuxError(
        f"mux link: the connection ended inside a frame ({len(buffer)} bytes of it); "
        "the link is closed"
    )
