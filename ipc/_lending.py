"""The channel's socket lent by its reader to a requester, which then reads its own response.

A round trip through the reader costs a wake-up on each side of the hand-off: the reader
wakes for the response and reschedules the requester, which runs in the next scheduler pass
(between two processes that pass is paid several times over, see docs/performance.md). So
when the reader has just woken a requester, it yields once before reading again, with the
socket *lendable*; a requester that asks again at once takes it (:meth:`Lending.take`) and
reads until its response comes (:meth:`Lending.read_for`), while the reader parks
(:meth:`Lending.park`). In a loop of requests the socket stays lent, and every round trip
after the first is one wake-up on this side.

The lender reads exactly as the reader does: the same decoder, the same routing (token,
owner, replay cache, drops, immediate answers written at once), the same close and framing
rules. Only what the reader must await (an event handler, the rest of an answer the socket
did not take whole) it does not do: that work and every frame after
it are left to the reader, in order, and the lender waits for its response as usual. Its
deadline is kept by the deadline keeper, which wakes it on a duplicate of the descriptor
that only lenders wait on (:mod:`ipc._lendwait`). The lender
gives the socket back however it leaves: answered, timed out, cancelled, or closed.

A node link's reader reads for a channel the same way (:meth:`Lending.route_for`): while the
channel's reader waits on a stream of the link with nothing buffered, the link's reader
decodes and routes the stream's bytes itself, and leaves the reader only what must be awaited,
with every frame after it, in order (:attr:`Lending.handed_over`).
"""

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
import trio

from ipc._errors import FrameError
from ipc._framing import FrameDecoder
from ipc._handoff import Pending
from ipc._transport import LENDABLE, Transport

Route = Callable[[bytes], Awaitable[object] | None]
Settle = Callable[[Awaitable[object]], Awaitable[None]]


class Reading(Protocol):
    """What a lender reads and calls of its channel (:class:`ipc.Channel` is the one kind)."""

    owner: str
    closed: bool
    flagged: bool

    def _mark_closed(self, reason: str) -> None:
        """Close the channel for *reason*: pending requests rejected, serve stopped."""


@attrs.define(eq=False)
class Lending:
    """One channel's lending state, for one run of its reader at a time."""

    io: Transport
    log: Any
    # Set while the channel serves: the reader's decoder and routing.
    decoder: FrameDecoder | None = None
    route: Route | None = None
    # The reader is between reads with nothing left to route: a requester may take it.
    lendable: bool = False
    # A requester has the socket; the reader parks.
    lent: bool = False
    # The link's reader left work or frames, and woke the reader (route_for).
    handed_over: bool = False
    reads: int = 0
    """Requests whose task read its own response."""
    _reader: trio.lowlevel.Task | None = None
    # What a lender read but left to the reader: the work to await first, then the frames.
    _work: Awaitable[object] | None = None
    _frames: list[bytes] = attrs.Factory(list)

    @property
    def backlog(self) -> bool:
        """Whether a lender left work or frames for the reader."""
        return self._work is not None or bool(self._frames)

    def take(self) -> bool:
        """Lend the socket to the calling requester, if the reader can spare it now."""
        if not self.lendable:
            return False
        self.lendable = False
        self.lent = True
        return True

    async def park(self) -> None:
        """The reader waits here while the socket is lent."""
        self._reader = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._forget_reader)

    def _forget_reader(self, _: Any) -> trio.lowlevel.Abort:
        self._reader = None
        return trio.lowlevel.Abort.SUCCEEDED

    async def route_backlog(self, settle: Settle) -> None:
        """The reader routes what a lender left, in order: its work first, then its frames."""
        route = self.route
        work, self._work = self._work, None
        frames, self._frames = self._frames, []
        if work is not None:
            await settle(work)
        if route is not None:
            for frame in frames:
                if (more := route(frame)) is not None:
                    await settle(more)

    def stop(self) -> None:
        """The reader ends: nothing is lent any more, leftover work is dropped."""
        self.lendable = False
        self.handed_over = False
        self.route = None
        work, self._work = self._work, None
        self._frames = []
        close = getattr(work, "close", None)
        if close is not None:  # a coroutine that will never run now
            close()

    async def read_for(self, channel: Reading, pending: Pending) -> None:
        """Read the socket until *pending* is answered, timed out, or the channel closes.

        The deadline keeper times *pending* out as any other request and then wakes this
        task through the transport's ``interrupt_lender`` (a cancel scope per request would
        cost more than the hand-off saved).
        """
        io, decoder, route = self.io, self.decoder, self.route
        if decoder is None or route is None or not isinstance(io, LENDABLE):
            raise RuntimeError("the socket was lent while the channel was not serving")
        self.reads += 1
        try:
            while not pending.done:
                try:
                    await io.lend_wait()
                    data = io.read()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    if not pending.done:  # else: woken by the deadline keeper, or a close
                        channel._mark_closed("connection lost")
                    break
                if data is None:
                    continue
                if not data:
                    channel._mark_closed("peer closed")
                    break
                try:
                    frames = decoder.feed(data)
                except FrameError as exc:
                    self.log.warning("closing channel %s: %s", channel.owner, exc)
                    channel.flagged = True
                    channel._mark_closed("framing error")
                    break
                if self._route_now(route, frames):
                    break
        finally:
            pending.lent = False
            self.lent = False
            self.lendable = not self.backlog and not channel.closed
            reader, self._reader = self._reader, None
            if reader is not None:
                trio.lowlevel.reschedule(reader)
        if not pending.done:
            await pending.wait()  # the reader routes the rest; the keeper keeps the deadline

    def route_for(self, channel: Reading, data: bytes) -> bool:
        """Route *data*, read for the channel's parked reader by another task (a node link's
        reader, :class:`ipc._transport.MuxIO`), as the reader would; ``True`` when the
        reader must take over: work to await was left, or the channel closed.

        It runs on that other task, for every stream of its link, so it never raises: a
        failure is this channel's alone (logged, the channel closed).
        """
        decoder, route = self.decoder, self.route
        if decoder is None or route is None or channel.closed:
            return True
        try:
            if self._route_now(route, decoder.feed(data)):
                self.handed_over = True
                return True
        except FrameError as exc:
            self.log.warning("closing channel %s: %s", channel.owner, exc)
            channel.flagged = True
            channel._mark_closed("framing error")
            return True
        except Exception:
            self.log.exception("routing a frame from %s failed", channel.owner)
            channel._mark_closed("routing failed")
            return True
        return channel.closed

    def _route_now(self, route: Route, frames: list[bytes]) -> bool:
        """Route *frames* until one needs awaiting; ``True`` if the reader must take over."""
        for index, frame in enumerate(frames):
            if (work := route(frame)) is not None:
                self._work = work
                self._frames = frames[index + 1 :]
                return True
        return False
