"""One authenticated connection: request/response by correlation id, events, and drop policy.

A :class:`Channel` wraps a connected trio stream whose peer has already been authenticated (see
:func:`ipc.accept_hello` for the server side and :func:`ipc.open_client` for the client side).
One task at a time reads from it — :meth:`Channel.serve`'s reader, a requester the
reader lends the socket to so that it reads its own response, or, over a stream of a node
link, the link's reader while the channel's waits (:mod:`ipc._lending`) — through one decoder,
so no frame is split between two readers or routed out of order. What the
reader does with each frame is
:mod:`ipc._dispatch`'s job; it never runs an async request handler itself, so a long
``question`` never blocks it. The bytes move through :mod:`ipc._transport`, and the channel
owns its stream from then on: close it with :meth:`Channel.aclose`, never the stream itself.
This side's requests wait for their responses and deadlines in :mod:`ipc._requests`; while
``serve`` runs, its deadline keeper runs beside the reader.

Drop policy: a well-framed frame that is invalid (bad JSON, wrong token, wrong owner, unknown
type, schema error, unexpected correlation id) is dropped and counted by reason; after
:data:`MAX_DROPS` the channel closes and :attr:`Channel.flagged` is set. The peer is never told
why. A framing error (zero length, oversize) closes at once: the stream cannot resync. A response
that arrives after its request timed out or was cancelled is discarded without counting: a slow
peer is not a hostile one.
"""

import collections
import functools
import logging
import math
from collections.abc import Awaitable
from typing import Any, Final

import attrs
import trio

from ipc._auth import token_bytes
from ipc._dispatch import Dispatch, EventHandler, ImmediateHandler, RequestHandler, no_immediate
from ipc._errors import ChannelClosed, FrameError
from ipc._framing import MAX_FRAME, FrameDecoder
from ipc._lending import Lending
from ipc._messages import FrameWriter
from ipc._requests import DEFAULT_TIMEOUT, Requests, check_timeout
from ipc._transport import LENDABLE, MuxIO, Transport, transport_for
from ipc._types import NO_DEADLINE_TYPES, TYPE_NAMES, Kind, Message

__all__ = [
    "MAX_DROPS",
    "Channel",
    "EventHandler",
    "ImmediateHandler",
    "RequestHandler",
]

log = logging.getLogger("ipc")

MAX_DROPS: Final = 16
EVENTS_PER_YIELD: Final = 16
"""Events :meth:`Channel.send_event` may write without yielding to the scheduler."""


class _Default:
    """Marker for "use the channel's default deadline"."""


DEFAULT: Final = _Default()


