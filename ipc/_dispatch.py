"""What a channel's reader does with each whole frame: check it, then deliver it.

A :class:`Dispatch` lives for one run of :meth:`ipc.Channel.serve`. For each frame it decodes
and checks the envelope (token in constant time, owner), then:

- a **response** goes to the request of its correlation id (:mod:`ipc._requests`; the
  requester wakes);
- an **event** is handed back to the reader, which awaits ``on_event`` in order;
- a **request** is answered from the replay cache if its id was seen, else by the *immediate*
  handler on the reader (a plain function: it cannot await, so it cannot stall the reader),
  else by the async *handler* in the worker task, or in a task of its own while the worker is
  busy — so a slow handler never blocks the reader or the requests behind it.

Invalid frames are dropped through the channel's drop policy. Routing is a plain function
call per frame: only work that must be awaited on the reader (an event handler, a write) is
returned as an awaitable, because a coroutine per frame cost more than the routing itself.

A dispatch sees its channel only as a :class:`Connection`, the few parts of
:class:`ipc.Channel` it reads and calls, so this module does not import :mod:`ipc._channel`
(which imports it).
"""

import collections
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from ipc._errors import ChannelClosed, FrameError, SchemaError
from ipc._handoff import Worker
from ipc._messages import Decoded, FrameWriter, decode_frame
from ipc._requests import REPLAY_CACHE, RESPONSE_TYPES
from ipc._types import PROTOCOL_VERSION, Answer, Envelope, Message, Reply

log = logging.getLogger("ipc")

RequestHandler = Callable[[Envelope], Awaitable[Message]]
EventHandler = Callable[[Envelope], Awaitable[None]]
ImmediateHandler = Callable[[Message], Message | None]
"""Answers a request body on the reader itself, or returns ``None`` to pass it on."""


def no_immediate(body: Message) -> None:
    """The default immediate handler: every request goes to the async handler."""


class Connection(Protocol):
    """What a dispatch reads and calls of its channel (:class:`ipc.Channel` is the one kind)."""

    owner: str
    closed: bool
    _token_bytes: bytes
    _writer: FrameWriter

    async def _write(self, frame: bytes) -> bool:
        """Write one whole frame, in order behind the frames already queued."""

    def _answer_now(self, frame: bytes) -> Awaitable[object] | None:
        """Write an answer now if it can go out whole; else what is left to await."""

    def _drop(self, reason: str, detail: str) -> None:
        """Count an invalid frame; enough of them close the channel."""


@attrs.define(eq=False)
class Dispatch:
    """Routes the frames of one channel to its requesters and handlers."""

    channel: Connection
    # Hands a response to the request it answers; False if it answers none of ours.
    deliver: Callable[[str, str, Message], bool]
    handler: RequestHandler
    on_event: EventHandler
    immediate: ImmediateHandler
    nursery: trio.Nursery
    worker: Worker[Envelope] = attrs.field(init=False)
    # corr -> the encoded response frame, or None while the handler still runs.
    _replies: collections.OrderedDict[str, bytes | None] = attrs.field(
        factory=collections.OrderedDict, init=False
    )

    @worker.default
    def _make_worker(self) -> Worker[Envelope]:
        return Worker(run_job=self._run_handler)

    def route(self, frame: bytes) -> Awaitable[object] | None:
        """Check one frame and deliver it; what is left for the reader to await, if anything.

        A response is handed to its requester here; an event comes back as the work to await;
        a replayed request's or an immediate answer goes out at once if it can (else the rest
        of its write is the work to await); any other request goes to the worker or a task of
        its own.
        """
        channel = self.channel
        if channel.closed:  # frames after a close-worthy drop are ignored
            return None
        try:
            parts = decode_frame(frame)
        except SchemaError as exc:
            channel._drop(exc.reason, exc.path)
            return None
        token, owner, corr, kind, type_, body = parts
        # ipc._auth.tokens_match, inline: a call fewer per frame.
        if not hmac.compare_digest(token.encode("utf-8", "surrogatepass"), channel._token_bytes):
            channel._drop("token", "$.token")
            return None
        if owner != channel.owner:
            channel._drop("owner", "$.owner")
            return None
        if kind == "response":
            if not self.deliver(corr, type_, body):
                channel._drop("corr", "$.corr")
            return None
        if type_ in RESPONSE_TYPES:
            channel._drop("type", "$.type")
            return None
        if kind == "event":
            return self._event(_envelope(parts))
        replies = self._replies
        if corr in replies:
            recorded = replies[corr]
            if recorded is None:  # still running: its response goes out once
                return None
            return channel._answer_now(recorded)
        replies[corr] = None  # running: a replay meanwhile gets nothing, then the response
        if len(replies) > REPLAY_CACHE:
            replies.popitem(last=False)
        try:
            response = self.immediate(body)
        except Exception as exc:
            log.exception("handler for %s from %s failed", type_, channel.owner)
            response = Reply(ok=False, error=f"{type_} failed: {exc}")
        if response is not None:
            return channel._answer_now(self._response_frame(corr, type_, response))
        # Built only for the async handler: an immediate answer never needs it.
        envelope = _envelope(parts)
        if not self.worker.offer(envelope):
            # The worker is busy (a slow handler, or pipelined requests): a task of its own.
            self.nursery.start_soon(self._run_handler, envelope)
        return None

    async def _event(self, envelope: Envelope) -> None:
        try:
            await self.on_event(envelope)
        except Exception:
            # Like a failing request handler: one bad event must not stop the reader.
            log.exception("event handler for %s from %s failed", envelope.type, envelope.owner)

    async def _run_handler(self, envelope: Envelope) -> None:
        try:
            response = await self.handler(envelope)
        except ChannelClosed:
            return
        except Exception as exc:
            log.exception("handler for %s from %s failed", envelope.type, envelope.owner)
            response = Reply(ok=False, error=f"{envelope.type} failed: {exc}")
        corr = envelope.corr
        try:
            await self.channel._write(self._response_frame(corr, envelope.type, response))
        except ChannelClosed:
            log.debug("could not reply to %s on %s: closed", corr, envelope.owner)

    def _response_frame(self, corr: str, type_: str, response: Message | None) -> bytes:
        """The frame answering request *corr* of *type_*; recorded for replays of *corr*."""
        if not isinstance(response, (Reply, Answer)):
            response = Reply(ok=False, error=f"{type_} handler returned no reply")
        writer = self.channel._writer
        try:
            frame = writer.frame("response", corr, response)
        except (SchemaError, FrameError) as exc:
            # The answer cannot go on the wire (too large, not encodable); the peer still gets
            # a response instead of a timeout, and the reader survives.
            log.warning("response to %s from %s cannot be sent: %s", type_, writer.owner, exc)
            failure = Reply(ok=False, error=f"{type_} response could not be encoded")
            frame = writer.frame("response", corr, failure)
        if corr in self._replies:
            self._replies[corr] = frame
        return frame


def _envelope(parts: Decoded) -> Envelope:
    """The envelope handlers take, from the parts the reader checked."""
    token, owner, corr, kind, type_, body = parts
    return Envelope(
        v=PROTOCOL_VERSION, token=token, owner=owner, corr=corr, kind=kind, type=type_, body=body
    )
