"""What a child sends its supervisor: activity and turn results, and requests to serve.

A :class:`ChildRequests` belongs to one run (a :class:`Requester`): its channel
hands every event and request here. Questions wait on the parent; nested spawns, ownership
and the paper are the supervisor's services. A ``wake`` event (a builtin child's background
shell matched its watch while no turn ran) becomes a prompt when the child is idle.
"""

import contextlib
from collections.abc import Sequence
from typing import Protocol

import attrs
import trio

import ipc
from orchestrator._errors import UsageError
from orchestrator._records import TERMINAL, ChildRecord, State, clip
from orchestrator.core._evidence import TurnEvidence
from orchestrator.core._loops import LoopWatch, answer
from orchestrator.governance._diagnostics import RunLog
from orchestrator.governance._loopgate import Trip
from orchestrator.governance._watchdog import Watchdog

__all__ = ["HEARTBEATS", "ChildRequests", "Question", "Requester", "Turn"]

HEARTBEATS = frozenset({"tool_start", "tool_update", "message"})
#: The prompt a child's own ``wake`` starts; the child shows its model the note before it.
WAKE_PROMPT = "A background shell needs your attention (its note is above): act on it and report."
#: Wakes honoured per run: a child cannot keep itself busy for ever on its own say-so.
MAX_WAKES = 100


@attrs.define(eq=False)
class Question:
    """A question a child asked its parent (``q<N>``)."""

    id: str
    key: str
    text: str
    answered: trio.Event = attrs.Factory(trio.Event)
    answer: str | None = None


@attrs.define(eq=False)
class Turn:
    """One prompt (or side question) sent to the child, resolved by its ``settled`` frame."""

    number: int
    side: bool
    settled: trio.Event = attrs.Factory(trio.Event)
    result: ipc.Settled | None = None


class Requester(Protocol):
    """The run whose channel this serves, and the supervisor's services bound to it."""

    @property
    def key(self) -> str: ...
    @property
    def record(self) -> ChildRecord: ...
    @property
    def log(self) -> RunLog: ...
    @property
    def watchdog(self) -> Watchdog: ...
    @property
    def turn(self) -> Turn | None: ...
    def queue_prompt(self, text: str) -> None: ...
    @property
    def side_turn(self) -> Turn | None: ...
    def dropped_settled(self, body: ipc.Settled, reason: str) -> None: ...
    async def nested_spawn(self, body: ipc.Spawn) -> ipc.Message: ...
    def take_ownership(self, paths: Sequence[str]) -> ipc.Message: ...
    async def discuss(self, body: ipc.Discuss) -> ipc.Message: ...
    def new_question(self, text: str) -> Question: ...
    def drop_question(self, qid: str) -> None: ...
    def notify_question(self, question: Question) -> None: ...
    def on_usage(self, usage: ipc.Usage) -> None: ...
    def session_spent(self) -> bool: ...
    def resumable(self, resume_id: str) -> None: ...
    def on_loop(self, trip: Trip, *, steer: bool) -> None: ...


