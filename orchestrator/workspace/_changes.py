"""List what a worker changed in its worktree since the snapshot, byte for byte.

The changed set is the worktree's state against the snapshot commit, compared byte for byte
(content hashed as Git blobs, no filters) with file type and executable bit. Hashing reads
through :func:`~orchestrator.workspace._pathguard.open_dir`, so no symlink is followed on the way.
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import attrs

from orchestrator.workspace._git import (
    GITLINK,
    SYMLINK,
    WorktreeError,
    layout_of,
    neutral_env,
    parse_raw,
    run_git,
    untracked,
)
from orchestrator.workspace._pathguard import open_dir

if TYPE_CHECKING:
    from orchestrator.workspace._worktree import Snapshot

ChangeStatus = Literal["added", "modified", "deleted", "mode", "type"]


@attrs.frozen(kw_only=True)
class Conflict:
    """A path that was not copied back (or not reverted), and why."""

    path: str
    reason: str


_CHUNK = 1 << 20
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})
_DIFF_INDEX = ("diff-index", "-z", "--raw", "--no-renames", "--ignore-submodules=all")


@attrs.frozen(kw_only=True)
class Change:
    """One path the child changed, relative to the workspace root."""

    path: str
    status: ChangeStatus


@attrs.frozen(kw_only=True)
class Version:
    """One side of a change as Git sees it; ``None`` in its place means the path is absent."""

    mode: int  # Git's: 0o100644, 0o100755 or 0o120000
    sha: str


@attrs.frozen(kw_only=True)
class Delta:
    """One changed path: its snapshot (``old``) and worktree (``new``) versions."""

    path: str
    status: ChangeStatus
    old: Version | None
    new: Version | None


def blob_sha(algo: str, size: int, chunks: list[bytes] | None = None) -> hashlib._Hash:
    """A hash primed with Git's blob header for ``size`` bytes, fed ``chunks`` when given."""
    digest = hashlib.new(algo, b"blob %d\0" % size)
    for chunk in chunks or ():
        digest.update(chunk)
    return digest


def copy_hashed(src: int, dst: int | None, algo: str) -> str:
    """Blob id of the open file ``src``, copying its bytes to ``dst`` on the way."""
    digest = blob_sha(algo, os.fstat(src).st_size)
    while chunk := os.read(src, _CHUNK):
        digest.update(chunk)
        if dst is not None:
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view) :]
    return digest.hexdigest()


def _git_mode(st: os.stat_result) -> int:
    if stat.S_ISLNK(st.st_mode):
        return SYMLINK
    return 0o100755 if st.st_mode & stat.S_IXUSR else 0o100644


def read_version(root: Path, path: str, algo: str) -> tuple[Version | None, os.stat_result | None]:
    """Git's view of ``root/path`` (no symlink followed on the way) and the stat it came from."""
    try:
        fd = open_dir(root, posixpath.dirname(path))
    except OSError as exc:
        if exc.errno in _ABSENT:
            return None, None
        raise
    name = posixpath.basename(path)
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            target = os.fsencode(os.readlink(name, dir_fd=fd))
            return Version(mode=SYMLINK, sha=blob_sha(algo, len(target), [target]).hexdigest()), st
        if not stat.S_ISREG(st.st_mode):
            return None, None
        src = os.open(name, READ_FLAGS, dir_fd=fd)
        try:
            st = os.fstat(src)
            return Version(mode=_git_mode(st), sha=copy_hashed(src, None, algo)), st
        finally:
            os.close(src)
    except FileNotFoundError:
        return None, None
    finally:
        os.close(fd)


def _status(old: Version | None, new: Version | None) -> ChangeStatus | None:
    if old == new:
        return None
    if old is None:
        return "added"
    if new is None:
        return "deleted"
    if (old.mode == SYMLINK) != (new.mode == SYMLINK):
        return "type"
    return "mode" if old.sha == new.sha else "modified"


def list_deltas(snapshot: Snapshot) -> tuple[str, list[Delta]]:
    """The object format and every path whose worktree state differs from the snapshot."""
    op = f"list changes in {snapshot.worktree}"
    layout = layout_of(snapshot.worktree, op)
    # The worktree's .git file is in the child's reach: it must still name this worktree's own
    # admin directory in the parent's repository, or every Git answer below could be another's.
    if (layout.root, layout.objects, layout.index.parent.parent) != (
        snapshot.worktree,
        layout_of(snapshot.repo, op).objects,
        layout.objects.parent / "worktrees",
    ):
        raise WorktreeError(
            f"{op}: its .git file no longer points into {snapshot.repo}'s worktree records; "
            "discard this worktree",
            repo=snapshot.repo,
            path=snapshot.worktree,
        )
    with tempfile.TemporaryDirectory(prefix="fleet-git-") as tmp:
        env = neutral_env(Path(tmp), layout, work_tree=layout.root, index=layout.index)
        out = run_git(
            [*_DIFF_INDEX, snapshot.commit],
            cwd=layout.root,
            env=env,
            op=op,
            repo=snapshot.repo,
        )
    old: dict[str, Version | None] = {
        c.path: None if c.old_mode == 0 else Version(mode=c.old_mode, sha=c.old_sha)
        for c in parse_raw(out)
        if GITLINK not in {c.old_mode, c.new_mode}
    }
    for path in untracked(layout, layout.index, op):
        old.setdefault(path, None)
    deltas = []
    for path in sorted(old):
        new, _ = read_version(layout.root, path, layout.object_format)
        status = _status(old[path], new)
        if status is not None:
            deltas.append(Delta(path=path, status=status, old=old[path], new=new))
    return layout.object_format, deltas


def changed_paths(snapshot: Snapshot) -> list[Change]:
    """Every path the child added, modified, deleted, re-moded or re-typed, sorted."""
    _, deltas = list_deltas(snapshot)
    return [Change(path=d.path, status=d.status) for d in deltas]
