"""Snapshot a workspace into a detached Git worktree without running a filter or a hook.

The snapshot is the exact workspace a worker starts from: ``HEAD`` plus tracked changes (staged
and unstaged) plus untracked files that are not ignored, as a commit that no branch points to.
Only the detached worktree's ``HEAD`` names it, which also keeps it alive through ``git gc``.

Byte fidelity comes from never letting Git convert content. Objects are written with
``hash-object --no-filters``; every command that compares or checks out work-tree files runs in
the neutral environment of :mod:`orchestrator.workspace._git`, and the one porcelain command used,
``git worktree add --no-checkout``, runs no checkout hook at all.

The parent's index is copied, never written: the copy keeps the original's timestamp so Git's
racy-entry rules judge it exactly as they would the original. The parent's ``HEAD``, branches,
stash and index are untouched.

All functions are synchronous and keep no shared state; call them from a worker thread.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from orchestrator.workspace._git import (
    GITLINK,
    SYMLINK,
    GitLayout,
    RawChange,
    WorktreeError,
    git_env,
    layout_of,
    neutral_env,
    parse_raw,
    run_git,
    untracked,
)
from orchestrator.workspace._pathguard import lstat_below

if TYPE_CHECKING:
    from collections.abc import Mapping

# WorktreeError is raised here and caught by callers of create_worktree; it lives in _git
# because run_git raises it too.
__all__ = [
    "IDENTITY",
    "Snapshot",
    "WorktreeError",
    "create_worktree",
    "remove_worktree",
    "snapshot_commit",
]

_CONVERTING = ("text", "eol", "crlf", "ident", "filter", "working-tree-encoding")
# The snapshot commit is internal bookkeeping: a fixed identity, no signature.
IDENTITY = {
    "GIT_AUTHOR_NAME": "fleet",
    "GIT_AUTHOR_EMAIL": "fleet@localhost",
    "GIT_COMMITTER_NAME": "fleet",
    "GIT_COMMITTER_EMAIL": "fleet@localhost",
}


@attrs.frozen(kw_only=True)
class Snapshot:
    """A workspace frozen into a detached worktree; enough to finalize it after a restart."""

    repo: Path
    worktree: Path
    commit: str

    def as_json(self) -> dict[str, str]:
        """The record a later supervisor reads back with :meth:`from_json` (journal, registry)."""
        return {"repo": str(self.repo), "path": str(self.worktree), "commit": self.commit}

    @classmethod
    def from_json(cls, data: Mapping[str, str]) -> Snapshot:
        return cls(repo=Path(data["repo"]), worktree=Path(data["path"]), commit=data["commit"])


def _c_quote(path: bytes) -> bytes:
    """Quote a path the way ``hash-object --stdin-paths`` unquotes, if it needs quoting."""
    if not any(b < 0x20 or b in b'"\\' for b in path):
        return path
    body = b"".join(
        b"\\" + bytes([b]) if b in b'"\\' else b"\\%03o" % b if b < 0x20 else bytes([b])
        for b in path
    )
    return b'"' + body + b'"'


def _write_objects(
    layout: GitLayout, scratch: Path, paths: list[str], env: Mapping[str, str], op: str
) -> list[bytes]:
    """Write the current content of ``paths`` as blobs; ``index-info`` lines, removals first."""
    removals: list[bytes] = []
    modes: list[int] = []
    names: list[str] = []
    sources: list[bytes] = []
    zero = b"0" * (40 if layout.object_format == "sha1" else 64)
    for name in paths:
        st = lstat_below(layout.root, name)
        if st is None or not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            removals.append(b"0 " + zero + b"\t" + os.fsencode(name) + b"\0")
            continue
        source = layout.root / name
        if stat.S_ISLNK(st.st_mode):
            # A symlink is stored as a link: its blob is the target, never the target's content.
            source = scratch / f"link{len(sources)}"
            source.write_bytes(os.fsencode(os.readlink(layout.root / name)))
            modes.append(SYMLINK)
        else:
            modes.append(0o100755 if st.st_mode & stat.S_IXUSR else 0o100644)
        names.append(name)
        sources.append(_c_quote(os.fsencode(source)))
    if not sources:
        return removals
    out = run_git(
        ["hash-object", "-w", "--no-filters", "--stdin-paths"],
        cwd=layout.root,
        env=env,
        op=op,
        stdin=b"\n".join(sources) + b"\n",
    )
    shas = out.split()
    return removals + [
        b"%o %s\t%s\0" % (mode, sha, os.fsencode(name))
        for mode, sha, name in zip(modes, shas, names, strict=True)
    ]


def _refuse_submodule_changes(
    layout: GitLayout, changes: list[RawChange], gitlinks: list[str], op: str
) -> None:
    moved = (c.path for c in changes if GITLINK in {c.old_mode, c.new_mode})
    populated = (p for p in gitlinks if (layout.root / p / ".git").exists())
    path = next(
        itertools.chain(moved, (p for p in populated if _is_dirty(layout.root / p, op))), None
    )
    if path is not None:
        raise WorktreeError(
            f"{op}: submodule {path!r} has changes (moved HEAD, modified or untracked files) "
            "that a snapshot cannot carry; commit them in the submodule and record the new "
            "commit in the parent, or discard them, then retry",
            repo=layout.root,
            path=layout.root / path,
        )


def _index_modes(out: bytes) -> dict[str, int]:
    """Path → mode from ``git ls-files -z --stage`` (an unmerged path appears once)."""
    modes = {}
    for line in out.split(b"\0")[:-1]:
        meta, path = line.split(b"\t", 1)
        modes[os.fsdecode(path)] = int(meta.split(b" ", 1)[0], 8)
    return modes


def _converted(layout: GitLayout, paths: list[str], op: str) -> list[str]:
    """Tracked files whose bytes Git converts on add, so their index blob is not their bytes.

    Such a file can be clean by ``git status`` yet differ from its blob (CRLF work-tree files
    under ``core.autocrlf``, an LFS file and its pointer): the snapshot hashes its real bytes.
    """
    env = git_env()
    autocrlf = run_git(
        ["config", "--default", "false", "--get", "core.autocrlf"], cwd=layout.root, env=env, op=op
    )
    if autocrlf.strip().lower() in {b"true", b"yes", b"on", b"1", b"input"}:
        return paths
    out = run_git(
        ["check-attr", "-z", "--stdin", *_CONVERTING],
        cwd=layout.root,
        env=env,
        op=op,
        stdin=b"".join(os.fsencode(p) + b"\0" for p in paths),
    )
    fields = out.split(b"\0")
    return [
        os.fsdecode(path)
        for path, value in zip(fields[0:-1:3], fields[2::3], strict=True)
        if value not in {b"unspecified", b"unset"}
    ]


def _is_dirty(root: Path, op: str) -> bool:
    """Whether a (submodule) work tree differs from its index or has untracked files."""
    layout = layout_of(root, op)
    with tempfile.TemporaryDirectory(prefix="fleet-git-") as tmp:
        env = neutral_env(Path(tmp), layout, work_tree=layout.root, index=layout.index)
        out = run_git(
            ["diff-files", "-z", "--name-only", "--ignore-submodules=dirty"],
            cwd=layout.root,
            env=env,
            op=op,
        )
    return bool(out) or bool(untracked(layout, layout.index, op))


def _private_index(layout: GitLayout, scratch: Path) -> Path:
    """A copy of the work tree's index (timestamps kept) that the snapshot may rewrite."""
    index = scratch / "index"
    if layout.index.exists():
        shutil.copy2(layout.index, index)
    return index


