"""The notifier: settle notes in, events out to each receiver, never blocking the supervisor."""

import dataclasses
import math
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

from orchestrator._config import NotifyConfig
from orchestrator._records import ChildRecord
from orchestrator.notify._events import Event, Scrub, event_for, needs_input
from orchestrator.notify._receivers import desktop_argv, post_webhook, run_command

#: Events waiting per receiver; a full queue drops the newest and counts it.
QUEUE: Final = 64
#: First pause between webhook attempts (doubled each time).
BACKOFF_S: Final = 0.5

Deliver = Callable[[Event], Awaitable[None]]


@dataclasses.dataclass(eq=False)
class _Receiver:
    name: str
    deliver: Deliver
    attempts: int
    send: trio.MemorySendChannel[Event]
    receive: trio.MemoryReceiveChannel[Event]
    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    last_error: str = ""

    async def run(self) -> None:
        async for event in self.receive:
            for attempt in range(self.attempts):
                try:
                    await self.deliver(event)
                except (OSError, trio.TooSlowError, ValueError) as exc:
                    self.last_error = f"{type(exc).__name__}: {exc}"[:200]
                    if attempt + 1 < self.attempts:
                        await trio.sleep(BACKOFF_S * 2**attempt)
                    continue
                self.delivered += 1
                break
            else:
                self.failed += 1


@dataclasses.dataclass(eq=False)
class Notifier:
    """Turns settle notes into events for people; :meth:`start` runs its receivers."""

    config: NotifyConfig
    session: str
    #: Redacts every secret the supervisor holds (``SecretSet.scrub``).
    scrub: Scrub
    #: Whether question *id* is still open (the supervisor's question table).
    is_open: Callable[[str], bool] = lambda _qid: True
    receivers: list[_Receiver] = dataclasses.field(default_factory=list)
    _nursery: trio.Nursery | None = None

    def __post_init__(self) -> None:
        config = self.config
        timeout = config.timeout_s or math.inf
        if config.command:
            argv = config.command

            async def command(event: Event) -> None:
                await run_command(argv, event, limit_s=timeout)

            self._add("command", command, 1)
        if config.webhook:
            url = config.webhook

            async def webhook(event: Event) -> None:
                await post_webhook(url, event, limit_s=timeout)

            self._add("webhook", webhook, 1 + int(config.retries))
        if config.desktop:

            async def desktop(event: Event) -> None:
                argv = desktop_argv(event)
                if argv:
                    await run_command(argv, event, limit_s=timeout)

            self._add("desktop", desktop, 1)

    def _add(self, name: str, deliver: Deliver, attempts: int) -> None:
        send, receive = trio.open_memory_channel[Event](QUEUE)
        self.receivers.append(_Receiver(name, deliver, max(1, attempts), send, receive))

    def start(self, nursery: trio.Nursery) -> None:
        """Run each receiver's queue in *nursery* (the supervisor's)."""
        self._nursery = nursery
        for receiver in self.receivers:
            nursery.start_soon(receiver.run)

    def emit(self, event: Event) -> None:
        """Queue *event* for every receiver without waiting; a full queue drops it (counted)."""
        if event["kind"] not in self.config.events:
            return
        for receiver in self.receivers:
            try:
                receiver.send.send_nowait(event)
            except trio.WouldBlock:
                receiver.dropped += 1

    def note(
        self,
        record: ChildRecord,
        *,
        report: str = "",
        error: str = "",
        question: tuple[str, str] | None = None,
        failure: bool = False,
    ) -> None:
        """One settle note (as ``Notes.push`` takes it): an event now, or for a question one
        after ``needs_input_after_s`` if nobody has answered it by then."""
        if not self.receivers:
            return
        if question is None:
            self.emit(
                event_for(
                    record,
                    session=self.session,
                    report=report,
                    error=error,
                    failure=failure,
                    scrub=self.scrub,
                )
            )
        elif self._nursery is not None and "needs-input" in self.config.events:
            self._nursery.start_soon(self._unanswered, record, question)

    async def _unanswered(self, record: ChildRecord, question: tuple[str, str]) -> None:
        after = self.config.needs_input_after_s
        await trio.sleep(after)
        if self.is_open(question[0]):
            self.emit(
                needs_input(
                    record, session=self.session, question=question, after_s=after, scrub=self.scrub
                )
            )

    def counts(self) -> dict[str, Any]:
        """Per receiver: delivered, failed (after every retry), dropped (queue full)."""
        return {
            r.name: {
                "delivered": r.delivered,
                "failed": r.failed,
                "dropped": r.dropped,
                "last_error": r.last_error,
            }
            for r in self.receivers
        }
