"""What core tells the session journal: the one narrow face of :mod:`orchestrator.durability`.

The supervisor holds a :class:`Journal`; ``control`` wires the real one in (``fleet serve``),
and an embedded supervisor without one keeps :class:`NoJournal`. Each call is one fact a later
supervisor needs; none of them blocks (the journal buffers, and its own task writes).
"""

from collections.abc import Mapping
from typing import Any, Protocol

from orchestrator._records import ChildRecord

__all__ = ["Journal", "NoJournal"]


class Journal(Protocol):
    """The facts of a session, as core learns them."""

    def spawned(self, record: ChildRecord, fields: Mapping[str, Any]) -> None:
        """*record* was prepared with these loadout *fields*; it launches next."""

    def worktree(self, key: str, snapshot: Mapping[str, str]) -> None:
        """*key*'s worktree exists: ``repo``, ``path`` and the snapshot ``commit``."""

    def resumable(self, key: str, backend: str, resume_id: str) -> None:
        """*key*'s backend reported the id it can be resumed from."""

    def changed(self, record: ChildRecord) -> None:
        """*record*'s state may have changed (written only when it did)."""

    def settled(self, record: ChildRecord, *, report: str, error: str) -> None:
        """A turn of *record* ended with this (scrubbed) report or error."""

    def asked(self, key: str, qid: str, text: str) -> None: ...
    def answered(self, key: str, qid: str, text: str) -> None: ...

    def handed_off(self, record: ChildRecord) -> None:
        """*record* reached its terminal state; its handoff is final."""

    def hibernated(self, record: ChildRecord) -> None:
        """*record*'s process was stopped without finalizing (it can be woken)."""

    def woke(self, record: ChildRecord) -> None:
        """*record* was launched again from hibernation."""

    def spent(self, key: str, spent: Mapping[str, Any]) -> None:
        """*key*'s usage so far (every life's), as the ledger counts it."""


class NoJournal:
    """The journal of a supervisor that keeps none: every fact is dropped."""

    def spawned(self, record: ChildRecord, fields: Mapping[str, Any]) -> None:
        pass

    def worktree(self, key: str, snapshot: Mapping[str, str]) -> None:
        pass

    def resumable(self, key: str, backend: str, resume_id: str) -> None:
        pass

    def changed(self, record: ChildRecord) -> None:
        pass

    def settled(self, record: ChildRecord, *, report: str, error: str) -> None:
        pass

    def asked(self, key: str, qid: str, text: str) -> None:
        pass

    def answered(self, key: str, qid: str, text: str) -> None:
        pass

    def handed_off(self, record: ChildRecord) -> None:
        pass

    def hibernated(self, record: ChildRecord) -> None:
        pass

    def woke(self, record: ChildRecord) -> None:
        pass

    def spent(self, key: str, spent: Mapping[str, Any]) -> None:
        pass
