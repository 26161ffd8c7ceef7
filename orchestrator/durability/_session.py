"""The session's journal as core sees it: each fact core reports, as one record.

:class:`SessionJournal` implements ``core._journaling.Journal`` over a :class:`Journal`. Spawns,
worktrees, resume ids, questions and handoffs are durable (fsynced when written); a settled
report is clipped as ``wait`` clips it. A state is written only when it changed, and
:meth:`SessionJournal.observe` catches any change no hook reported.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from orchestrator._records import ChildRecord, clip
from orchestrator.durability._format import ENVELOPE
from orchestrator.durability._journal import Journal

__all__ = ["SessionJournal"]

#: A task is kept whole up to this many characters (a revived child shows it in ``peek``).
TASK_CLIP = 4000


def _plain(value: Any) -> Any:
    """Loadout fields as JSON values (a model spec is an attrs object)."""
    if attrs.has(type(value)):
        return attrs.asdict(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@attrs.define(eq=False)
class SessionJournal:
    """Core's journal, written to *journal*."""

    journal: Journal
    _states: dict[str, str] = attrs.Factory(dict)
    _locks: dict[str, tuple[str, ...]] = attrs.Factory(dict)
    #: Every model each child ran on, as last written (a quota fallback adds one).
    _models: dict[str, tuple[str, ...]] = attrs.Factory(dict)
    _pids: dict[str, int] = attrs.Factory(dict)

    def spawned(self, record: ChildRecord, fields: Mapping[str, Any]) -> None:
        loadout = _plain(dict(fields))
        self.journal.append(
            "spawn",
            record.key,
            durable=True,
            name=record.name,
            agent=record.agent,
            mode=record.mode,
            task=clip(record.task, TASK_CLIP),
            workspace=record.workspace,
            backend=record.backend,
            model=loadout.get("model"),
            surface=record.surface,
            workflow_mode=record.workflow_mode,
            depth=record.depth,
            parent=record.parent,
            ownership=loadout.get("ownership", []),
            schema=record.schema,
            budget=record.usage.get("budget") or None,
            role=record.role,
            models=list(record.models),
            loadout=loadout,
        )
        self._states[record.key] = "starting"
        self._models[record.key] = tuple(record.models)
        resume = loadout.get("resume")
        if resume:  # known before the first prompt is sent: the builtin agent's transcript
            self.resumable(record.key, record.backend, str(resume))

    def resumable(self, key: str, backend: str, resume_id: str) -> None:
        self.journal.append("resume", key, durable=True, backend=backend, id=resume_id)

    def worktree(self, key: str, snapshot: Mapping[str, str]) -> None:
        self.journal.append("worktree", key, durable=True, **dict(snapshot))

    def changed(self, record: ChildRecord) -> None:
        state = str(record.state)
        if self._states.get(record.key) != state:
            self._states[record.key] = state
            self.journal.append("state", record.key, durable=True, state=state)
        models = tuple(record.models)
        if self._models.setdefault(record.key, models) != models:
            self._models[record.key] = models  # a revive goes on from the model it was on
            self.journal.append("models", record.key, durable=True, models=list(models))

    def observe(
        self, records: Iterable[ChildRecord], locks: Mapping[str, Sequence[str]] = {}
    ) -> None:
        """Write the state of each of *records*, and each owner's ownership locks, that
        changed since they were last written (a revive re-takes the locks last written), and
        each child's pid once known (a later supervisor checks that process is gone)."""
        for record in records:
            self.changed(record)
            if record.pid and self._pids.get(record.key) != record.pid:
                self._pids[record.key] = record.pid
                self.journal.append("pid", record.key, durable=True, pid=record.pid)
        for key, paths in locks.items():
            if self._locks.get(key) != tuple(paths):
                self._locks[key] = tuple(paths)
                self.journal.append("locks", key, durable=True, paths=list(paths))

    def settled(self, record: ChildRecord, *, report: str, error: str) -> None:
        self._states[record.key] = str(record.state)
        self.journal.append(
            "settled",
            record.key,
            durable=True,
            state=str(record.state),
            turn=record.turn,
            report=clip(report),
            error=clip(error, 400),
        )

    def asked(self, key: str, qid: str, text: str) -> None:
        self._states[key] = "waiting"
        self.journal.append("question", key, durable=True, id=qid, text=clip(text))

    def answered(self, key: str, qid: str, text: str) -> None:
        self.journal.append("answer", key, durable=True, id=qid, text=clip(text))

    def hibernated(self, record: ChildRecord) -> None:
        self._states[record.key] = "hibernated"
        self.journal.append("hibernate", record.key, durable=True, state="hibernated")

    def woke(self, record: ChildRecord) -> None:
        self._states[record.key] = str(record.state)
        self.journal.append("wake", record.key, durable=True, state=str(record.state))

    def handed_off(self, record: ChildRecord) -> None:
        self._states.pop(record.key, None)
        self._locks.pop(record.key, None)
        self._models.pop(record.key, None)
        self._pids.pop(record.key, None)
        handoff = {k: v for k, v in record.handoff().items() if k not in ENVELOPE}
        # Clipped like the spawn and settle records: a record too large for one control reply
        # would make ``fleet events`` fail. What the supervisor observed is the note's, not the
        # journal's.
        handoff.pop("observed", None)
        handoff.update(task=clip(record.task, TASK_CLIP), error=clip(record.error, 400))
        self.journal.append("handoff", record.key, durable=True, **handoff)
