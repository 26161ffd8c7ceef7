"""Copy a worker's changes from its worktree back into the parent workspace, all or nothing.

The changed set comes from :mod:`._changes`. A path is copied back only when the
parent still holds exactly the snapshot's version of it (bytes and mode) and every path passes
:mod:`._pathguard`; otherwise nothing at all is written, the conflicts are listed
and the worktree stays for a retry. A path the parent already holds in the
child's version counts as applied, so finalizing again after a crash is safe.

Applying runs in three phases. *Prepare* writes every replacement as a temp file in its
destination directory (hash-checked against the changed set) and hard-links every file it will
replace or delete to a backup beside it. *Apply* rechecks each path's ancestors on both sides and
renames the temp into place (a new path is linked, never clobbering a file that appeared since).
If step k fails, steps k-1..1 are undone from their backups; a restore that fails is named
precisely, with the backup that still holds the original. On success each applied path's
pre-image is recorded in the :class:`~orchestrator.workspace._review.ReviewStore`.
"""

from __future__ import annotations

import os
import posixpath
from typing import TYPE_CHECKING

import attrs

from orchestrator.workspace import _apply
from orchestrator.workspace._apply import Op
from orchestrator.workspace._changes import (
    ChangeStatus,
    Conflict,
    Delta,
    Version,
    changed_paths,
    list_deltas,
    read_version,
)
from orchestrator.workspace._git import SYMLINK, WorktreeError, git_env, run_git
from orchestrator.workspace._pathguard import (
    SiblingCheck,
    ancestor_problem,
    lexical_problem,
    link_target_problem,
    open_dir,
    twins_within,
)

if TYPE_CHECKING:
    from orchestrator.workspace._review import ReviewStore
    from orchestrator.workspace._worktree import Snapshot

# ChangeStatus and changed_paths live in _changes; _review and docs/worktrees.md import them
# from here.
__all__ = ["ChangeStatus", "Conflict", "FinalizeResult", "changed_paths", "finalize"]

