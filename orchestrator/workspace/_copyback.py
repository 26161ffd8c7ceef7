"""Copy a worker's changes from its worktree back into the parent workspace, all or nothing.

The changed set comes from :mod:`orchestrator.workspace._changes`. A path is copied back only when the
parent still holds exactly the snapshot's version of it (bytes and mode) and every path passes
:mod:`orchestrator.workspace._pathguard`; otherwise nothing at all is written, the conflicts are listed
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
import secrets
import stat
from typing import TYPE_CHECKING

import attrs

from orchestrator.workspace._changes import (
    READ_FLAGS,
    ChangeStatus,
    Delta,
    Version,
    blob_sha,
    changed_paths,
    copy_hashed,
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
    from pathlib import Path

    from orchestrator.workspace._review import ReviewStore
    from orchestrator.workspace._worktree import Snapshot

# ChangeStatus and changed_paths live in _changes; _review and docs/worktrees.md import them
# from here.
__all__ = ["ChangeStatus", "Conflict", "FinalizeResult", "changed_paths", "finalize"]

_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@attrs.frozen(kw_only=True)
class Conflict:
    """A path that was not copied back (or not reverted), and why."""

    path: str
    reason: str


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


@attrs.define(eq=False)
class _Op:
    """One path's copy-back, filled in as the phases run."""

    delta: Delta
    parent: os.stat_result | None  # the parent entry when it was checked
    temp: str | None = None
    backup: str | None = None

    @property
    def dir_rel(self) -> str:
        return posixpath.dirname(self.delta.path)

    @property
    def name(self) -> str:
        return posixpath.basename(self.delta.path)


class _DriftError(Exception):
    """A file changed under the copy-back between its check and its use."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.conflict = Conflict(path=path, reason=reason)


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
) -> tuple[list[_Op], list[Delta], list[Conflict]]:
    """Split the changes into work to do, work already done, and conflicts."""
    siblings = SiblingCheck(root=snapshot.repo)
    twins = twins_within([d.path for d in deltas if d.old is None])
    ops: list[_Op] = []
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
            ops.append(_Op(delta=delta, parent=st))
    return ops, done, conflicts


def _fresh_name(kind: str) -> str:
    # Not derived from the file's name, so a 255-byte name still gets a temp beside it.
    return f".fleet-{kind}-{secrets.token_hex(8)}"


def _permissions(op: _Op, source: os.stat_result) -> int:
    """Keep the parent file's permission bits; a new file takes the worktree file's."""
    replaced = op.parent is not None and stat.S_ISREG(op.parent.st_mode)
    bits = (op.parent.st_mode if replaced and op.parent else source.st_mode) & 0o777
    if op.delta.new is not None and op.delta.new.mode == 0o100755:
        return bits | 0o100 | (bits & 0o444) >> 2
    return bits & ~0o111


def _stage(snapshot: Snapshot, op: _Op, fd: int, new: Version, algo: str) -> None:
    """Write the child's version of ``op`` as ``op.temp`` in the open destination directory."""
    src_dir = open_dir(snapshot.worktree, op.dir_rel)
    try:
        if new.mode == SYMLINK:
            target = os.readlink(op.name, dir_fd=src_dir)
            raw = os.fsencode(target)
            sha = blob_sha(algo, len(raw), [raw]).hexdigest()
            op.temp = _fresh_name("new")
            os.symlink(target, op.temp, dir_fd=fd)
        else:
            src = os.open(op.name, READ_FLAGS, dir_fd=src_dir)
            try:
                op.temp = _fresh_name("new")
                dst = os.open(op.temp, _NEW_FLAGS, 0o600, dir_fd=fd)
                try:
                    sha = copy_hashed(src, dst, algo)
                    os.fchmod(dst, _permissions(op, os.fstat(src)))
                    os.fsync(dst)  # the parent's file is the user's data: durable before rename
                finally:
                    os.close(dst)
            finally:
                os.close(src)
    finally:
        os.close(src_dir)
    if sha != new.sha:
        raise _DriftError(op.delta.path, "changed in the worktree during copy-back; stop again")


