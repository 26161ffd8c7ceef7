"""One authenticated connection: request/response by correlation id, events, and drop policy.

A :class:`Channel` wraps a connected trio stream whose peer has already been authenticated (see
:func:`ipc.accept_hello` for the server side and :func:`ipc.open_client` for the client side).
Exactly one task reads from it — :meth:`Channel.serve` — because a framed read cancelled
halfway would desynchronize the stream. Incoming requests run in their own tasks inside
``serve``'s nursery so a long ``question`` never blocks the reader. While ``serve`` runs, one
deadline keeper task times out this side's requests (a cancel scope per request cost a tenth of
a round trip); before it runs, each request carries its own scope.

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
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

import attrs
import trio

from ipc._auth import tokens_match
from ipc._errors import (
    ChannelClosed,
    FrameError,
    RemoteError,
    RequestTimeout,
    SchemaError,
)
from ipc._framing import MAX_FRAME, FrameDecoder, encode_frame
from ipc._messages import decode_envelope, encode_fields, type_name
from ipc._types import NO_DEADLINE_TYPES, Answer, Envelope, Kind, Message, Reply

log = logging.getLogger("ipc")

DEFAULT_TIMEOUT: Final = 5.0
MIN_TIMEOUT: Final = 0.001
MAX_TIMEOUT: Final = 120.0
MAX_DROPS: Final = 16
REPLAY_CACHE: Final = 256
_RESPONSE_TYPES: Final = frozenset({"reply", "answer"})

RequestHandler = Callable[[Envelope], Awaitable[Message]]
EventHandler = Callable[[Envelope], Awaitable[None]]


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


@attrs.define(eq=False)
class _Pending:
    type: str
    done: trio.Event = attrs.Factory(trio.Event)
    result: Envelope | None = None
    error: Exception | None = None
    # Set only when serve()'s deadline keeper enforces this request's deadline.
    deadline: float = math.inf


@attrs.define(eq=False)
class Channel:
    """An authenticated, framed connection bound to one owner."""

    stream: trio.abc.Stream
    owner: str
    token: str
    max_frame: int = MAX_FRAME
    default_timeout: float = attrs.field(default=DEFAULT_TIMEOUT, converter=check_timeout)
    initial: list[bytes] = attrs.Factory(list)
    decoder: FrameDecoder | None = None

    drops: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    flagged: bool = attrs.field(default=False, init=False)
    closed: bool = attrs.field(default=False, init=False)
    close_reason: str = attrs.field(default="", init=False)
    _send_lock: trio.StrictFIFOLock = attrs.field(factory=trio.StrictFIFOLock, init=False)
    _pending: dict[str, _Pending] = attrs.field(factory=dict, init=False)
    _corr: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    # corr -> the encoded response frame, or None while the handler still runs.
    _replies: collections.OrderedDict[str, bytes | None] = attrs.field(
        factory=collections.OrderedDict, init=False
    )
    # corrs of our requests that gave up waiting; a late response to one is not a drop.
    _expired: collections.OrderedDict[str, None] = attrs.field(
        factory=collections.OrderedDict, init=False
    )
    _cancel: trio.CancelScope | None = attrs.field(default=None, init=False)
    # The deadline keeper's sleep, due at the earliest deadline it enforces (while serving).
    _timer: trio.CancelScope | None = attrs.field(default=None, init=False)
    _serving: bool = attrs.field(default=False, init=False)

    # -- sending ----------------------------------------------------------------------------

    def _frame(self, kind: Kind, corr: str, message: Message) -> bytes:
        body = encode_fields(
            token=self.token,
            owner=self.owner,
            corr=corr,
            kind=kind,
            type_=type_name(message),
            body=message,
        )
        return encode_frame(body, max_frame=self.max_frame)

    async def _write(self, frame: bytes) -> None:
        if self.closed:
            raise ChannelClosed(f"channel to {self.owner} is closed ({self.close_reason})")
        lock = self._send_lock
        try:
            # The uncontended case skips a trip through the scheduler; send_all checkpoints.
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()  # FIFO behind the frames already queued
        try:
            # A cancellation delivered here has written nothing: the stream is intact.
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                await self.stream.send_all(frame)
            except trio.Cancelled:
                # Part of the frame may be on the wire; the peer can never resync.
                self._mark_closed("send cancelled mid-frame")
                raise
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._mark_closed("send failed")
            raise ChannelClosed(f"channel to {self.owner} broke while sending: {exc}") from None
        finally:
            lock.release()

    async def _send(self, kind: Kind, corr: str, message: Message) -> None:
        await self._write(self._frame(kind, corr, message))

    async def send_event(self, message: Message) -> None:
        """Send a fire-and-forget event."""
        await self._send("event", "", message)

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
        kind = type_name(message)
        if timeout is None:
            if kind not in NO_DEADLINE_TYPES:
                raise ValueError(f"a {kind!r} request must have a deadline")
            deadline = math.inf
        elif isinstance(timeout, _Default):
            deadline = self.default_timeout
        else:
            deadline = check_timeout(timeout)
        corr = str(next(self._corr))
        frame = self._frame("request", corr, message)
        pending = _Pending(type=kind)
        self._pending[corr] = pending
        try:
            await self._write(frame)
            timer = self._timer
            if timer is None or deadline == math.inf:
                with trio.move_on_after(deadline):
                    await pending.done.wait()
            else:
                # serve()'s deadline keeper times this request out: one cancel scope per
                # channel instead of one per request, which cost a tenth of a round trip.
                pending.deadline = trio.current_time() + deadline
                timer.deadline = min(timer.deadline, pending.deadline)
                await pending.done.wait()
        finally:
            # Still registered and unanswered: we timed out or were cancelled (a close would
            # have removed it), so the peer may yet answer.
            if self._pending.pop(corr, None) is not None and pending.result is None:
                self._remember_expired(corr)
        if pending.error is not None:
            raise pending.error
        if pending.result is None:
            raise RequestTimeout(
                f"{kind} request to {self.owner} got no response within {deadline:g} s"
            )
        body = pending.result.body
        if isinstance(body, Reply) and not body.ok:
            raise RemoteError(
                body.error or f"{kind} request to {self.owner} failed", data=body.data
            )
        return body

    def _remember_expired(self, corr: str) -> None:
        self._expired[corr] = None
        while len(self._expired) > REPLAY_CACHE:
            self._expired.popitem(last=False)

    async def _keep_deadlines(self) -> None:
        """While serve() runs: time out every request whose deadline has passed."""
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
                        pending.done.set()  # no result, no error: the requester times out
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
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Read frames until EOF or close; dispatch requests, events and responses.

        Returns when the connection ends; every pending request is then rejected with
        :class:`ChannelClosed`.
        """
        if self._serving:
            raise RuntimeError("Channel.serve is already running (one reader per connection)")
        self._serving = True
        decoder = self.decoder or FrameDecoder(max_frame=self.max_frame)
        try:
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                nursery.start_soon(self._keep_deadlines)
                task_status.started()
                for frame in self.initial:
                    await self._dispatch(frame, handler, on_event, nursery)
                self.initial.clear()
                while not self.closed:
                    try:
                        data = bytes(await self.stream.receive_some(65536))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        self._mark_closed("connection lost")
                        break
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
                        await self._dispatch(frame, handler, on_event, nursery)
                nursery.cancel_scope.cancel()
        finally:
            self._mark_closed(self.close_reason or "cancelled")
            with trio.CancelScope(shield=True):
                await self.stream.aclose()

    def _drop(self, reason: str, detail: str) -> None:
        self.drops[reason] += 1
        total = sum(self.drops.values())
        # The detail never contains the token: only reasons and schema paths are logged.
        log.info("dropped frame from %s (%s: %s); %d so far", self.owner, reason, detail, total)
        if total >= MAX_DROPS:
            self.flagged = True
            self._mark_closed(f"{MAX_DROPS} invalid frames")

    async def _dispatch(
        self,
        frame: bytes,
        handler: RequestHandler,
        on_event: EventHandler,
        nursery: trio.Nursery,
    ) -> None:
        if self.closed:  # frames after a close-worthy drop are ignored
            return
        try:
            envelope = decode_envelope(frame)
        except SchemaError as exc:
            self._drop(exc.reason, exc.path)
            return
        if not tokens_match(envelope.token, self.token):
            self._drop("token", "$.token")
            return
        if envelope.owner != self.owner:
            self._drop("owner", "$.owner")
            return
        if envelope.kind == "response":
            if envelope.corr in self._expired:
                del self._expired[envelope.corr]
                log.debug("late response %s from %s discarded", envelope.corr, self.owner)
                return
            pending = self._pending.get(envelope.corr)
            if pending is None or envelope.type not in _RESPONSE_TYPES or pending.done.is_set():
                self._drop("corr", "$.corr")
                return
            pending.result = envelope
            pending.done.set()
        elif envelope.type in _RESPONSE_TYPES:
            self._drop("type", "$.type")
        elif envelope.kind == "event":
            try:
                await on_event(envelope)
            except Exception:
                # Like a failing request handler: one bad event must not stop the reader.
                log.exception("event handler for %s from %s failed", envelope.type, self.owner)
        else:
            await self._start_request(envelope, handler, nursery)

    async def _start_request(
        self, envelope: Envelope, handler: RequestHandler, nursery: trio.Nursery
    ) -> None:
        corr = envelope.corr
        if corr in self._replies:
            recorded = self._replies[corr]
            if recorded is not None:  # None = still running: its response goes out once
                await self._write_quietly(corr, recorded)
            return
        self._replies[corr] = None
        while len(self._replies) > REPLAY_CACHE:
            self._replies.popitem(last=False)
        nursery.start_soon(self._run_handler, envelope, handler)

    async def _run_handler(self, envelope: Envelope, handler: RequestHandler) -> None:
        try:
            response = await handler(envelope)
        except ChannelClosed:
            return
        except Exception as exc:
            log.exception("handler for %s from %s failed", envelope.type, self.owner)
            response = Reply(ok=False, error=f"{envelope.type} failed: {exc}")
        if not isinstance(response, (Reply, Answer)):
            response = Reply(ok=False, error=f"{envelope.type} handler returned no reply")
        corr = envelope.corr
        try:
            frame = self._frame("response", corr, response)
        except (SchemaError, FrameError) as exc:
            # The answer cannot go on the wire (too large, not encodable); the peer still gets
            # a response instead of a timeout, and the reader survives.
            log.warning("response to %s from %s cannot be sent: %s", envelope.type, self.owner, exc)
            failure = Reply(ok=False, error=f"{envelope.type} response could not be encoded")
            frame = self._frame("response", corr, failure)
        if corr in self._replies:
            self._replies[corr] = frame
        await self._write_quietly(corr, frame)

    async def _write_quietly(self, corr: str, frame: bytes) -> None:
        try:
            await self._write(frame)
        except ChannelClosed:
            log.debug("could not reply to %s on %s: closed", corr, self.owner)

    # -- closing ----------------------------------------------------------------------------

    def _mark_closed(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = reason
        for corr, pending in list(self._pending.items()):
            if not pending.done.is_set():
                pending.error = ChannelClosed(
                    f"{pending.type} request to {self.owner} rejected: {self.close_reason}"
                )
                pending.done.set()
            self._pending.pop(corr, None)
        if self._cancel is not None:
            self._cancel.cancel()

    def close(self, reason: str = "closed") -> None:
        """Close now: reject every pending request and stop :meth:`serve`."""
        self._mark_closed(reason)

    async def aclose(self, reason: str = "closed") -> None:
        """Close and release the stream."""
        self._mark_closed(reason)
        with trio.CancelScope(shield=True):
            await self.stream.aclose()

    def statistics(self) -> dict[str, Any]:
        """Counters for diagnostics: drops by reason, pending requests, flag state."""
        return {
            "drops": dict(self.drops),
            "pending": len(self._pending),
            "flagged": self.flagged,
            "closed": self.closed,
        }