def _snapshot_commit(layout: GitLayout, op: str) -> str:
    with tempfile.TemporaryDirectory(prefix="fleet-git-") as tmp:
        scratch = Path(tmp)
        index = _private_index(layout, scratch)
        env = neutral_env(scratch, layout, work_tree=layout.root, index=index)
        cwd = layout.root
        out = run_git(
            ["diff-files", "-z", "--raw", "--ignore-submodules=dirty"], cwd=cwd, env=env, op=op
        )
        changes = parse_raw(out)
        modes = _index_modes(run_git(["ls-files", "-z", "--stage"], cwd=cwd, env=env, op=op))
        gitlinks = [path for path, mode in modes.items() if mode == GITLINK]
        _refuse_submodule_changes(layout, changes, gitlinks, op)
        files = [path for path, mode in modes.items() if stat.S_ISREG(mode)]
        candidates = {c.path for c in changes} | set(untracked(layout, index, op))
        paths = sorted(candidates | set(_converted(layout, files, op)))
        lines = _write_objects(layout, scratch, paths, env, op)
        if lines:
            run_git(
                ["update-index", "-z", "--index-info"],
                cwd=cwd,
                env=env,
                op=op,
                stdin=b"".join(lines),
            )
        tree = run_git(["write-tree"], cwd=cwd, env=env, op=op).decode().strip()
    parents: list[str] = []
    try:
        head = run_git(
            ["rev-parse", "-q", "--verify", "HEAD^{commit}"], cwd=cwd, env=git_env(), op=op
        )
        parents = ["-p", head.decode().strip()]
    except WorktreeError:
        pass  # an unborn HEAD: the snapshot is a root commit
    out = run_git(
        ["commit-tree", "--no-gpg-sign", *parents, "-m", f"fleet snapshot of {layout.root}", tree],
        cwd=cwd,
        env=git_env() | IDENTITY,
        op=op,
    )
    return out.decode().strip()


