"""This side's requests in flight: correlation ids, deadlines, and the responses that fill them.

A :class:`Requests` belongs to one :class:`ipc.Channel`. :meth:`Requests.call` writes a
request's frame and parks its task on a :class:`~ipc._handoff.Pending` slot until the response
arrives (:meth:`Requests.deliver`, from the reader), its deadline passes, or the channel closes
(:meth:`Requests.reject_all`). While the channel serves, one deadline keeper task
(:meth:`Requests.keep_deadlines`) times out every request whose deadline has passed (a cancel
scope per request cost a tenth of a round trip); before it runs, each request carries its own
scope.

A request that timed out or was cancelled is remembered for a while: its response may still
come, and a late response is discarded without counting as an invalid frame (a slow peer is not
a hostile one).
"""

import collections
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Final

import attrs
import trio

from ipc._errors import ChannelClosed, RemoteError, RequestTimeout
from ipc._handoff import Pending
from ipc._types import Message, Reply

log = logging.getLogger("ipc")

DEFAULT_TIMEOUT: Final = 5.0
MIN_TIMEOUT: Final = 0.001
MAX_TIMEOUT: Final = 120.0

REPLAY_CACHE: Final = 256
"""Responses remembered for replayed request ids (and our expired ids, on the other side)."""
RESPONSE_TYPES: Final = frozenset({"reply", "answer"})


def check_timeout(timeout: float) -> float:
    """Validate a request deadline against the allowed range (1 ms to 120 s)."""
    if not (MIN_TIMEOUT <= timeout <= MAX_TIMEOUT) or math.isnan(timeout):
        raise ValueError(
            f"request deadline {timeout!r} s is outside {MIN_TIMEOUT}..{MAX_TIMEOUT} s"
        )
    return timeout


@attrs.define(eq=False)
class Requests:
    """The requests one channel has sent and not yet seen answered, by correlation id."""

    # The channel's peer, for error messages.
    owner: str
    # The channel's frame writer (in order, one writer at a time).
    write: Callable[[bytes], Awaitable[bool]]
    # The channel's socket lent to a requester (ipc._lending): take_socket says whether this
    # requester may read its own response, read_for then waits for it there, and interrupt
    # wakes it when its deadline passes.
    take_socket: Callable[[], bool] = lambda: False
    read_for: Callable[[Pending], Awaitable[None]] | None = None
    interrupt: Callable[[], None] = lambda: None
    # Responses handed to a requester so far (the reader lends the socket after one), and
    # how many of them a requester woken by the reader had seen when it last ran.
    delivered: int = attrs.field(default=0, init=False)
    resumed: int = attrs.field(default=0, init=False)
    _pending: dict[str, Pending] = attrs.field(factory=dict, init=False)
    _corr: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    # corrs of our requests that gave up waiting; a late response to one is not a drop.
    _expired: collections.OrderedDict[str, None] = attrs.field(
        factory=collections.OrderedDict, init=False
    )
    # The deadline keeper's sleep, due at the earliest deadline it enforces (while serving),
    # and the run's clock (trio.current_time() is three calls deep).
    _timer: trio.CancelScope | None = attrs.field(default=None, init=False)
    _clock: trio.abc.Clock = attrs.field(init=False)

    @property
    def in_flight(self) -> int:
        """How many requests wait for their response."""
        return len(self._pending)

    def new_corr(self) -> str:
        """The correlation id of the next request."""
        return str(next(self._corr))

    async def call(self, kind: str, corr: str, frame: bytes, deadline: float) -> Message:
        """Write *frame* (the request *corr* of type *kind*) and return the response body.

        Waits *deadline* seconds at most (``math.inf``: without a deadline). Raises
        :class:`RequestTimeout`, :class:`ChannelClosed`, or :class:`RemoteError` for an error
        :class:`Reply`.
        """
        pending = Pending(type=kind)
        self._pending[corr] = pending
        try:
            await self.write(frame)
            timer = self._timer
            if pending.done:  # answered, closed or timed out while the write waited
                pass
            elif timer is None or deadline == math.inf:
                with trio.move_on_after(deadline):
                    await pending.wait()
            else:
                # The deadline keeper times this request out: one cancel scope per channel
                # instead of one per request, which cost a tenth of a round trip. Moving the
                # keeper's deadline is itself costly, so only an earlier one does.
                pending.deadline = self._clock.current_time() + deadline
                if pending.deadline < timer.deadline:  # noqa: PLR1730 - min() would always set it
                    timer.deadline = pending.deadline
                if self.read_for is not None and self.take_socket():
                    # No reader hand-off: this task reads the socket until its response comes.
                    pending.lent = True
                    await self.read_for(pending)
                else:
                    await pending.wait()
                    self.resumed = self.delivered
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

    async def keep_deadlines(self) -> None:
        """While the channel serves: time out every request whose deadline has passed."""
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
                        if pending.lent:  # parked on the socket: wake it
                            self.interrupt()
        finally:
            self._timer = None

    def deliver(self, corr: str, type_: str, body: Message) -> bool:
        """A response arrived: fill its pending request, or let a late one go.

        ``False`` when it answers no request of ours (the channel drops it).
        """
        if corr in self._expired:
            del self._expired[corr]
            log.debug("late response %s from %s discarded", corr, self.owner)
            return True
        pending = self._pending.get(corr)
        if pending is None or type_ not in RESPONSE_TYPES or pending.done:
            return False
        pending.finish(body)
        self.delivered += 1
        return True

    def reject_all(self, reason: str) -> None:
        """The channel closed for *reason*: every waiting request raises :class:`ChannelClosed`."""
        for pending in self._pending.values():
            pending.finish(
                error=ChannelClosed(f"{pending.type} request to {self.owner} rejected: {reason}")
            )
        self._pending.clear()
