"""Workspaces that travel: a worktree child on another node gets its snapshot as a git bundle,
and its changes come back as one.

Out: :func:`bundle_of` packs the snapshot commit (the local worktree's detached ``HEAD``); the
node checks it out in a directory of its own (``orchestrator.launch._ray``). Back: the node
commits what the child left and bundles ``snapshot..HEAD``; :func:`import_bundle` takes it
into the local worktree, which then goes through the very copy-back a local child's does —
the path guard, the drift check, the all-or-restore apply (:mod:`._copyback`).

The returned bundle is the output of a process the child could tamper with, so it is treated
as hostile: it must be at most :data:`MAX_BUNDLE` bytes, have the snapshot commit as its only
prerequisite and one head whose parent is the snapshot, pass Git's object checks
(``fetch.fsckObjects``) and name no ``.git``, ``.`` or ``..`` path component (checked here,
and again by Git's ``read-tree``); only the tree of its head is used (checked out
into the local worktree with the neutral environment, so no attribute, filter or hook of the
repository runs). Anything else is one line and the local worktree is left as the snapshot.
"""

import tempfile
from pathlib import Path
from typing import Final

import attrs

from orchestrator.workspace._git import (
    GitLayout,
    WorktreeError,
    git_env,
    layout_of,
    neutral_env,
    run_git,
)
from orchestrator.workspace._worktree import IDENTITY as _IDENTITY
from orchestrator.workspace._worktree import Snapshot, snapshot_commit

__all__ = ["MAX_BUNDLE", "Shipped", "import_bundle", "ship_snapshot", "ship_workspace"]

#: The largest bundle a node may send back.
MAX_BUNDLE: Final = 256 * 1024 * 1024

_CHECKED = ("-c", "fetch.fsckObjects=true", "-c", "transfer.fsckObjects=true")


@attrs.frozen(kw_only=True)
class Shipped:
    """What went to a node: the bundle, and the commit in it the node's changes must build on
    (the snapshot's tree with no history, so the bundle carries one tree, not the project's
    whole past), and that tree's id."""

    bundle: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    commit: str
    tree: str


def ship_snapshot(snapshot: Snapshot) -> Shipped:
    """A worktree child's snapshot, for its node."""
    return _ship(layout_of(snapshot.worktree, f"bundle {snapshot.worktree}"), snapshot.commit)


def ship_workspace(repo: Path, reuse: Shipped | None = None) -> Shipped:
    """The workspace containing *repo* as it is now (uncommitted and untracked changes
    included, as a worktree snapshot takes them), for a reading child's node: *reuse* itself
    when it carries the very same tree (a reader's checkout is its tree alone), so an unchanged
    workspace is snapshotted but not bundled again. Nothing of the repository changes: no ref,
    no index; the new objects are unreachable, for ``git gc``."""
    op = f"snapshot {repo}"
    layout = layout_of(repo, op)
    return _ship(layout, snapshot_commit(layout, op), reuse)


def _ship(layout: GitLayout, commit: str, reuse: Shipped | None = None) -> Shipped:
    op = f"bundle {layout.root}"
    env = git_env() | _IDENTITY
    tree = run_git(["rev-parse", f"{commit}^{{tree}}"], cwd=layout.root, env=env, op=op)
    tree_id = tree.decode().strip()
    if reuse is not None and reuse.tree == tree_id:
        return reuse
    shipped = (
        run_git(
            ["commit-tree", "--no-gpg-sign", "-m", "fleet: a snapshot for a node", tree_id],
            cwd=layout.root,
            env=env,
            op=op,
        )
        .decode()
        .strip()
    )
    with tempfile.TemporaryDirectory(prefix="fleet-bundle-") as tmp:
        # A bare shelf borrowing the repository's objects: a ref for the bundle to name,
        # outside the user's repository.
        shelf = Path(tmp) / "shelf.git"
        fmt = f"--object-format={layout.object_format}"
        run_git(["init", "-q", "--bare", fmt, str(shelf)], cwd=Path(tmp), env=git_env(), op=op)
        (shelf / "objects" / "info" / "alternates").write_text(f"{layout.objects}\n")
        shelf_env = git_env() | {"GIT_DIR": str(shelf)}
        run_git(["update-ref", "refs/heads/snapshot", shipped], cwd=shelf, env=shelf_env, op=op)
        run_git(["symbolic-ref", "HEAD", "refs/heads/snapshot"], cwd=shelf, env=shelf_env, op=op)
        path = Path(tmp) / "out.bundle"
        run_git(["bundle", "create", "-q", str(path), "HEAD"], cwd=shelf, env=shelf_env, op=op)
        return Shipped(bundle=path.read_bytes(), commit=shipped, tree=tree_id)


