"""A worker's change as a patch the parent can read and ``git apply``: ``fleet diff aN``.

The patch is Git's own (``diff-index --cached -p --binary --full-index``, ``a/`` and ``b/``
prefixes), computed between the snapshot commit and a private index holding the child's
version of each changed path. The child's bytes are read from the worktree through the path
guard (no symlink followed on the way) and must hash to the version the changed set listed;
they are written as loose objects into a scratch object directory that borrows the
repository's objects, so nothing is added to the user's repository and no filter, text
conversion or external diff of the repository runs.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.workspace._changes import READ_FLAGS, Delta, blob_sha
from orchestrator.workspace._git import SYMLINK, WorktreeError, layout_of, neutral_env, run_git
from orchestrator.workspace._pathguard import open_dir

if TYPE_CHECKING:
    from collections.abc import Sequence

    from orchestrator.workspace._worktree import Snapshot

__all__ = ["patches"]

_DIFF = (
    "-c",
    "diff.noprefix=false",
    "diff-index",
    "--cached",
    "-p",
    "--binary",
    "--full-index",
    "--no-renames",
    "--no-ext-diff",
    "--no-textconv",
    "--no-color",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)


def _child_bytes(snapshot: Snapshot, delta: Delta, algo: str) -> bytes:
    assert delta.new is not None  # noqa: S101 - the caller passes only present versions
    fd = open_dir(snapshot.worktree, posixpath.dirname(delta.path))
    name = posixpath.basename(delta.path)
    try:
        if delta.new.mode == SYMLINK:
            data = os.fsencode(os.readlink(name, dir_fd=fd))
        else:
            src = os.open(name, READ_FLAGS, dir_fd=fd)
            try:
                chunks = []
                while chunk := os.read(src, 1 << 20):
                    chunks.append(chunk)
                data = b"".join(chunks)
            finally:
                os.close(src)
    finally:
        os.close(fd)
    if blob_sha(algo, len(data), [data]).hexdigest() != delta.new.sha:
        raise WorktreeError(
            f"diff {snapshot.worktree}: {delta.path!r} changed while being read; run diff again",
            path=snapshot.worktree,
        )
    return data


def _store(objects: Path, sha: str, data: bytes) -> None:
    """Write ``data`` as the loose blob ``sha`` under ``objects``."""
    folder = objects / sha[:2]
    folder.mkdir(exist_ok=True)
    (folder / sha[2:]).write_bytes(zlib.compress(b"blob %d\0" % len(data) + data))


def patches(snapshot: Snapshot, deltas: Sequence[Delta]) -> dict[str, str]:
    """Each delta's patch text (``git apply``-able from the repository root), by path.

    Raises :class:`WorktreeError` when Git fails or a file changes while it is read.
    """
    op = f"diff {snapshot.worktree}"
    layout = layout_of(snapshot.worktree, op)
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="fleet-patch-") as tmp:
        scratch = Path(tmp)
        objects = scratch / "objects"
        objects.mkdir()
        env = neutral_env(scratch, layout, work_tree=layout.root, index=scratch / "index")
        env |= {
            "GIT_OBJECT_DIRECTORY": str(objects),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(layout.objects),
            "GIT_LITERAL_PATHSPECS": "1",
        }
        cwd = layout.root  # pathspecs are read relative to the work tree
        run_git(["read-tree", snapshot.commit], cwd=cwd, env=env, op=op)
        zero = "0" * len(snapshot.commit)
        lines = []
        for delta in deltas:
            if delta.new is None:
                lines.append(f"0 {zero}\t{delta.path}")
                continue
            _store(objects, delta.new.sha, _child_bytes(snapshot, delta, layout.object_format))
            lines.append(f"{delta.new.mode:o} {delta.new.sha}\t{delta.path}")
        info = b"".join(os.fsencode(line) + b"\0" for line in lines)
        run_git(["update-index", "-z", "--index-info"], cwd=cwd, env=env, op=op, stdin=info)
        for delta in deltas:
            text = run_git([*_DIFF, snapshot.commit, "--", delta.path], cwd=cwd, env=env, op=op)
            out[delta.path] = text.decode(errors="replace")
    return out
