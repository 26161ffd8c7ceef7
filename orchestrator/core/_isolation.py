"""Worktree children: their private worktree from spawn to the copy-back at stop.

A worktree child's workspace is a detached worktree holding a snapshot of the parent's
workspace (:mod:`orchestrator.workspace._worktree`). Stop copies its changes back when that is safe
(:mod:`orchestrator.workspace._copyback`) and records every applied file for review
(:mod:`orchestrator.workspace._review`). A conflict, a failed apply or a child that failed keeps the
worktree: it stays *unresolved* — recoverable by a later ``fleet stop`` or deleted by
``fleet discard`` — and survives report-history trimming.

Copy-back lands only the ordinary files; files that run later or instruct an agent are *held*
in the worktree (:mod:`orchestrator.workspace._quarantine`) until ``fleet apply aN PATH`` names
each. ``fleet stop aN --hold`` keeps the whole change for review (``fleet diff aN``) and
``fleet apply aN`` lands its ordinary files later.

Git work is blocking; it runs in a worker thread (no process started there must outlive it).
"""

import os
from pathlib import Path
from typing import Any

import attrs
import trio

from orchestrator._errors import FleetError, UsageError
from orchestrator._records import ChildRecord, State
from orchestrator.core._evidence import COUNT_LIMIT, MAX_FILES, line_counts
from orchestrator.governance._diagnostics import RunLog
from orchestrator.launch._launcher import ShipsBack
from orchestrator.workspace._bundle import import_bundle, ship_snapshot
from orchestrator.workspace._changes import list_deltas
from orchestrator.workspace._copyback import FinalizeResult, Pending, finalize, survey
from orchestrator.workspace._git import WorktreeError, run_git
from orchestrator.workspace._patch import patches
from orchestrator.workspace._quarantine import HoldRules
from orchestrator.workspace._review import ReviewStore
from orchestrator.workspace._worktree import Snapshot, create_worktree, remove_worktree


@attrs.define(eq=False)
class Worktrees:
    """The session's worktrees, by child key."""

    root: Path
    repo: Path
    review: ReviewStore
    rules: HoldRules = attrs.Factory(HoldRules)
    snapshots: dict[str, Snapshot] = attrs.Factory(dict)
    #: Children stopped with ``--hold``: their change is kept for review, not copied back.
    holding: set[str] = attrs.Factory(set)
    #: The commit a remote child's worktree went out as (its changes must build on it).
    shipped: dict[str, str] = attrs.Factory(dict)
    # One creation at a time: a batch launches its children together, and two snapshots of
    # one repository at once would race on its worktree administration.
    _creating: trio.Lock = attrs.Factory(trio.Lock)

    def path_for(self, key: str) -> Path:
        return self.root / key

    async def create(self, key: str) -> Snapshot:
        async with self._creating:
            snapshot = await trio.to_thread.run_sync(create_worktree, self.repo, self.path_for(key))
        self.snapshots[key] = snapshot
        return snapshot

    def unresolved(self) -> set[str]:
        return set(self.snapshots)

    async def observe(self, key: str) -> list[dict[str, Any]]:
        """The files *key* changed in its worktree so far, with line counts (``[]`` for a
        child without one, or when Git cannot say)."""
        snapshot = self.snapshots.get(key)
        if snapshot is None:
            return []
        try:
            return await trio.to_thread.run_sync(_observe, snapshot)
        except (FleetError, OSError):
            return []

    async def bundle(self, key: str) -> bytes:
        """*key*'s snapshot as a git bundle, for a child on another node (the commit its
        changes must come back on is remembered)."""
        shipped = await trio.to_thread.run_sync(ship_snapshot, self.snapshots[key])
        self.shipped[key] = shipped.commit
        return shipped.bundle

    async def settle(
        self, key: str, *, copy_back: bool, shipped: ShipsBack | None = None
    ) -> dict[str, Any]:
        """Finish *key*'s worktree: copy back (when asked) and remove it if nothing is left.

        A worktree that travelled (*shipped*) first takes the node's bundle of changes; one
        that never came back, or is refused, keeps the worktree with the reason as the error.
        A worktree in :attr:`holding` is only surveyed: nothing lands.
        Returns the handoff fields: ``changed``, ``applied``, ``conflicts``, ``held``,
        ``pending``, ``remaining`` and ``error`` ("" when the worktree was resolved).
        """
        snapshot = self.snapshots.get(key)
        if snapshot is None:
            return {}
        keep_note = (
            f"worktree kept at {snapshot.worktree} (fleet stop {key} to copy back after "
            f"resolving, fleet discard {key} to delete it)"
        )
        if not copy_back:
            return {"remaining": [keep_note], "error": ""}
        if shipped is not None and shipped.ships_back:
            returned, lost = shipped.returned, shipped.lost
            shipped.returned, shipped.ships_back = None, False  # once: a later stop copies
            if returned is None:  # back what is local by then
                lost = lost or "the node's changes never came back"
                return {"remaining": [keep_note], "error": f"copy-back failed: {lost}"}
            try:
                base = self.shipped.pop(key, snapshot.commit)
                await trio.to_thread.run_sync(import_bundle, snapshot, returned, base)
            except WorktreeError as exc:
                return {"remaining": [keep_note], "error": f"copy-back failed: {exc}"}
        if key in self.holding:
            found = await trio.to_thread.run_sync(survey, snapshot, self.rules)
            if all(p.landed for p in found):  # nothing to review: nothing to keep
                await self.discard(key)
                return {"changed": [p.path for p in found], "remaining": [], "error": ""}
            note = (
                f"worktree kept at {snapshot.worktree}: held for review by stop --hold "
                f"(fleet diff {key} shows it, fleet apply {key} lands it, fleet discard {key} "
                "deletes it)"
            )
            return _kept_fields(found, note)
        result = await trio.to_thread.run_sync(
            lambda: finalize(snapshot, self.review, key, rules=self.rules)
        )
        return await self._settled(key, result, keep_note)

    async def _settled(self, key: str, result: FinalizeResult, keep_note: str) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "changed": list(result.changed),
            "applied": list(result.applied),
            "conflicts": [{"path": c.path, "reason": c.reason} for c in result.conflicts],
            "held": [{"path": h.path, "why": h.why} for h in result.held],
            "pending": list(result.pending),
            "error": result.error,
            "remaining": [],
        }
        if not result.resolved:
            if not (result.conflicts or result.error):
                snapshot = self.snapshots[key]
                keep_note = (
                    f"worktree kept at {snapshot.worktree}: {len(result.held)} held file(s) "
                    f"land only by name (fleet diff {key} PATH reviews one, fleet apply {key} "
                    f"PATH lands it; fleet discard {key} deletes them)"
                )
            fields["remaining"] = [keep_note]
            return fields
        await self.discard(key)
        return fields

    async def apply(self, key: str, names: list[str] | None) -> dict[str, Any]:
        """Land *key*'s kept change: its ordinary files, or exactly the paths *names*
        (held ones included); the handoff fields as :meth:`settle` gives them."""
        snapshot = self.snapshots[key]
        self.holding.discard(key)
        result = await trio.to_thread.run_sync(
            lambda: finalize(snapshot, self.review, key, rules=self.rules, names=names)
        )
        note = (
            f"worktree kept at {snapshot.worktree} (fleet diff {key} shows what is left; "
            f"fleet discard {key} deletes it)"
        )
        return await self._settled(key, result, note)

    async def change(self, key: str, paths: list[str]) -> list[tuple[Pending, str]]:
        """*key*'s change against its snapshot (only *paths* when given): each changed path
        with its hold reason, whether it landed, and its ``git apply``-able patch."""
        snapshot = self.snapshots[key]

        def work() -> list[tuple[Pending, str]]:
            found = survey(snapshot, self.rules)
            if paths:
                known = {p.path for p in found}
                unknown = [p for p in paths if p not in known]
                if unknown:
                    raise UsageError(
                        f"diff: {unknown[0]!r} is not a change of {key} (fleet diff {key} lists "
                        "them)"
                    )
                found = [p for p in found if p.path in paths]
            texts = patches(snapshot, [p.delta for p in found])
            return [(p, texts[p.path]) for p in found]

        return await trio.to_thread.run_sync(work)

    async def discard(self, key: str) -> None:
        self.holding.discard(key)
        snapshot = self.snapshots.pop(key, None)
        if snapshot is not None:
            await trio.to_thread.run_sync(remove_worktree, snapshot)


