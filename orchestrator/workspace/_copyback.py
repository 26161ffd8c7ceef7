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

Before any of that, every changed path is judged by :mod:`._quarantine`: a file that runs later or
instructs an agent is *held* — it stays in the worktree and lands only when the caller names it
(``names``, from ``fleet apply aN PATH``) — while the ordinary files land. The bytes a manifest is
judged by are read from the worktree through the path guard and must hash to the version the
changed set listed, so what was judged is what lands.
"""

from __future__ import annotations

import os
import posixpath
from typing import TYPE_CHECKING

import attrs

from orchestrator._errors import UsageError
from orchestrator.workspace import _apply
from orchestrator.workspace._apply import Op
from orchestrator.workspace._changes import (
    READ_FLAGS,
    ChangeStatus,
    Conflict,
    Delta,
    Version,
    blob_sha,
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
from orchestrator.workspace._quarantine import Held, HoldRules

if TYPE_CHECKING:
    from collections.abc import Collection

    from orchestrator.workspace._review import ReviewStore
    from orchestrator.workspace._worktree import Snapshot

# ChangeStatus and changed_paths live in _changes; _review and docs/worktrees.md import them
# from here.
__all__ = [
    "ChangeStatus",
    "Conflict",
    "FinalizeResult",
    "Pending",
    "changed_paths",
    "finalize",
    "survey",
]

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
    #: Changed paths kept in the worktree because they run later or instruct an agent.
    held: tuple[Held, ...] = ()
    #: Ordinary changed paths not landed because the caller named others.
    pending: tuple[str, ...] = ()

    @property
    def resolved(self) -> bool:
        """Whether the parent now holds every change: nothing held, pending or failed."""
        return not (self.held or self.pending or self.conflicts or self.error)


@attrs.frozen(kw_only=True)
class Pending:
    """One changed path as review sees it: held (and why) or ordinary, landed or not."""

    delta: Delta
    why: str  # "" for an ordinary path
    landed: bool

    @property
    def path(self) -> str:
        return self.delta.path


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


#: A manifest larger than this is held unread.
_MAX_JUDGED = 8 << 20


class _Unjudgeable(Exception):
    """A side of a change could not be read to judge it."""


def _new_bytes(snapshot: Snapshot, delta: Delta, new: Version, algo: str) -> bytes:
    """The worktree's bytes of ``delta`` (whose new side is ``new``), still as listed."""
    fd = open_dir(snapshot.worktree, posixpath.dirname(delta.path))
    try:
        src = os.open(posixpath.basename(delta.path), READ_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        if os.fstat(src).st_size > _MAX_JUDGED:
            raise _Unjudgeable
        chunks = []
        while chunk := os.read(src, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(src)
    data = b"".join(chunks)
    if blob_sha(algo, len(data), [data]).hexdigest() != new.sha:
        raise _Unjudgeable
    return data


def _judge(snapshot: Snapshot, delta: Delta, algo: str, rules: HoldRules) -> str:
    """Why ``delta`` is held, or ``""`` (see :mod:`._quarantine`)."""

    def old() -> bytes | None:
        return _blobs(snapshot, [delta.old.sha])[0] if delta.old else None

    def new() -> bytes | None:
        return _new_bytes(snapshot, delta, delta.new, algo) if delta.new else None

    try:
        why = rules.why(
            delta.path,
            delta.old.mode if delta.old else None,
            delta.new.mode if delta.new else None,
            old,
            new,
        )
    except (OSError, WorktreeError, _Unjudgeable):
        return "could not be read to judge it (changed, too large or unreadable)"
    return why or ""


def _landed(snapshot: Snapshot, delta: Delta, algo: str) -> bool:
    """Whether the parent already holds the child's version of ``delta``."""
    if lexical_problem(delta.path) is not None:
        return False
    try:
        current, _ = read_version(snapshot.repo, delta.path, algo)
    except OSError:
        return False
    return current == delta.new


def survey(snapshot: Snapshot, rules: HoldRules) -> list[Pending]:
    """Every changed path with its hold reason and whether the parent holds it already."""
    algo, deltas = list_deltas(snapshot)
    return [
        Pending(
            delta=d,
            why=_judge(snapshot, d, algo, rules),
            landed=_landed(snapshot, d, algo),
        )
        for d in deltas
    ]


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


def _select(
    snapshot: Snapshot,
    deltas: list[Delta],
    algo: str,
    rules: HoldRules,
    names: Collection[str] | None,
) -> tuple[list[Delta], list[Held], list[str]]:
    """The deltas to land, the held ones left out, and the ordinary ones left out."""
    if names is not None:
        unknown = sorted(set(names) - {d.path for d in deltas})
        if unknown:
            raise UsageError(
                f"{unknown[0]!r} is not a change of this worker (its diff lists its changes)"
            )
    landing: list[Delta] = []
    held: list[Held] = []
    pending: list[str] = []
    for delta in deltas:
        if names is not None and delta.path in names:
            landing.append(delta)
            continue
        why = _judge(snapshot, delta, algo, rules)
        if names is None and not why:
            landing.append(delta)
        elif _landed(snapshot, delta, algo):
            landing.append(delta)  # already there: recorded as applied, nothing written
        elif why:
            held.append(Held(path=delta.path, why=why))
        else:
            pending.append(delta.path)
    return landing, held, pending


def finalize(
    snapshot: Snapshot,
    review: ReviewStore,
    owner: str,
    *,
    rules: HoldRules | None = None,
    names: Collection[str] | None = None,
) -> FinalizeResult:
    """Copy the child's changes back into the parent (see the module doc): every ordinary
    path, or none; held paths stay in the worktree. With ``names``, exactly those paths —
    held or not — land (all or none), and the rest stay.

    Never raises for a conflict or a failed apply; those come back in the result. Raises
    :class:`~._worktree.WorktreeError` when the changes cannot be listed (Git fails, or the
    worktree's ``.git`` file no longer leads to the snapshot's repository), and
    :class:`~orchestrator._errors.UsageError` for a name that is not a changed path.
    """
    algo, deltas = list_deltas(snapshot)
    changed = tuple(d.path for d in deltas)
    landing, held, pending = _select(snapshot, deltas, algo, rules or HoldRules(), names)
    base = FinalizeResult(changed=changed, held=tuple(held), pending=tuple(pending))
    ops, done, conflicts = _plan(snapshot, landing, algo)
    created: list[str] = []
    if not conflicts:
        try:
            _apply.prepare(snapshot, ops, created, algo)
        except _apply.DriftError as exc:
            conflicts.append(exc.conflict)
        except OSError as exc:
            _apply.discard(snapshot, ops, created, backups=True)
            return attrs.evolve(
                base,
                error=(
                    f"copy back from {snapshot.worktree}: preparing {exc.filename or 'a file'} "
                    f"failed ({exc.strerror}); nothing in the parent changed; fix the cause and "
                    "stop again"
                ),
            )
    if conflicts:
        _apply.discard(snapshot, ops, created, backups=True)
        error = _conflict_error(snapshot, conflicts)
        return attrs.evolve(base, conflicts=tuple(conflicts), error=error)
    for k, op in enumerate(ops):
        try:
            _apply.apply_op(snapshot, op)
        except (OSError, _apply.DriftError) as exc:
            restored, stuck, error = _apply.rollback(snapshot, ops[:k], op, exc)
            keep = [o for o in ops[:k] if o.delta.path in stuck]
            _apply.discard(snapshot, [o for o in ops if o not in keep], created, backups=True)
            return attrs.evolve(base, applied=tuple(stuck), restored=tuple(restored), error=error)
    _apply.discard(snapshot, ops, [], backups=True)
    _apply.prune_emptied(snapshot, ops)
    error = _record(snapshot, ops, done, review, owner)
    applied = tuple(sorted(d.path for d in [*(op.delta for op in ops), *done]))
    return attrs.evolve(base, applied=applied, error=error)
