"""Revive: a child whose supervisor died starts again with its key, definition and context.

A :class:`Revival` is what the journal says of a lost child (``control`` reads it; core never
reads the journal). Before anything starts, each thing the child had is re-checked: its
backend can resume (the builtin agent: its transcript is there), its worktree is still the
snapshot it was given (the same ``HEAD``), and its ownership locks are free again. The first
failed check refuses the revive in one line and takes nothing; otherwise the child launches
with the loadout it was spawned with, marked ``restarted``, and waits idle for its next prompt
(whose first line, hidden from everyone but its model, says it was restarted).
"""

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

import ipc
from orchestrator._errors import NotFound, Refused, UsageError
from orchestrator._records import ChildRecord
from orchestrator.core._context import refusal
from orchestrator.core._remote import REMOTE_SURFACES, node_directory
from orchestrator.core._run import ChildRun
from orchestrator.governance._ownership import LockConflict, LockTable
from orchestrator.workspace._worktree import Snapshot

if TYPE_CHECKING:
    from orchestrator.core._host import SpawnHost
    from orchestrator.core._spawning import Spawning

__all__ = ["REVIVABLE", "Revival", "launch_again", "revive", "why_not"]

#: Backends a lost child of which can be revived with its context.
REVIVABLE = frozenset({"builtin", "claude", "pi", "codex"})


@attrs.frozen(kw_only=True)
class Revival:
    """A lost child, as its spawn left it (the journal's facts)."""

    key: str
    name: str
    agent: str
    mode: str
    task: str
    backend: str
    surface: str = "process"
    workflow_mode: str = "build"
    depth: int = 1
    #: The loadout fields it was spawned with (JSON values), its resume id among them.
    loadout: Mapping[str, Any]
    worktree: Mapping[str, str] | None = None
    #: The ownership it held when it was lost (a declared child's specs, or its paths).
    locks: Sequence[str] = ()
    report: str = ""
    #: A checked child's result schema (docs/governance.md "Checked results").
    schema: dict[str, Any] | None = None
    #: The usage budget it was spawned with (docs/governance.md "Budgets").
    budget: Mapping[str, Any] | None = None
    #: Its model role ("" for none) and every model it ran on, the current one last.
    role: str = ""
    models: Sequence[str] = ()


def why_not(revival: Revival, scratch: Path) -> str:
    """Why *revival*'s backend cannot resume it ("" when it can); *scratch* is its own (for a
    remote child, where its context fetched from its node at each turn end is kept)."""
    if revival.backend not in REVIVABLE:
        return f"the {revival.backend} backend cannot be revived (only builtin and the agent CLIs)"
    if revival.surface in REMOTE_SURFACES and (refused := refusal(scratch)):
        return refused
    resume = str(revival.loadout.get("resume") or "")
    if revival.backend == "claude":
        # Claude Code keeps the session under the child's kept private HOME.
        store = scratch / "claude" / "home" / ".claude" / "projects"
        if not resume or not any(store.glob(f"*/{resume}.jsonl")):
            return f"its Claude Code session {resume or '(none)'} is not in {store}"
        return ""
    if revival.backend == "codex":
        # Codex keeps its threads' rollouts under the child's kept CODEX_HOME.
        home = scratch / "codex" / "config" / "codex"
        if not resume or not any(home.glob(f"sessions/**/*{resume}*.jsonl")):
            return f"its Codex thread {resume or '(none)'} is not in {home}"
        return ""
    if not resume or not Path(resume).is_file():
        what = "Pi session file" if revival.backend == "pi" else "transcript"
        return f"its {what} {resume or '(none)'} is gone; it cannot be revived"
    return ""


def _head(path: Path) -> str | None:
    """The worktree's ``HEAD`` ("" when unreadable), ``None`` when it is gone."""
    if not path.is_dir():
        return None
    result = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    return result.stdout.strip() if result.returncode == 0 else ""


async def _recheck_worktree(revival: Revival) -> Snapshot:
    worktree = revival.worktree or {}
    path, commit = Path(worktree.get("path", "")), worktree.get("commit", "")
    where = f"revive: {revival.key}: its worktree {path}"
    key = revival.key
    fix = f"fleet stop {key} copies its changes back, fleet discard {key} deletes it"
    head = await trio.to_thread.run_sync(_head, path) if worktree else None
    if head is None:
        raise Refused(f"{where} is gone; fleet discard {key} forgets it")
    if head != commit:
        raise Refused(
            f"{where} drifted (HEAD {head[:12] or 'unreadable'}, its snapshot was "
            f"{commit[:12]}); {fix}"
        )
    return Snapshot.from_json(worktree)