def _same_entry(a: os.stat_result, b: os.stat_result | None) -> bool:
    return b is not None and (a.st_ino, a.st_size, a.st_mtime_ns) == (
        b.st_ino,
        b.st_size,
        b.st_mtime_ns,
    )


def _prepare(snapshot: Snapshot, ops: list[_Op], created: list[str], algo: str) -> None:
    """Stage every temp and backup; an ``OSError`` names the repository path it failed on."""
    for op in ops:
        try:
            fd = open_dir(snapshot.repo, op.dir_rel, created if op.delta.new else None)
            try:
                if op.delta.old is not None:
                    op.backup = _fresh_name("old")
                    os.link(op.name, op.backup, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
                    backup = os.stat(op.backup, dir_fd=fd, follow_symlinks=False)
                    if not _same_entry(backup, op.parent):
                        raise _DriftError(op.delta.path, "changed in the parent during copy-back")
                if op.delta.new is not None:
                    _stage(snapshot, op, fd, op.delta.new, algo)
            finally:
                os.close(fd)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, op.delta.path) from exc


def _apply_op(snapshot: Snapshot, op: _Op) -> None:
    """Put one path's new version in place (the step a failure test interrupts)."""
    if op.delta.new is not None:
        os.close(open_dir(snapshot.worktree, op.dir_rel))  # the source's ancestors, rechecked
    fd = open_dir(snapshot.repo, op.dir_rel)
    try:
        if op.delta.old is not None:
            now = os.stat(op.name, dir_fd=fd, follow_symlinks=False)
            if not _same_entry(now, op.parent):
                raise _DriftError(op.delta.path, "changed in the parent during copy-back")
        if op.temp is None:
            os.unlink(op.name, dir_fd=fd)
        elif op.delta.old is None:
            # link(2) fails if the name appeared meanwhile: a new file never clobbers.
            os.link(op.temp, op.name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            os.unlink(op.temp, dir_fd=fd)
            op.temp = None
        else:
            os.replace(op.temp, op.name, src_dir_fd=fd, dst_dir_fd=fd)
            op.temp = None
    finally:
        os.close(fd)


def _restore_op(snapshot: Snapshot, op: _Op) -> None:
    """Undo :func:`_apply_op` for one path from its backup (or by deleting a new file)."""
    fd = open_dir(snapshot.repo, op.dir_rel)
    try:
        if op.backup is None:
            os.unlink(op.name, dir_fd=fd)
        else:
            os.replace(op.backup, op.name, src_dir_fd=fd, dst_dir_fd=fd)
            op.backup = None
    finally:
        os.close(fd)


def _discard(snapshot: Snapshot, ops: list[_Op], created: list[str], *, backups: bool) -> None:
    """Remove leftover temps (and backups when asked) and the directories made for them."""
    for op in ops:
        for name in (op.temp, op.backup if backups else None):
            if name is None:
                continue
            try:
                fd = open_dir(snapshot.repo, op.dir_rel)
                try:
                    os.unlink(name, dir_fd=fd)
                finally:
                    os.close(fd)
            except OSError:
                continue  # already gone, or its directory was swapped: nothing safe to do
    for dir_rel in reversed(created):
        _remove_empty_dir(snapshot.repo, dir_rel)


def _remove_empty_dir(root: Path, dir_rel: str) -> bool:
    try:
        fd = open_dir(root, posixpath.dirname(dir_rel))
        try:
            os.rmdir(posixpath.basename(dir_rel), dir_fd=fd)
        finally:
            os.close(fd)
    except OSError:
        return False  # not empty (someone put files there) or no longer ours to remove
    return True


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
    snapshot: Snapshot, ops: list[_Op], done: list[Delta], review: ReviewStore, owner: str
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


def _prune_emptied(snapshot: Snapshot, ops: list[_Op]) -> None:
    """Remove directories that deleting the child's deleted files left empty, as Git would."""
    for op in ops:
        if op.delta.new is not None:
            continue
        dir_rel = op.dir_rel
        while dir_rel and _remove_empty_dir(snapshot.repo, dir_rel):
            dir_rel = posixpath.dirname(dir_rel)


def _conflict_error(snapshot: Snapshot, conflicts: list[Conflict]) -> str:
    first = conflicts[0]
    return (
        f"copy back from {snapshot.worktree}: {len(conflicts)} changed path(s) conflict with "
        f"the parent, first {first.path!r}: {first.reason}; nothing was copied back, the "
        "worktree is kept; resolve them and stop again, or discard the worktree"
    )


def _rollback(
    snapshot: Snapshot, applied: list[_Op], failed: _Op, cause: Exception
) -> tuple[list[str], list[str], str]:
    """Undo ``applied`` newest first: (restored, still applied, error line)."""
    restored: list[str] = []
    stuck: list[_Op] = []
    for op in reversed(applied):
        try:
            _restore_op(snapshot, op)
        except OSError:
            stuck.append(op)
        else:
            restored.append(op.delta.path)
    restored.reverse()
    why = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
    head = f"copy back from {snapshot.worktree}: applying {failed.delta.path!r} failed ({why})"
    if not stuck:
        return (
            restored,
            [],
            (
                f"{head}; the {len(restored)} path(s) applied before it were restored and the "
                "parent is unchanged; fix the cause and stop again"
            ),
        )
    kept = ", ".join(
        f"{op.delta.path!r} (original saved as {posixpath.join(op.dir_rel, op.backup or '')!r})"
        for op in stuck
    )
    return (
        restored,
        [op.delta.path for op in stuck],
        (
            f"{head}, and restoring {len(stuck)} path(s) failed too, so these still hold the "
            f"child's version: {kept}; restored: {', '.join(map(repr, restored)) or 'none'}; move "
            "each original back by hand"
        ),
    )


def finalize(snapshot: Snapshot, review: ReviewStore, owner: str) -> FinalizeResult:
    """Copy the child's changes back into the parent: every path, or none (see the module doc).

    Never raises for a conflict or a failed apply; those come back in the result. Raises
    :class:`~orchestrator.workspace._worktree.WorktreeError` only when the changes cannot be listed: Git
    fails, or the worktree's ``.git`` file no longer leads to the snapshot's repository.
    """
    algo, deltas = list_deltas(snapshot)
    changed = tuple(d.path for d in deltas)
    ops, done, conflicts = _plan(snapshot, deltas, algo)
    created: list[str] = []
    if not conflicts:
        try:
            _prepare(snapshot, ops, created, algo)
        except _DriftError as exc:
            conflicts.append(exc.conflict)
        except OSError as exc:
            _discard(snapshot, ops, created, backups=True)
            return FinalizeResult(
                changed=changed,
                error=(
                    f"copy back from {snapshot.worktree}: preparing {exc.filename or 'a file'} "
                    f"failed ({exc.strerror}); nothing in the parent changed; fix the cause and "
                    "stop again"
                ),
            )
    if conflicts:
        _discard(snapshot, ops, created, backups=True)
        error = _conflict_error(snapshot, conflicts)
        return FinalizeResult(changed=changed, conflicts=tuple(conflicts), error=error)
    for k, op in enumerate(ops):
        try:
            _apply_op(snapshot, op)
        except (OSError, _DriftError) as exc:
            restored, stuck, error = _rollback(snapshot, ops[:k], op, exc)
            keep = [o for o in ops[:k] if o.delta.path in stuck]
            _discard(snapshot, [o for o in ops if o not in keep], created, backups=True)
            return FinalizeResult(
                changed=changed, applied=tuple(stuck), restored=tuple(restored), error=error
            )
    _discard(snapshot, ops, [], backups=True)
    _prune_emptied(snapshot, ops)
    error = _record(snapshot, ops, done, review, owner)
    applied = tuple(sorted(d.path for d in [*(op.delta for op in ops), *done]))
    return FinalizeResult(changed=changed, applied=applied, error=error)