def import_bundle(snapshot: Snapshot, data: bytes, base: str) -> str:
    """Check the node's *data* out into *snapshot*'s worktree; the commit it carried.

    Raises :class:`WorktreeError` (one line, the worktree untouched) for a bundle that is too
    big, is not a bundle, does not build on the commit shipped to the node (*base*), or fails
    Git's object checks.
    """
    op = f"import the changes of {snapshot.worktree}"
    if len(data) > MAX_BUNDLE:
        raise WorktreeError(
            f"{op}: the node sent {len(data)} bytes, over the {MAX_BUNDLE}-byte cap; the "
            "worktree is left as the snapshot",
            path=snapshot.worktree,
        )
    env = git_env()
    cwd = snapshot.worktree
    with tempfile.TemporaryDirectory(prefix="fleet-bundle-") as tmp:
        path = Path(tmp) / "back.bundle"
        path.write_bytes(data)
        prerequisites, heads = _header(path, op)
        if prerequisites != [f"-{base}"] or len(heads) != 1:
            raise WorktreeError(
                f"{op}: the bundle must build on the snapshot {base[:12]} alone and "
                "carry one head; the worktree is left as the snapshot",
                path=cwd,
            )
        head = heads[0]
        run_git(
            [*_CHECKED, "fetch", "-q", "--no-tags", str(path), head[1]], cwd=cwd, env=env, op=op
        )
        commit = head[0]
        parent = run_git(["rev-parse", "--verify", f"{commit}^1"], cwd=cwd, env=env, op=op)
        if parent.decode().strip() != base:
            raise WorktreeError(
                f"{op}: the node's commit does not sit on the snapshot; the worktree is left "
                "as the snapshot",
                path=cwd,
            )
        listed = run_git(["ls-tree", "-r", "-z", "--name-only", commit], cwd=cwd, env=env, op=op)
        for raw in listed.split(b"\0"):
            if raw and not _allowed(raw):
                name = raw.decode(errors="replace")
                raise WorktreeError(
                    f"{op}: the bundle names a forbidden path {name!r}; the worktree is left as "
                    "the snapshot",
                    path=cwd,
                )
        inner = layout_of(cwd, op)
        scratch = Path(tmp) / "neutral"
        scratch.mkdir()
        checkout = neutral_env(scratch, inner, work_tree=inner.root, index=inner.index)
        run_git(["read-tree", "--reset", "-u", commit], cwd=inner.root, env=checkout, op=op)
    return commit


def _allowed(path: bytes) -> bool:
    """No ``.git`` (any case), ``.``, ``..`` or empty component (Git's ``read-tree`` refuses
    them too; this says so in one line before anything is checked out)."""
    return all(
        part and part not in (b".", b"..") and part.lower() != b".git" for part in path.split(b"/")
    )


def _header(path: Path, op: str) -> tuple[list[str], list[tuple[str, str]]]:
    """A v2 bundle's prerequisites (``-SHA``) and heads (``(SHA, ref)``), read by hand: Git's
    own ``bundle list-heads`` would accept a bundle we then refuse anyway."""
    with path.open("rb") as handle:
        signature = handle.readline()
        if signature != b"# v2 git bundle\n":
            raise WorktreeError(f"{op}: the node's answer is not a git bundle", path=path)
        prerequisites: list[str] = []
        heads: list[tuple[str, str]] = []
        for _ in range(10_000):
            line = handle.readline(4096)
            if line in (b"\n", b""):
                break
            text = line.decode("ascii", errors="replace").rstrip("\n")
            if text.startswith("-"):
                prerequisites.append(text.split(" ", 1)[0])
            else:
                sha, _, ref = text.partition(" ")
                heads.append((sha, ref))
        else:
            raise WorktreeError(f"{op}: the bundle's header never ends", path=path)
    return prerequisites, heads