def _retake(locks: LockTable, revival: Revival, root: Path) -> None:
    if not revival.locks:
        return
    try:
        locks.acquire(revival.key, list(revival.locks), root=root)
    except (LockConflict, ValueError) as exc:
        holder = getattr(exc, "holder", "")
        taken = f" is now held by {holder}" if holder else f" cannot be taken ({exc})"
        raise Refused(
            f"revive: {revival.key}: its ownership of {', '.join(revival.locks)}{taken}; "
            f"stop {holder or 'its holder'} (or wait for it) and revive again"
        ) from None


def _loadout_fields(revival: Revival) -> dict[str, Any]:
    fields = dict(revival.loadout)
    model = fields.get("model")
    if isinstance(model, Mapping):
        fields["model"] = ipc.ModelSpec(**model)
    # A role's candidates come back from the journal as JSON objects too.
    fields["models"] = [
        ipc.ModelChoice(
            spec=str(c["spec"]), model=ipc.ModelSpec(**c["model"]), effort=str(c.get("effort", ""))
        )
        if isinstance(c, Mapping)
        else c
        for c in fields.get("models") or ()
    ]
    fields["restarted"] = True
    return fields


async def revive(
    sup: "SpawnHost[ChildRun]", spawning: "Spawning", locks: LockTable, revival: Revival
) -> ChildRecord:
    """Start *revival* again (see the module docstring), or raise in one line."""
    key = revival.key
    sup.spend.check_turn(f"revive {key}", key)
    if key in sup.registry.records:
        raise UsageError(f"revive: {key}: it is live (see fleet peek)")
    reason = why_not(revival, sup.config.paths.scratch / key)
    if reason:
        raise Refused(f"revive: {key}: {reason}")
    sup.launcher_for(revival.surface)  # refuses a surface this session cannot reach
    snapshot = await _recheck_worktree(revival) if revival.mode == "worktree" else None
    sup.capacity.reserve(1)
    record = ChildRecord(
        key=key,
        name=revival.name,
        agent=revival.agent,
        mode=revival.mode,
        task=revival.task,
        workspace=str(sup.config.workspace),
        backend=revival.backend,
        surface=revival.surface,
        workflow_mode=revival.workflow_mode,
        depth=revival.depth,
        report=revival.report,
        schema=revival.schema,
        role=revival.role,
        models=list(revival.models),
    )
    try:
        _retake(locks, revival, sup.config.workspace)
        sup.registry.retired.pop(key, None)
        sup.registry.add(record)
        sup.spend.revived(record, revival.budget)
    except BaseException:
        sup.capacity.release()
        raise
    if snapshot is not None:
        sup.worktrees.snapshots[key] = snapshot
    try:
        run = await launch_again(sup, spawning, record, revival)
        sup.hibernation.spawned(run.record, revival.loadout)
    except BaseException:
        locks.release(key)
        sup.registry.records.pop(key, None)
        sup.capacity.release()
        raise
    return record


async def launch_again(
    sup: "SpawnHost[ChildRun]",
    spawning: "Spawning",
    record: ChildRecord,
    revival: Revival,
) -> ChildRun:
    """Launch *record* again with *revival*'s loadout, marked restarted (its slot is
    already reserved; a wake from hibernation launches through here too)."""
    fields = _loadout_fields(revival)
    remote = record.surface in REMOTE_SURFACES
    if remote:  # the door's address and its paths on a node (named when its actor makes them)
        node = node_directory(sup.config.session, record.key)
        fields = await sup.remote.fields_for(record.key, node, fields)
    sup.spend.new_life(record.key)  # its new process reports from zero: that adds
    prepared = await trio.to_thread.run_sync(spawning.prepare_one, record, fields)
    run = ChildRun(
        host=sup,
        record=record,
        token=prepared.token,
        card=prepared.card,
        loadout=prepared.loadout,
        log=prepared.log,
        budgets=sup.budgets,
        declared=tuple(fields.get("ownership", ())),
        terms=sup.remote.terms_for(record.key, prepared.card.lease_s) if remote else None,
    )
    sup.runs[record.key] = run
    await sup.nursery.start(run.run)
    sup.notes.changed()
    return run


def find_lost(lost: Mapping[str, Revival], ref: str) -> Revival:
    """A lost child by key or name."""
    if ref in lost:
        return lost[ref]
    named = [r for r in lost.values() if r.name == ref]
    if len(named) == 1:
        return named[0]
    raise NotFound(f"revive: no lost child {ref!r} (see the stale list in fleet peek)")