@attrs.define(eq=False)
class ChildRequests:
    """Serves one run's channel: events update the record, requests get their reply."""

    run: Requester
    loops: LoopWatch = attrs.Factory(LoopWatch)
    evidence: TurnEvidence = attrs.Factory(TurnEvidence)
    _wakes: int = 0
    _wake_after_turn: bool = False

    async def on_event(self, envelope: ipc.Envelope) -> None:
        body = envelope.body
        if isinstance(body, ipc.Event):
            self._activity(body)
        elif isinstance(body, ipc.Settled):
            target = self.run.side_turn if body.side else self.run.turn
            if target is None or target.number != body.turn or target.settled.is_set():
                self.run.dropped_settled(body, "no such turn is running")
                return
            target.result = body
            target.settled.set()

    def check_tool(self, event: ipc.Event) -> ipc.Message:
        """A builtin agent's ``tool_start`` before the call runs, or its ``tool_end`` before its
        next model step (on the reader): the loop gate's answer (:func:`._loops.answer`)."""
        if event.activity == "tool_start":
            trip = self.loops.check(event)
        elif event.activity == "tool_end":
            trip = self.loops.observe(event)
        else:
            return ipc.Reply(ok=False, error="only a tool_start or a tool_end is checked")
        self._record(event)
        self.evidence.on_event(event)
        if trip is not None:
            # A refused call needs no steer; a result's trip (failures) is steered.
            self._looping(trip, steer=event.activity == "tool_end")
        return answer(trip, refuse=event.activity == "tool_start")

    def _looping(self, trip: Trip, *, steer: bool) -> None:
        self.run.record.touch(self.loops.activity)
        self.run.log.write(f"fleet: {trip.line}")
        self.run.on_loop(trip, steer=steer)

    def _activity(self, event: ipc.Event) -> None:
        trip = self.loops.observe(event)
        self._record(event)
        self.evidence.on_event(event)
        if trip is not None:
            self._looping(trip, steer=True)

    def _record(self, event: ipc.Event) -> None:
        record = self.run.record
        if event.resume_id:
            self.run.resumable(event.resume_id)
        if event.activity in HEARTBEATS:
            self.run.watchdog.heartbeat()
        if event.progress is not None:
            progress = event.progress
            record.progress = {
                "done": progress.done,
                "total": progress.total,
                "current": progress.current,
                "next": list(progress.next[:3]),
            }
        if event.usage is not None:
            self.run.on_usage(event.usage)  # the ledger checks it and sets the record's spend
        if self.loops.activity:
            record.touch()  # looping: peek keeps saying so until a call that does not trip
        elif event.activity in {"tool_start", "tool_update"}:
            record.touch(clip(f"{event.tool} {event.text}".strip(), 120))
        elif event.activity == "message" and event.text:
            record.touch(clip(event.text.splitlines()[0] if event.text else "", 120))
        elif event.activity == "todo" and record.progress.get("current"):
            record.touch(clip(f"todo: {record.progress['current']}", 120))
        elif event.activity == "status" and event.text.startswith("starting "):
            record.touch(clip(event.text, 120))  # a CLI backend boots: "starting pi"
        elif event.activity == "status" and event.text == "started":
            side = self.run.side_turn is not None
            record.touch("answering a side question" if side else "working")
        else:
            record.touch()
        if event.activity == "wake":
            self._wake()

    def _wake(self) -> None:
        """An idle child gets :data:`WAKE_PROMPT`; a paused one waits for its parent."""
        state = self.run.record.state
        if self._wakes >= MAX_WAKES or self.run.session_spent():
            return  # a spent session starts no new turn, not even a wake
        if state is State.IDLE:
            self._wakes += 1
            with contextlib.suppress(UsageError):  # it is ending
                self.run.queue_prompt(WAKE_PROMPT)
        elif state in {State.WORKING, State.WAITING} and not self.run.record.queued:
            # Sent as its turn ended (a queued prompt would show the note anyway).
            self._wake_after_turn = True

    def turn_ended_idle(self) -> None:
        """The run's turn left the child idle: a wake that raced that turn's end wakes it now."""
        if self._wake_after_turn:
            self._wake_after_turn = False
            self._wake()

    async def handle(self, envelope: ipc.Envelope) -> ipc.Message:
        body = envelope.body
        if isinstance(body, ipc.Question):
            return await self._question(body.text)
        if isinstance(body, ipc.Spawn):
            return await self.run.nested_spawn(body)
        if isinstance(body, ipc.Ownership):
            return self.run.take_ownership(body.paths)
        if isinstance(body, ipc.Discuss):
            return await self.run.discuss(body)
        if isinstance(body, ipc.Proxy):
            return ipc.Reply(ok=False, error=f"no parent tool {body.tool!r} is offered here")
        return ipc.Reply(ok=False, error=f"{envelope.type} is not a request the supervisor serves")

    async def _question(self, text: str) -> ipc.Message:
        question = self.run.new_question(text)
        record = self.run.record
        prior = record.state
        record.state = State.WAITING
        record.question = question.id
        record.touch(clip(f"asks: {text}", 120))
        self.run.watchdog.pause_for_question()
        self.run.notify_question(question)
        try:
            await question.answered.wait()
        finally:
            self.run.watchdog.resume_after_question()
            self.run.drop_question(question.id)
            record.question = None
            if record.state is State.WAITING:
                record.state = prior if prior not in TERMINAL else record.state
                record.touch("answered")
        if question.answer is None:
            return ipc.Reply(ok=False, error="the question was cancelled")
        return ipc.Answer(question=question.id, text=question.answer)
