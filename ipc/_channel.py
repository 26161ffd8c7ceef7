"""One authenticated connection: request/response by correlation id, events, and drop policy.

A :class:`Channel` wraps a connected trio stream whose peer has already been authenticated (see
:func:`ipc.accept_hello` for the server side and :func:`ipc.open_client` for the client side).
Exactly one task reads from it — :meth:`Channel.serve` — because a framed read cancelled
halfway would desynchronize the stream. What the reader does with each frame is
:mod:`ipc._dispatch`'s job; it never runs an async request handler itself, so a long
``question`` never blocks it. The bytes move through :mod:`ipc._transport`, and the channel
owns its stream from then on: close it with :meth:`Channel.aclose`, never the stream itself.
While ``serve`` runs, one deadline keeper task times out this side's requests (a cancel scope
per request cost a tenth of a round trip); before it runs, each request carries its own scope.

Drop policy: a well-framed frame that is invalid (bad JSON, wrong token, wrong owner, unknown
type, schema error, unexpected correlation id) is dropped and counted by reason; after
:data:`MAX_DROPS` the channel closes and :attr:`Channel.flagged` is set. The peer is never told
why. A framing error (zero length, oversize) closes at once: the stream cannot resync. A response
that arrives after its request timed out or was cancelled is discarded without counting: a slow
peer is not a hostile one.
"""

import collections
import itertools
import logging
import math
from collections.abc import Awaitable, Iterator
from typing import Any, Final

import attrs
import trio

from ipc._auth import token_bytes
from ipc._dispatch import (
    REPLAY_CACHE,
    RESPONSE_TYPES,
    Dispatch,
    EventHandler,
    ImmediateHandler,
    RequestHandler,
    no_immediate,
)
from ipc._errors import ChannelClosed, FrameError, RemoteError, RequestTimeout
from ipc._framing import MAX_FRAME, FrameDecoder
from ipc._handoff import Pending
from ipc._messages import FrameWriter
from ipc._transport import SocketIO, StreamIO, transport_for
from ipc._types import NO_DEADLINE_TYPES, TYPE_NAMES, Kind, Message, Reply

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_DROPS",
    "REPLAY_CACHE",
    "Channel",
    "EventHandler",
    "ImmediateHandler",
    "RequestHandler",
    "check_timeout",
]

log = logging.getLogger("ipc")

DEFAULT_TIMEOUT: Final = 5.0
MIN_TIMEOUT: Final = 0.001
MAX_TIMEOUT: Final = 120.0
MAX_DROPS: Final = 16


class _Default:
    """Marker for "use the channel's default deadline"."""


DEFAULT: Final = _Default()