def _kept_fields(found: list[Pending], note: str) -> dict[str, Any]:
    """The handoff of a change kept by ``stop --hold``: nothing landed."""
    left = [p for p in found if not p.landed]
    return {
        "changed": [p.path for p in found],
        "applied": [],
        "conflicts": [],
        "held": [{"path": p.path, "why": p.why} for p in left if p.why],
        "pending": [p.path for p in left if not p.why],
        "error": "",
        "remaining": [note],
    }


def _observe(snapshot: Snapshot) -> list[dict[str, Any]]:
    _, deltas = list_deltas(snapshot)
    changes: list[tuple[str, str, bytes | None]] = []
    for index, delta in enumerate(deltas):
        old: bytes | None = b""
        if index >= MAX_FILES:
            old = None  # listed as "more", never read
        elif delta.old is not None:
            # A blob by its id: no filter, hook or attribute of the child's runs here.
            old = run_git(
                ["cat-file", "blob", delta.old.sha],
                cwd=snapshot.repo,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1"},
                op=f"read {delta.path} of the snapshot",
                repo=snapshot.repo,
            )
        if old is not None and len(old) > COUNT_LIMIT:
            old = None
        changes.append((delta.path, delta.status, old))
    return line_counts(snapshot.worktree, changes)


def apply_settlement(record: ChildRecord, fields: dict[str, Any]) -> None:
    """Copy a worktree settlement's handoff fields onto *record*."""
    for name in ("changed", "applied", "conflicts", "held", "pending", "remaining"):
        if name in fields:
            setattr(record, name, fields[name])
    if fields.get("error"):
        record.error = fields["error"]
    elif "error" in fields and record.state is State.STOPPED:
        record.error = ""


async def settle_worktree(
    worktrees: Worktrees,
    record: ChildRecord,
    log: RunLog,
    *,
    copy_back: bool,
    launched: object = None,
) -> None:
    """Finalize *record*'s worktree as its run ends (copy back only on a clean stop)."""
    shipped = launched if isinstance(launched, ShipsBack) else None
    try:
        fields = await worktrees.settle(record.key, copy_back=copy_back, shipped=shipped)
    except FleetError as exc:
        fields = {"error": f"copy-back failed: {exc}", "remaining": [str(exc)]}
    apply_settlement(record, fields)
    if fields.get("conflicts") or fields.get("error"):
        log.write(f"worktree unresolved: {fields.get('error') or 'conflicts'}")
