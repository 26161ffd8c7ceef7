"""What the supervisor shows: ``peek``, ``wait``, the notification stream, a child's log,
the moderator brief, and whether it holds anything (a mixin of
:class:`~orchestrator.core._supervisor.Supervisor`, which composes the parts these read).
"""

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from orchestrator._config import Config
from orchestrator._errors import TimedOut
from orchestrator._records import ChildRecord
from orchestrator.batch import Maps
from orchestrator.coordination._brief import Facts, paper_line, render, voting_line
from orchestrator.coordination._democracy import Democracy
from orchestrator.coordination._paper import Paper
from orchestrator.core._budgets import Budgets
from orchestrator.core._capacity import Capacity, Lane
from orchestrator.core._isolation import Worktrees
from orchestrator.core._notes import Notes
from orchestrator.core._registry import Registry
from orchestrator.core._run import ChildRun, Question
from orchestrator.governance._ownership import LockTable
from orchestrator.notify import Notifier

__all__ = ["FleetViews"]


class FleetViews:
    """The supervisor's read side; the attributes are :class:`Supervisor`'s own."""

    config: Config
    registry: Registry
    runs: dict[str, ChildRun]
    notes: Notes
    questions: dict[str, Question]
    mode: str
    capacity: Capacity
    lane: Lane
    stale: list[dict[str, Any]]
    paper: Paper
    worktrees: Worktrees
    democracy: Democracy
    maps: Maps
    notifier: Notifier
    spend: Budgets

    @property
    def locks(self) -> LockTable:
        raise NotImplementedError  # the Supervisor's

    @property
    def paths(self) -> Any:
        raise NotImplementedError  # the Supervisor's

    def all_records(self) -> dict[str, ChildRecord]:
        merged = dict(self.registry.retired)
        merged.update(self.registry.records)
        return merged

    def peek(self, refs: Sequence[str] = ()) -> dict[str, Any]:
        records = [self.registry.find(ref) for ref in refs] if refs else list(self.registry.live())
        return {
            # Oldest first, and first: a child blocked on its parent is what needs it most.
            "questions": [
                {"id": q.id, "key": q.key, "text": q.text} for q in self.questions.values()
            ],
            "session": self.config.session,
            "mode": self.mode,
            "cap": self.capacity.cap,
            "lane": self.lane.statistics(),
            "agents": [r.peek() for r in records],
            "locks": {k: list(v) for k, v in self.locks.snapshot().items()},
            "stale": self.stale,
            "notify": self.notifier.counts(),
            "usage": self.spend.report()["session"],
        }

    async def wait(
        self,
        refs: Sequence[str] = (),
        *,
        every: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - fleet wait --timeout
    ) -> list[dict[str, Any]]:
        keys = [self.registry.find(ref).key for ref in refs]
        result = await self.notes.wait(
            self.all_records(),
            keys,
            every=every,
            timeout=float("inf") if timeout is None else timeout,
        )
        if result is None:
            raise TimedOut(f"wait: nothing settled within {timeout:g} s")
        return result

    async def notifications(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Coalesced settle notifications, forever."""
        async for batch in self.notes.stream(self.all_records()):
            yield batch

    def logs(self, ref: str, tail: int = 8192) -> dict[str, Any]:
        record = self.registry.find(ref)
        path = self.paths.logs / f"{record.key}.log"
        run = self.runs.get(record.key)
        text = run.log.tail if run is not None else ""
        if not text:
            with contextlib.suppress(OSError):
                text = path.read_text(encoding="utf-8", errors="replace")
        return {"key": record.key, "path": str(path), "tail": text[-tail:]}

    async def brief(self) -> str:
        """The moderator brief for this fleet now (``fleet brief``)."""
        lane = self.lane.statistics()
        facts = Facts(
            mode=self.mode,
            used=self.capacity.used,
            cap=self.capacity.cap,
            working=lane["working"],
            lane=lane["capacity"],
            queued=lane["queued"],
            workspace=str(self.config.workspace),
            children=tuple(self.registry.live()),
            questions=tuple((q.id, q.key, q.text) for q in self.questions.values()),
            unread=tuple(dict.fromkeys(note["key"] for note in self.notes.pending)),
            unresolved=tuple(
                r for r in self.registry.retired.values() if r.conflicts or r.remaining
            ),
            paper=await paper_line(self.paper),
            voting=voting_line(self.democracy.current),
        )
        return render(facts)

    def holds_nothing(self) -> bool:
        """Whether nothing would be lost if this supervisor ended now: no live or retained
        child, no unread note, no open question, no unresolved worktree, no vote."""
        return not (
            self.registry.records
            or self.runs
            or self.notes.pending
            or self.questions
            or self.worktrees.unresolved()
            or self.democracy.current is not None
            or self.maps.running()
        )