# No setattr hooks: for default_timeout's converter attrs would route every attribute write
# of the channel through a Python __setattr__ (a microsecond per round trip).
@attrs.define(eq=False, on_setattr=attrs.setters.NO_OP)
class Channel:
    """An authenticated, framed connection bound to one owner."""

    stream: trio.abc.Stream
    # Read once, into the frame writer: they do not change for a connection's life.
    owner: str
    token: str
    max_frame: int = MAX_FRAME
    # Checked when the channel is made (see on_setattr above).
    default_timeout: float = attrs.field(default=DEFAULT_TIMEOUT, converter=check_timeout)
    initial: list[bytes] = attrs.Factory(list)
    decoder: FrameDecoder | None = None

    drops: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    flagged: bool = attrs.field(default=False, init=False)
    closed: bool = attrs.field(default=False, init=False)
    close_reason: str = attrs.field(default="", init=False)
    _writer: FrameWriter = attrs.field(init=False)
    _token_bytes: bytes = attrs.field(init=False)
    _io: Transport = attrs.field(init=False)
    # A writer holds the turn while _sending; the _queued others park in the queue, in order.
    _sending: bool = attrs.field(default=False, init=False)
    _queued: int = attrs.field(default=0, init=False)
    # Events written since this channel's writers last yielded to the scheduler.
    _unyielded: int = attrs.field(default=0, init=False)
    _send_queue: trio.lowlevel.ParkingLot = attrs.field(
        factory=trio.lowlevel.ParkingLot, init=False
    )
    # The socket lent by the reader to a requester (ipc._lending).
    _lending: Lending = attrs.field(init=False)
    _requests: Requests = attrs.field(init=False)
    _cancel: trio.CancelScope | None = attrs.field(default=None, init=False)
    _serving: bool = attrs.field(default=False, init=False)

    @_writer.default
    def _make_writer(self) -> FrameWriter:
        return FrameWriter(token=self.token, owner=self.owner, max_frame=self.max_frame)

    @_token_bytes.default
    def _encode_token(self) -> bytes:
        return token_bytes(self.token)

    @_io.default
    def _make_io(self) -> Transport:
        return transport_for(self.stream)

    @_lending.default
    def _make_lending(self) -> Lending:
        return Lending(io=self._io, log=log)

    @_requests.default
    def _make_requests(self) -> Requests:
        return Requests(
            owner=self.owner,
            write=self._write,
            take_socket=self._lending.take,
            read_for=functools.partial(self._lending.read_for, self),
            interrupt=self._interrupt_lender,
        )

    # -- sending ----------------------------------------------------------------------------

    async def _write(self, frame: bytes) -> bool:
        """Write one whole frame, in FIFO order behind the frames already queued.

        A cancel point; a schedule point only if the transport had to wait (see
        :mod:`ipc._transport`), which it returns, so a caller that does not park next can
        yield itself.
        """
        if self._sending or self.closed:
            await self._take_turn()
        else:
            self._sending = True
        try:
            # A cancellation delivered here has written nothing: the stream is intact.
            await trio.lowlevel.checkpoint_if_cancelled()
            sent = self._try_send(frame)
        except BaseException:
            self._end_turn()
            raise
        if sent == len(frame):
            self._end_turn()
            return False
        await self._write_rest(frame, sent)
        return True

    def _answer_now(self, frame: bytes) -> Awaitable[object] | None:
        """Write *frame*, an answer the reader gives, without awaiting when nothing else is
        being written and the transport takes it whole; else what is left to await (the rest
        of the frame, or the whole write behind the others), in the same FIFO order.

        Whoever routes frames calls this: the channel's reader, a requester it lent the
        socket to, or a node link's reader, which must not wake the channel's reader for an
        answer that can go out now. An answer that cannot go out any more is logged, as
        :meth:`_settle` does.
        """
        if self._sending or self.closed:
            return self._write(frame)
        self._sending = True
        try:
            sent = self._try_send(frame)
        except ChannelClosed:
            self._end_turn()
            log.debug("could not answer on %s: closed", self.owner)
            return None
        if sent == len(frame):
            self._end_turn()
            return None
        return self._write_rest(frame, sent)

    def _try_send(self, frame: bytes) -> int:
        """What of *frame* the transport takes now; the caller holds the turn to write."""
        try:
            return self._io.try_send(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._mark_closed("send failed")
            raise ChannelClosed(f"channel to {self.owner} broke while sending: {exc}") from None

    async def _write_rest(self, frame: bytes, sent: int) -> None:
        """Write *frame* from offset *sent* on, then pass the turn to write on."""
        io = self._io
        try:
            await io.send_rest(frame, sent)
        except trio.Cancelled:
            if io.torn:
                # Part of the frame may be on the wire; the peer can never resync.
                self._mark_closed("send cancelled mid-frame")
            raise
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._mark_closed("send failed")
            raise ChannelClosed(f"channel to {self.owner} broke while sending: {exc}") from None
        finally:
            self._end_turn()

    def _end_turn(self) -> None:
        if self._queued:
            self._send_queue.unpark()  # the turn passes on; _sending stays set
        else:
            self._sending = False

    async def _take_turn(self) -> None:
        """Wait for the turn to write, behind the writers already queued."""
        self._refuse_if_closed()
        if not self._sending:
            self._sending = True
            return
        self._queued += 1
        try:
            await self._send_queue.park()  # the writer before us hands its turn over
        finally:
            self._queued -= 1
        if self.closed:  # never write behind a torn frame
            if self._queued:
                self._send_queue.unpark()
            else:
                self._sending = False
            self._refuse_if_closed()

    def _refuse_if_closed(self) -> None:
        if self.closed:
            raise ChannelClosed(f"channel to {self.owner} is closed ({self.close_reason})")

    async def _send(self, kind: Kind, corr: str, message: Message) -> None:
        await self._write(self._writer.frame(kind, corr, message))

    async def send_event(self, message: Message) -> None:
        """Send a fire-and-forget event.

        Always a cancel point; a schedule point when the write had to wait, and otherwise at
        least every :data:`EVENTS_PER_YIELD` events (a pass through the scheduler per event
        cost half of an event's price).
        """
        if await self._write(self._writer.frame("event", "", message)):
            self._unyielded = 0
        elif self._unyielded < EVENTS_PER_YIELD - 1:
            self._unyielded += 1
        else:
            self._unyielded = 0
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def request(
        self,
        message: Message,
        *,
        timeout: float | _Default | None = DEFAULT,  # noqa: ASYNC109 - the protocol's per-request deadline
    ) -> Message:
        """Send a request and return the response body.

        *timeout* defaults to the channel's deadline (5 s). ``None`` waits without a deadline
        and is allowed only for ``question`` and ``spawn``. Raises :class:`RequestTimeout`,
        :class:`ChannelClosed`, or :class:`RemoteError` for an error :class:`Reply`.
        """
        kind = TYPE_NAMES[type(message)]
        if timeout is None:
            if kind not in NO_DEADLINE_TYPES:
                raise ValueError(f"a {kind!r} request must have a deadline")
            deadline = math.inf
        elif timeout is DEFAULT:
            deadline = self.default_timeout
        else:
            deadline = check_timeout(timeout)  # type: ignore[arg-type]  # not DEFAULT here
        requests = self._requests
        corr = requests.new_corr()
        frame = self._writer.frame("request", corr, message)
        return await requests.call(kind, corr, frame, deadline)

    async def reply(self, corr: str, message: Message) -> None:
        """Answer the request *corr* (used for the hello reply before :meth:`serve`)."""
        await self._send("response", corr, message)

    # -- receiving --------------------------------------------------------------------------

    async def serve(
        self,
        handler: RequestHandler,
        on_event: EventHandler,
        *,
        immediate: ImmediateHandler = no_immediate,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Read frames until EOF or close; dispatch requests, events and responses.

        Each request's body goes to *immediate* first: a plain function that answers on the
        reader (it cannot await, so it cannot stall the reader) or returns ``None`` to pass the
        request to *handler*, which runs in a task. Events are handled on the reader, in
        order. Returns when the connection ends; every pending request is then rejected with
        :class:`ChannelClosed`.
        """
        if self._serving:
            raise RuntimeError("Channel.serve is already running (one reader per connection)")
        self._serving = True
        decoder = self.decoder or FrameDecoder(max_frame=self.max_frame)
        requests, lending = self._requests, self._lending
        lends = isinstance(self._io, LENDABLE)  # a lender waits on a duplicate descriptor
        lending.decoder = decoder
        try:
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                dispatch = Dispatch(
                    channel=self,
                    deliver=self._requests.deliver,
                    handler=handler,
                    on_event=on_event,
                    immediate=immediate,
                    nursery=nursery,
                )
                nursery.start_soon(self._requests.keep_deadlines)
                nursery.start_soon(dispatch.worker.run)
                task_status.started()
                route = lending.route = dispatch.route
                for frame in self.initial:
                    if (work := route(frame)) is not None:
                        await self._settle(work)
                self.initial.clear()
                if isinstance(self._io, MuxIO):  # the link's reader routes for us
                    self._io.sink = functools.partial(lending.route_for, self)
                wait, read = self._io.wait, self._io.read
                while not self.closed:
                    if lending.lent:  # a requester reads: park until it gives the socket back
                        await lending.park()
                        continue
                    if lending.backlog:  # what it read but left to us
                        await lending.route_backlog(self._settle)
                        continue
                    lending.lendable = False  # from here until the chunk is routed
                    try:
                        await wait()
                        if lending.handed_over:  # what the link's reader left goes first
                            lending.handed_over = False
                            continue
                        data = read()
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        self._mark_closed("connection lost")
                        break
                    if data is None:
                        continue
                    if not data:
                        self._mark_closed("peer closed")
                        break
                    try:
                        frames = decoder.feed(data)
                    except FrameError as exc:
                        log.warning("closing channel %s: %s", self.owner, exc)
                        self.flagged = True
                        self._mark_closed("framing error")
                        break
                    delivered = requests.delivered
                    for frame in frames:
                        if (work := route(frame)) is not None:
                            try:
                                await work
                            except ChannelClosed:  # an answer that cannot go out any more
                                log.debug("could not answer on %s: closed", self.owner)
                    if requests.delivered != delivered and lends and not self.closed:
                        # A requester woke: let it run first, so that if it asks again at
                        # once it can read its next response itself (ipc._lending).
                        lending.lendable = True
                        await trio.lowlevel.cancel_shielded_checkpoint()
                        if requests.resumed != requests.delivered:  # it was not yet its turn
                            await trio.lowlevel.cancel_shielded_checkpoint()
                        lending.lendable = False
                nursery.cancel_scope.cancel()
        finally:
            lending.stop()
            self._mark_closed(self.close_reason or "cancelled")
            with trio.CancelScope(shield=True):
                await self._io.aclose()

    async def _settle(self, work: Awaitable[object]) -> None:
        try:
            await work
        except ChannelClosed:  # an answer that cannot go out any more
            log.debug("could not answer on %s: closed", self.owner)

    def _drop(self, reason: str, detail: str) -> None:
        self.drops[reason] += 1
        total = sum(self.drops.values())
        # The detail never contains the token: only reasons and schema paths are logged.
        log.info("dropped frame from %s (%s: %s); %d so far", self.owner, reason, detail, total)
        if total >= MAX_DROPS:
            self.flagged = True
            self._mark_closed(f"{MAX_DROPS} invalid frames")

    # -- closing ----------------------------------------------------------------------------

    def _mark_closed(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = reason
        self._requests.reject_all(self.close_reason)
        if self._cancel is not None:
            self._cancel.cancel()

    def close(self, reason: str = "closed") -> None:
        """Close now: reject every pending request and stop :meth:`serve`."""
        self._mark_closed(reason)

    async def aclose(self, reason: str = "closed") -> None:
        """Close and release the stream."""
        self._mark_closed(reason)
        with trio.CancelScope(shield=True):
            await self._io.aclose()

    def _interrupt_lender(self) -> None:
        if isinstance(self._io, LENDABLE):
            self._io.interrupt_lender()

    @property
    def direct_reads(self) -> int:
        """Requests of ours whose task read its own response (no hand-off from the reader)."""
        return self._lending.reads

    def statistics(self) -> dict[str, Any]:
        """Counters for diagnostics: drops by reason, pending requests, flag state."""
        return {
            "drops": dict(self.drops),
            "pending": self._requests.in_flight,
            "flagged": self.flagged,
            "closed": self.closed,
        }