def snapshot_commit(layout: GitLayout, op: str) -> str:
    """The workspace of *layout* as one commit (on ``HEAD``; changes and untracked files
    included), written with a private index: the repository's own index, refs and files are
    untouched."""
    return _snapshot_commit(layout, op)


def create_worktree(repo: Path, dest: Path) -> Snapshot:
    """Snapshot the workspace containing ``repo`` and check it out, detached, at ``dest``.

    ``dest`` must not exist or be an empty directory. Raises :class:`WorktreeError` when ``repo``
    is not in a Git work tree, a submodule has changes, or Git fails; a half-made worktree is
    removed again.
    """
    op = f"snapshot {repo}"
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise WorktreeError(
            f"create worktree {dest}: the destination exists and is not an empty directory; "
            "pass a new path",
            repo=repo,
            path=dest,
        )
    layout = layout_of(repo, op)
    commit = _snapshot_commit(layout, op)
    run_git(
        ["worktree", "add", "--detach", "--no-checkout", str(dest), commit],
        cwd=layout.root,
        env=git_env(),
        op=op,
        repo=layout.root,
    )
    snapshot = Snapshot(repo=layout.root, worktree=Path(os.path.realpath(dest)), commit=commit)
    try:
        inner = layout_of(snapshot.worktree, op)
        with tempfile.TemporaryDirectory(prefix="fleet-git-") as tmp:
            env = neutral_env(Path(tmp), inner, work_tree=inner.root, index=inner.index)
            run_git(["read-tree", "--reset", "-u", commit], cwd=inner.root, env=env, op=op)
    except BaseException:
        remove_worktree(snapshot)
        raise
    return snapshot


def remove_worktree(snapshot: Snapshot) -> None:
    """Delete the worktree and Git's record of it; safe to call when it is already gone.

    Never touches the parent's ``HEAD``, index or branches; the snapshot commit becomes
    unreachable and ``git gc`` collects it.
    """
    op = f"remove worktree {snapshot.worktree}"
    if snapshot.worktree.exists():
        run_git(
            ["worktree", "remove", "--force", str(snapshot.worktree)],
            cwd=snapshot.repo,
            env=git_env(),
            op=op,
            repo=snapshot.repo,
        )
    run_git(["worktree", "prune"], cwd=snapshot.repo, env=git_env(), op=op, repo=snapshot.repo)
