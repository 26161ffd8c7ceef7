"""Copy-back's file operations: stage every replacement and backup, apply, restore, clean up.

:mod:`orchestrator.workspace._copyback` decides what to copy back and in which order; the steps
here touch the parent repository, each through directory descriptors opened by the path guard
(every ancestor rechecked at use), and each undoable until the last one has run.
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
    Conflict,
    Delta,
    Version,
    blob_sha,
    copy_hashed,
)
from orchestrator.workspace._git import SYMLINK
from orchestrator.workspace._pathguard import open_dir

if TYPE_CHECKING:
    from pathlib import Path

    from orchestrator.workspace._worktree import Snapshot

__all__ = [
    "DriftError",
    "Op",
    "apply_op",
    "discard",
    "prepare",
    "prune_emptied",
    "restore_op",
    "rollback",
]

_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@attrs.define(eq=False)
class Op:
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


class DriftError(Exception):
    """A file changed under the copy-back between its check and its use."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.conflict = Conflict(path=path, reason=reason)


def fresh_name(kind: str) -> str:
    # Not derived from the file's name, so a 255-byte name still gets a temp beside it.
    return f".fleet-{kind}-{secrets.token_hex(8)}"


def permissions(op: Op, source: os.stat_result) -> int:
    """Keep the parent file's permission bits; a new file takes the worktree file's."""
    replaced = op.parent is not None and stat.S_ISREG(op.parent.st_mode)
    bits = (op.parent.st_mode if replaced and op.parent else source.st_mode) & 0o777
    if op.delta.new is not None and op.delta.new.mode == 0o100755:
        return bits | 0o100 | (bits & 0o444) >> 2
    return bits & ~0o111


def stage(snapshot: Snapshot, op: Op, fd: int, new: Version, algo: str) -> None:
    """Write the child's version of ``op`` as ``op.temp`` in the open destination directory."""
    src_dir = open_dir(snapshot.worktree, op.dir_rel)
    try:
        if new.mode == SYMLINK:
            target = os.readlink(op.name, dir_fd=src_dir)
            raw = os.fsencode(target)
            sha = blob_sha(algo, len(raw), [raw]).hexdigest()
            op.temp = fresh_name("new")
            os.symlink(target, op.temp, dir_fd=fd)
        else:
            src = os.open(op.name, READ_FLAGS, dir_fd=src_dir)
            try:
                op.temp = fresh_name("new")
                dst = os.open(op.temp, _NEW_FLAGS, 0o600, dir_fd=fd)
                try:
                    sha = copy_hashed(src, dst, algo)
                    os.fchmod(dst, permissions(op, os.fstat(src)))
                    os.fsync(dst)  # the parent's file is the user's data: durable before rename
                finally:
                    os.close(dst)
            finally:
                os.close(src)
    finally:
        os.close(src_dir)
    if sha != new.sha:
        raise DriftError(op.delta.path, "changed in the worktree during copy-back; stop again")


def same_entry(a: os.stat_result, b: os.stat_result | None) -> bool:
    return b is not None and (a.st_ino, a.st_size, a.st_mtime_ns) == (
        b.st_ino,
        b.st_size,
        b.st_mtime_ns,
    )


def prepare(snapshot: Snapshot, ops: list[Op], created: list[str], algo: str) -> None:
    """Stage every temp and backup; an ``OSError`` names the repository path it failed on."""
    for op in ops:
        try:
            fd = open_dir(snapshot.repo, op.dir_rel, created if op.delta.new else None)
            try:
                if op.delta.old is not None:
                    op.backup = fresh_name("old")
                    os.link(op.name, op.backup, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
                    backup = os.stat(op.backup, dir_fd=fd, follow_symlinks=False)
                    if not same_entry(backup, op.parent):
                        raise DriftError(op.delta.path, "changed in the parent during copy-back")
                if op.delta.new is not None:
                    stage(snapshot, op, fd, op.delta.new, algo)
            finally:
                os.close(fd)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, op.delta.path) from exc


def apply_op(snapshot: Snapshot, op: Op) -> None:
    """Put one path's new version in place (the step a failure test interrupts)."""
    if op.delta.new is not None:
        os.close(open_dir(snapshot.worktree, op.dir_rel))  # the source's ancestors, rechecked
    fd = open_dir(snapshot.repo, op.dir_rel)
    try:
        if op.delta.old is not None:
            now = os.stat(op.name, dir_fd=fd, follow_symlinks=False)
            if not same_entry(now, op.parent):
                raise DriftError(op.delta.path, "changed in the parent during copy-back")
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


def restore_op(snapshot: Snapshot, op: Op) -> None:
    """Undo :func:`apply_op` for one path from its backup (or by deleting a new file)."""
    fd = open_dir(snapshot.repo, op.dir_rel)
    try:
        if op.backup is None:
            os.unlink(op.name, dir_fd=fd)
        else:
            os.replace(op.backup, op.name, src_dir_fd=fd, dst_dir_fd=fd)
            op.backup = None
    finally:
        os.close(fd)


def discard(snapshot: Snapshot, ops: list[Op], created: list[str], *, backups: bool) -> None:
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
        remove_empty_dir(snapshot.repo, dir_rel)


def remove_empty_dir(root: Path, dir_rel: str) -> bool:
    try:
        fd = open_dir(root, posixpath.dirname(dir_rel))
        try:
            os.rmdir(posixpath.basename(dir_rel), dir_fd=fd)
        finally:
            os.close(fd)
    except OSError:
        return False  # not empty (someone put files there) or no longer ours to remove
    return True


def prune_emptied(snapshot: Snapshot, ops: list[Op]) -> None:
    """Remove directories that deleting the child's deleted files left empty, as Git would."""
    for op in ops:
        if op.delta.new is not None:
            continue
        dir_rel = op.dir_rel
        while dir_rel and remove_empty_dir(snapshot.repo, dir_rel):
            dir_rel = posixpath.dirname(dir_rel)


def rollback(
    snapshot: Snapshot, applied: list[Op], failed: Op, cause: Exception
) -> tuple[list[str], list[str], str]:
    """Undo ``applied`` newest first: (restored, still applied, error line)."""
    restored: list[str] = []
    stuck: list[Op] = []
    for op in reversed(applied):
        try:
            restore_op(snapshot, op)
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
