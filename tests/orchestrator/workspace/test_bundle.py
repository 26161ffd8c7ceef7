"""Workspaces as git bundles, both ways, with real Git: the node side is the Ray actor's own
code (``ChildActor.receive`` / ``bring_back``) run in this process, the supervisor side
``bundle_of`` / ``import_bundle`` followed by the ordinary copy-back. A node's answer is
hostile input: each malformed or malicious bundle is one line and leaves the worktree as the
snapshot."""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

import pytest

from orchestrator.launch._ray import ChildActor
from orchestrator.workspace import _bundle
from orchestrator.workspace._bundle import bundle_of, import_bundle
from orchestrator.workspace._copyback import finalize
from orchestrator.workspace._git import WorktreeError
from orchestrator.workspace._review import ReviewStore
from orchestrator.workspace._worktree import Snapshot, create_worktree
from tests.orchestrator.workspace._gitutil import git, write

if TYPE_CHECKING:
    from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


@pytest.fixture
def snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Snapshot:
    for name, value in GIT_ENV.items():
        monkeypatch.setenv(name, value)
    repo = tmp_path / "repo"
    write(repo / "src" / "app.py", "def main():\n    return 42\n")
    write(repo / "README.md", "# sample\n")
    write(repo / "old.txt", "to be deleted\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    return create_worktree(repo, tmp_path / "worktree")


def ship(snapshot: Snapshot, node: Path, *, read_only: bool = False) -> ChildActor:
    actor = ChildActor()
    actor.receive(bundle_of(snapshot), str(node), read_only)
    return actor


def test_changes_made_on_the_node_come_back_and_apply(snapshot: Snapshot, tmp_path: Path) -> None:
    node = tmp_path / "node"
    actor = ship(snapshot, node)
    assert (node / "src" / "app.py").read_text() == "def main():\n    return 42\n"
    assert not (node / ".git").exists()  # the Git dir is the actor's, out of the child's view
    write(node / "src" / "app.py", "def main():\n    return 43\n")
    write(node / "NOTES.md", "new on the node\n")
    (node / "old.txt").unlink()
    commit = import_bundle(snapshot, actor.bring_back())
    assert git(snapshot.worktree, "rev-parse", f"{commit}^1") == snapshot.commit
    result = finalize(snapshot, ReviewStore(tmp_path / "review"), "a1")
    assert result.error == ""
    assert sorted(result.applied) == ["NOTES.md", "old.txt", "src/app.py"]
    assert (snapshot.repo / "src" / "app.py").read_text() == "def main():\n    return 43\n"
    assert (snapshot.repo / "NOTES.md").read_text() == "new on the node\n"
    assert not (snapshot.repo / "old.txt").exists()


def test_nothing_the_child_plants_runs_when_the_node_commits(
    snapshot: Snapshot, tmp_path: Path
) -> None:
    node = tmp_path / "node"
    actor = ship(snapshot, node)
    marker = tmp_path / "pwned"
    hook = f"#!/bin/sh\ntouch {marker}\n"
    for name in ("pre-commit", "post-commit", "pre-auto-gc", "fsmonitor-watchman"):
        write(node / ".git" / "hooks" / name, hook, mode=0o755)
    write(node / ".git" / "config", f"[core]\n\tfsmonitor = {node}/.git/hooks/pre-commit\n")
    write(node / ".gitattributes", "* filter=evil\n")
    write(node / "src" / "app.py", "changed\n")
    data = actor.bring_back()
    assert not marker.exists()
    import_bundle(snapshot, data)
    assert not marker.exists()
    listed = git(snapshot.worktree, "ls-files")
    assert ".git/config" not in listed
    assert (snapshot.worktree / "src" / "app.py").read_text() == "changed\n"


def test_a_read_only_child_gets_a_read_only_checkout(snapshot: Snapshot, tmp_path: Path) -> None:
    node = tmp_path / "node"
    ship(snapshot, node, read_only=True)
    for path in (node / "src" / "app.py", node / "README.md"):
        assert not os.stat(path).st_mode & 0o222, path
    os.chmod(node, 0o700)  # let pytest clean up


def hostile(snapshot: Snapshot, tmp_path: Path, entries: bytes) -> bytes:
    """A bundle on top of the snapshot whose tree is *entries* (``git mktree`` input)."""
    forge = tmp_path / "forge"
    git(tmp_path, "clone", "-q", "--no-checkout", str(snapshot.repo), str(forge))
    git(forge, "fetch", "-q", str(snapshot.repo), snapshot.commit)
    tree = (
        subprocess.run(
            ["git", "mktree", "--missing"],
            cwd=forge,
            input=entries,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    commit = git(forge, "commit-tree", "-p", snapshot.commit, "-m", "evil", tree)
    git(forge, "update-ref", "refs/heads/evil", commit)
    out = tmp_path / "evil.bundle"
    git(forge, "bundle", "create", "-q", str(out), "refs/heads/evil", f"^{snapshot.commit}")
    return out.read_bytes()


def blob(cwd: Path, text: bytes) -> str:
    return (
        subprocess.run(
            ["git", "hash-object", "-w", "--stdin"],
            cwd=cwd,
            input=text,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )


@pytest.mark.parametrize("name", [".git", ".GIT", ".."])
def test_a_bundle_with_a_dot_git_or_dotdot_entry_is_refused(
    snapshot: Snapshot, tmp_path: Path, name: str
) -> None:
    sha = blob(snapshot.repo, b"[core]\n\thooksPath = /tmp\n")
    inner = (
        subprocess.run(
            ["git", "mktree"],
            cwd=snapshot.repo,
            input=f"100644 blob {sha}\tconfig\n".encode(),
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    data = hostile(snapshot, tmp_path, f"040000 tree {inner}\t{name}\n".encode())
    with pytest.raises(WorktreeError, match="forbidden path"):
        import_bundle(snapshot, data)
    assert (snapshot.worktree / "src" / "app.py").read_text() == "def main():\n    return 42\n"
    assert not (snapshot.worktree / name / "config").exists()


def test_malformed_answers_are_one_line_and_touch_nothing(
    snapshot: Snapshot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(WorktreeError, match="is not a git bundle"):
        import_bundle(snapshot, b"junk\n")
    # A bundle that does not build on the snapshot (here: the snapshot itself, no prerequisite).
    with pytest.raises(WorktreeError, match="must build on the snapshot"):
        import_bundle(snapshot, bundle_of(snapshot))
    monkeypatch.setattr(_bundle, "MAX_BUNDLE", 10)
    with pytest.raises(WorktreeError, match="over the 10-byte cap"):
        import_bundle(snapshot, b"# v2 git bundle\n" + b"x" * 100)
    assert git(snapshot.worktree, "status", "--porcelain") == ""
