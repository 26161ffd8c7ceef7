"""The loop gate, wired: one :class:`~orchestrator.governance._loopgate.LoopGate` per child run,
fed from the child's event stream, and what the supervisor does when it trips.

Every backend's ``tool_start`` carries a digest of the call's input and its ``tool_end`` a
digest of the output and ``failed``; this module turns them into the gate's calls and results.

How a trip is enforced:

- **The builtin agent** asks before it runs a tool, and again before its next model step:
  its ``tool_start`` and ``tool_end`` come as *requests* (an :class:`ipc.Event` body) rather
  than events, answered on the channel's reader by :meth:`LoopWatch.check` and
  :meth:`LoopWatch.observe` — the gate is pure, so the answer needs no task and keeps frame
  order with the events behind and ahead of it. A tripped call is refused: the reply carries
  the gate's line and the agent returns it as the call's error result, so the model reads why.
  The trip that stops the child says so in the same reply (:func:`answer`): the agent asks its
  model nothing more and waits for the supervisor's abort, so no model request leaves a child
  the gate has stopped (the stop itself runs in a task; a child told only "refused" raced it
  to its next model request and sometimes won). The gate stays in the supervisor (a child
  may not import ``orchestrator``, and a rule the child kept for itself would be the child's
  to break); the child flushes its buffered events before it asks, so the previous call's
  result is counted first.
- **CLI backends** (pi, claude, codex) run their tools themselves: the supervisor sees the
  ``tool_start`` as it happens and steers the child with the gate's one line, as
  ``fleet steer`` would. Three failures in a row are only known once a result is in, so that
  trip steers every backend, the builtin one included.

While tripped, ``peek`` shows the activity ``looping: …`` with the line, until the child makes
a call that does not trip, or the parent sends a new prompt (which also gives the gate a fresh
budget of two interventions). The trip past the budget stops the child with an ``incomplete``
handoff that says why.
"""

import logging
from typing import Protocol

import attrs
import trio

import ipc
from orchestrator._errors import OperationFailed, UsageError
from orchestrator._records import ChildRecord
from orchestrator.governance._loopgate import LoopGate, Trip

__all__ = ["Intervener", "LoopWatch", "answer", "intervene"]

log = logging.getLogger("orchestrator")

LOOPING = "looping"


@attrs.define(eq=False)
class LoopWatch:
    """One run's loop gate, and whether the child is looping now (for ``peek``)."""

    gate: LoopGate = attrs.Factory(LoopGate)
    #: ``peek``'s activity while tripped; ``""`` when not.
    activity: str = ""

    def new_prompt(self) -> None:
        """The parent sent a prompt: the gate's history and budget start over."""
        self.gate.new_prompt()
        self.activity = ""

    def check(self, start: ipc.Event) -> Trip | None:
        """A builtin agent's call, before it runs: a :class:`Trip` refuses it."""
        return self._call(start, blocking=True)

    def observe(self, event: ipc.Event) -> Trip | None:
        """An event as it arrives: a CLI backend's call, or any backend's result."""
        if event.activity == "tool_start":
            return self._call(event, blocking=False)
        if event.activity == "tool_end" and (event.output_digest or event.failed):
            return self._tripped(
                self.gate.on_result(event.tool, event.output_digest, failed=event.failed)
            )
        return None

    def _call(self, start: ipc.Event, *, blocking: bool) -> Trip | None:
        if not start.input_digest:
            return None  # a backend that cannot say what it called: nothing to compare
        trip = self.gate.on_call(start.tool, start.input_digest, blocking=blocking)
        if trip is None:
            self.activity = ""
        return self._tripped(trip)

    def _tripped(self, trip: Trip | None) -> Trip | None:
        if trip is not None:
            self.activity = f"{LOOPING}: {trip.line.removeprefix('loop gate: ')}"
        return trip


def answer(trip: Trip | None, *, refuse: bool) -> ipc.Reply:
    """The reply to a builtin agent's checked event: ``refused`` (a ``tool_start``: the call
    does not run) with the gate's line, and ``stop`` when the trip stops the child."""
    if trip is None:
        return ipc.Reply(ok=True)
    data: dict[str, str | bool] = {"refused": trip.line} if refuse else {}
    if trip.stop:
        data["stop"] = trip.line
    return ipc.Reply(ok=True, data=data)


class Intervener(Protocol):
    """The run a trip acts on."""

    @property
    def record(self) -> ChildRecord: ...
    async def steer(self, text: str) -> None: ...
    async def stop_incomplete(self, reason: str) -> None: ...


async def intervene(run: Intervener, watch: LoopWatch, trip: Trip, *, steer: bool) -> None:
    """Act on *trip*: stop the child past the budget, else steer it (when *steer*; a refused
    builtin call needs nothing more)."""
    if trip.stop:
        # Shielded: the stop ends the run whose nursery this task runs in.
        with trio.CancelScope(shield=True):
            await run.stop_incomplete(trip.line)
        return
    if steer:
        try:
            await run.steer(trip.line)
        except (UsageError, OperationFailed) as exc:
            log.info("loop gate: %s could not be steered: %s", run.record.key, exc)
    if watch.activity:
        run.record.touch(watch.activity)