_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@attrs.frozen(kw_only=True)
class FinalizeResult:
    """What a copy-back did. ``error`` is ``""`` exactly when every changed path is applied.

    ``applied`` are the paths that now hold the child's version. After a failed apply that was
    rolled back, ``restored`` lists the paths put back and ``applied`` only those whose restore
    failed (the ``error`` line names their saved originals).
    """

    changed: tuple[str, ...]
    applied: tuple[str, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    restored: tuple[str, ...] = ()
    error: str = ""


def _guard_problem(snapshot: Snapshot, delta: Delta, siblings: SiblingCheck) -> str | None:
    reason = (
        lexical_problem(delta.path)
        or ancestor_problem(snapshot.repo, delta.path)
        or ancestor_problem(snapshot.worktree, delta.path)
    )
    if reason is None and delta.old is None:
        reason = siblings.problem(delta.path)
    if reason is None and delta.new is not None and delta.new.mode == SYMLINK:
        fd = open_dir(snapshot.worktree, posixpath.dirname(delta.path))
        try:
            target = os.readlink(posixpath.basename(delta.path), dir_fd=fd)
        finally:
            os.close(fd)
        reason = link_target_problem(delta.path, target)
    return reason


def _drift_reason(old: Version | None, current: Version | None) -> str:
    if old is None:
        return "created in the parent since the snapshot"
    if current is None:
        return "deleted in the parent since the snapshot"
    if current.sha == old.sha:
        return "mode changed in the parent since the snapshot"
    return "changed in the parent since the snapshot"


def _plan(
    snapshot: Snapshot, deltas: list[Delta], algo: str
) -> tuple[list[Op], list[Delta], list[Conflict]]:
    """Split the changes into work to do, work already done, and conflicts."""
    siblings = SiblingCheck(root=snapshot.repo)
    twins = twins_within([d.path for d in deltas if d.old is None])
    ops: list[Op] = []
    done: list[Delta] = []
    conflicts: list[Conflict] = []
    for delta in deltas:
        try:
            reason = twins.get(delta.path) or _guard_problem(snapshot, delta, siblings)
            if reason is None:
                current, st = read_version(snapshot.repo, delta.path, algo)
        except OSError as exc:
            reason = f"cannot be read ({exc.strerror or exc})"
        if reason is not None:
            conflicts.append(Conflict(path=delta.path, reason=reason))
            continue
        if current == delta.new:
            done.append(delta)
        elif current != delta.old:
            conflicts.append(Conflict(path=delta.path, reason=_drift_reason(delta.old, current)))
        else:
            ops.append(Op(delta=delta, parent=st))
    return ops, done, conflicts


def _blobs(snapshot: Snapshot, shas: list[str]) -> list[bytes]:
    """The content of the blobs ``shas``, in order, from one ``cat-file --batch``."""
    out = run_git(
        ["cat-file", "--batch"],
        cwd=snapshot.worktree,
        env=git_env(),
        op=f"read pre-images for {snapshot.worktree}",
        stdin="".join(f"{sha}\n" for sha in shas).encode(),
    )
    blobs, pos = [], 0
    for _ in shas:
        end = out.index(b"\n", pos)
        size = int(out[pos:end].split()[2])
        blobs.append(out[end + 1 : end + 1 + size])
        pos = end + 2 + size
    return blobs


def _record(
    snapshot: Snapshot, ops: list[Op], done: list[Delta], review: ReviewStore, owner: str
) -> str:
    """Record every applied path's pre-image; an error line, or ``""``.

    The pre-image bytes are the snapshot's blob (the parent was checked to hold exactly it); the
    mode is the parent file's own, permission bits included. A path applied by an earlier,
    interrupted finalize gets the snapshot's mode.
    """
    entries = [(op.delta, op.parent.st_mode if op.parent else None) for op in ops]
    entries += [(d, d.old.mode if d.old else None) for d in done]
    try:
        blobs = iter(_blobs(snapshot, [d.old.sha for d, _ in entries if d.old]))
        for delta, mode in entries:
            preimage = next(blobs) if delta.old else None
            review.record(owner, snapshot.repo / delta.path, preimage, mode)
    except (OSError, WorktreeError) as exc:
        return (
            f"copy back from {snapshot.worktree}: the changes are applied but recording their "
            f"pre-images failed ({exc}); `fleet diff` and `fleet revert` cannot cover them"
        )
    return ""


def _conflict_error(snapshot: Snapshot, conflicts: list[Conflict]) -> str:
    first = conflicts[0]
    return (
        f"copy back from {snapshot.worktree}: {len(conflicts)} changed path(s) conflict with "
        f"the parent, first {first.path!r}: {first.reason}; nothing was copied back, the "
        "worktree is kept; resolve them and stop again, or discard the worktree"
    )


def finalize(snapshot: Snapshot, review: ReviewStore, owner: str) -> FinalizeResult:
    """Copy the child's changes back into the parent: every path, or none (see the module doc).

    Never raises for a conflict or a failed apply; those come back in the result. Raises
    :class:`~._worktree.WorktreeError` only when the changes cannot be listed: Git
    fails, or the worktree's ``.git`` file no longer leads to the snapshot's repository.
    """
    algo, deltas = list_deltas(snapshot)
    changed = tuple(d.path for d in deltas)
    ops, done, conflicts = _plan(snapshot, deltas, algo)
    created: list[str] = []
    if not conflicts:
        try:
            _apply.prepare(snapshot, ops, created, algo)
        except _apply.DriftError as exc:
            conflicts.append(exc.conflict)
        except OSError as exc:
            _apply.discard(snapshot, ops, created, backups=True)
            return FinalizeResult(
                changed=changed,
                error=(
                    f"copy back from {snapshot.worktree}: preparing {exc.filename or 'a file'} "
                    f"failed ({exc.strerror}); nothing in the parent changed; fix the cause and "
                    "stop again"
                ),
            )
    if conflicts:
        _apply.discard(snapshot, ops, created, backups=True)
        error = _conflict_error(snapshot, conflicts)
        return FinalizeResult(changed=changed, conflicts=tuple(conflicts), error=error)
    for k, op in enumerate(ops):
        try:
            _apply.apply_op(snapshot, op)
        except (OSError, _apply.DriftError) as exc:
            restored, stuck, error = _apply.rollback(snapshot, ops[:k], op, exc)
            keep = [o for o in ops[:k] if o.delta.path in stuck]
            _apply.discard(snapshot, [o for o in ops if o not in keep], created, backups=True)
            return FinalizeResult(
                changed=changed, applied=tuple(stuck), restored=tuple(restored), error=error
            )
    _apply.discard(snapshot, ops, [], backups=True)
    _apply.prune_emptied(snapshot, ops)
    error = _record(snapshot, ops, done, review, owner)
    applied = tuple(sorted(d.path for d in [*(op.delta for op in ops), *done]))
    return FinalizeResult(changed=changed, applied=applied, error=error)
