"""What a child sends its supervisor: activity and turn results, and requests to serve.

A :class:`ChildRequests` belongs to one :class:`~orchestrator.core._run.ChildRun`: its channel
hands every event and request here. Questions wait on the parent; nested spawns, ownership
and the paper are the supervisor's services.
"""

from typing import TYPE_CHECKING

import attrs
import trio

import ipc
from orchestrator._records import TERMINAL, State, clip

if TYPE_CHECKING:
    from orchestrator.core._run import ChildRun

__all__ = ["HEARTBEATS", "ChildRequests", "Question"]

HEARTBEATS = frozenset({"tool_start", "tool_update", "message"})


@attrs.define(eq=False)
class Question:
    """A question a child asked its parent (``q<N>``)."""

    id: str
    key: str
    text: str
    answered: trio.Event = attrs.Factory(trio.Event)
    answer: str | None = None


@attrs.define(eq=False)
class ChildRequests:
    """Serves one run's channel: events update the record, requests get their reply."""

    run: "ChildRun"

    async def on_event(self, envelope: ipc.Envelope) -> None:
        body = envelope.body
        if isinstance(body, ipc.Event):
            self._activity(body)
        elif isinstance(body, ipc.Settled):
            target = self.run.side_turn if body.side else self.run.turn
            if target is None or target.number != body.turn or target.settled.is_set():
                self.run.log.write(f"ignored a late settled frame for turn {body.turn}")
                return
            target.result = body
            target.settled.set()

    def _activity(self, event: ipc.Event) -> None:
        record = self.run.record
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
            record.tokens = event.usage.tokens
            if event.usage.cost_usd is not None:
                record.cost_usd = event.usage.cost_usd
        if event.activity in {"tool_start", "tool_update"}:
            record.touch(clip(f"{event.tool} {event.text}".strip(), 120))
        elif event.activity == "message" and event.text:
            record.touch(clip(event.text.splitlines()[0] if event.text else "", 120))
        elif event.activity == "todo" and record.progress.get("current"):
            record.touch(clip(f"todo: {record.progress['current']}", 120))
        else:
            record.touch()

    async def handle(self, envelope: ipc.Envelope) -> ipc.Message:
        body = envelope.body
        if isinstance(body, ipc.Question):
            return await self._question(body.text)
        if isinstance(body, ipc.Spawn):
            return await self.run.sup.nested_spawn(self.run, body)
        if isinstance(body, ipc.Ownership):
            return self.run.sup.take_ownership(self.run, body.paths)
        if isinstance(body, ipc.Discuss):
            return await self.run.sup.discuss_for(self.run, body)
        if isinstance(body, ipc.Proxy):
            return ipc.Reply(ok=False, error=f"no parent tool {body.tool!r} is offered here")
        return ipc.Reply(ok=False, error=f"{envelope.type} is not a request the supervisor serves")

    async def _question(self, text: str) -> ipc.Message:
        question = self.run.sup.new_question(self.run.key, text)
        record = self.run.record
        prior = record.state
        record.state = State.WAITING
        record.question = question.id
        record.touch(clip(f"asks: {text}", 120))
        self.run.watchdog.pause_for_question()
        self.run.sup.notify(record, question=question)
        try:
            await question.answered.wait()
        finally:
            self.run.watchdog.resume_after_question()
            self.run.sup.drop_question(question.id)
            record.question = None
            if record.state is State.WAITING:
                record.state = prior if prior not in TERMINAL else record.state
                record.touch("answered")
        if question.answer is None:
            return ipc.Reply(ok=False, error="the question was cancelled")
        return ipc.Answer(question=question.id, text=question.answer)