def check_timeout(timeout: float) -> float:
    """Validate a request deadline against the allowed range (1 ms to 120 s)."""
    if not (MIN_TIMEOUT <= timeout <= MAX_TIMEOUT) or math.isnan(timeout):
        raise ValueError(
            f"request deadline {timeout!r} s is outside {MIN_TIMEOUT}..{MAX_TIMEOUT} s"
        )
    return timeout


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
    _io: StreamIO | SocketIO = attrs.field(init=False)
    # A writer holds the turn while _sending; the _queued others park in the queue, in order.
    _sending: bool = attrs.field(default=False, init=False)
    _queued: int = attrs.field(default=0, init=False)
    _send_queue: trio.lowlevel.ParkingLot = attrs.field(
        factory=trio.lowlevel.ParkingLot, init=False
    )
    _pending: dict[str, Pending] = attrs.field(factory=dict, init=False)
    _corr: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    # corrs of our requests that gave up waiting; a late response to one is not a drop.
    _expired: collections.OrderedDict[str, None] = attrs.field(
        factory=collections.OrderedDict, init=False
    )
    _cancel: trio.CancelScope | None = attrs.field(default=None, init=False)
    # The deadline keeper's sleep, due at the earliest deadline it enforces (while serving),
    # and the run's clock (trio.current_time() is three calls deep).
    _timer: trio.CancelScope | None = attrs.field(default=None, init=False)
    _clock: trio.abc.Clock = attrs.field(init=False)
    _serving: bool = attrs.field(default=False, init=False)

    @_writer.default
    def _make_writer(self) -> FrameWriter:
        return FrameWriter(token=self.token, owner=self.owner, max_frame=self.max_frame)

    @_token_bytes.default
    def _encode_token(self) -> bytes:
        return token_bytes(self.token)

    @_io.default
    def _make_io(self) -> StreamIO | SocketIO:
        return transport_for(self.stream)

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
        io = self._io
        try:
            # A cancellation delivered here has written nothing: the stream is intact.
            await trio.lowlevel.checkpoint_if_cancelled()
            sent = io.try_send(frame)
            waited = sent != len(frame)
            if waited:
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
            if self._queued:
                self._send_queue.unpark()  # the turn passes on; _sending stays set
            else:
                self._sending = False
        return waited

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
        """Send a fire-and-forget event."""
        if not await self._write(self._writer.frame("event", "", message)):
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
        corr = str(next(self._corr))
        frame = self._writer.frame("request", corr, message)
        pending = Pending(type=kind)
        self._pending[corr] = pending
        try:
            await self._write(frame)
            timer = self._timer
            if pending.done:  # answered, closed or timed out while the write waited
                pass
            elif timer is None or deadline == math.inf:
                with trio.move_on_after(deadline):
                    await pending.wait()
            else:
                # serve()'s deadline keeper times this request out: one cancel scope per
                # channel instead of one per request, which cost a tenth of a round trip.
                # Moving the keeper's deadline is itself costly, so only an earlier one does.
                pending.deadline = self._clock.current_time() + deadline
                if pending.deadline < timer.deadline:  # noqa: PLR1730 - min() would always set it
                    timer.deadline = pending.deadline
                await pending.wait()
        finally:
            # Still registered and unanswered: we timed out or were cancelled (a close would
            # have removed it), so the peer may yet answer.
            if self._pending.pop(corr, None) is not None and not pending.done:
                self._remember_expired(corr)
        if pending.error is not None:
            raise pending.error
        body = pending.result
        if body is None:
            raise RequestTimeout(
                f"{kind} request to {self.owner} got no response within {deadline:g} s"
            )
        if isinstance(body, Reply) and not body.ok:
            raise RemoteError(
                body.error or f"{kind} request to {self.owner} failed", data=body.data
            )
        return body  # type: ignore[no-any-return]  # a decoded response body

    def _remember_expired(self, corr: str) -> None:
        self._expired[corr] = None
        while len(self._expired) > REPLAY_CACHE:
            self._expired.popitem(last=False)

    async def _keep_deadlines(self) -> None:
        """While serve() runs: time out every request whose deadline has passed."""
        self._clock = trio.lowlevel.current_clock()
        try:
            while True:
                earliest = min((p.deadline for p in self._pending.values()), default=math.inf)
                with trio.CancelScope(deadline=earliest) as timer:
                    self._timer = timer
                    await trio.sleep_forever()
                now = trio.current_time()
                for corr, pending in list(self._pending.items()):
                    if pending.deadline <= now:
                        del self._pending[corr]
                        self._remember_expired(corr)
                        pending.finish()  # no result, no error: the requester times out
        finally:
            self._timer = None

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
        try:
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                dispatch = Dispatch(
                    channel=self,
                    handler=handler,
                    on_event=on_event,
                    immediate=immediate,
                    nursery=nursery,
                )
                nursery.start_soon(self._keep_deadlines)
                nursery.start_soon(dispatch.worker.run)
                task_status.started()
                route = dispatch.route
                for frame in self.initial:
                    if (work := route(frame)) is not None:
                        await self._settle(work)
                self.initial.clear()
                wait, read = self._io.wait, self._io.read
                while not self.closed:
                    try:
                        await wait()
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
                    for frame in frames:
                        if (work := route(frame)) is not None:
                            try:
                                await work
                            except ChannelClosed:  # an answer that cannot go out any more
                                log.debug("could not answer on %s: closed", self.owner)
                nursery.cancel_scope.cancel()
        finally:
            self._mark_closed(self.close_reason or "cancelled")
            with trio.CancelScope(shield=True):
                await self._io.aclose()

    async def _settle(self, work: Awaitable[object]) -> None:
        try:
            await work
        except ChannelClosed:  # an answer that cannot go out any more
            log.debug("could not answer on %s: closed", self.owner)

    def _deliver(self, corr: str, type_: str, body: Message) -> None:
        """A response arrived: fill its pending request (or drop it, or let a late one go)."""
        if corr in self._expired:
            del self._expired[corr]
            log.debug("late response %s from %s discarded", corr, self.owner)
            return
        pending = self._pending.get(corr)
        if pending is None or type_ not in RESPONSE_TYPES or pending.done:
            self._drop("corr", "$.corr")
            return
        pending.finish(body)

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
        for pending in self._pending.values():
            pending.finish(
                error=ChannelClosed(
                    f"{pending.type} request to {self.owner} rejected: {self.close_reason}"
                )
            )
        self._pending.clear()
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

    def statistics(self) -> dict[str, Any]:
        """Counters for diagnostics: drops by reason, pending requests, flag state."""
        return {
            "drops": dict(self.drops),
            "pending": len(self._pending),
            "flagged": self.flagged,
            "closed": self.closed,
        }
