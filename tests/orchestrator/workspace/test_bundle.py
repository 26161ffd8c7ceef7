"""Workspaces as git bundles, both ways, with real Git: the node side is the Ray actor's own
code (``ChildActor.receive`` / ``bring_back``) run in this process, the supervisor side
``ship_snapshot`` / ``import_bundle`` followed by the ordinary copy-back. A node's answer is
hostile input: each malformed or malicious bundle is one line and leaves the worktree as the
snapshot."""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

import pytest

from orchestrator.launch._ray_node import ChildActor
from orchestrator.workspace import _bundle
from orchestrator.workspace._bundle import import_bundle, ship_snapshot, ship_workspace
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


def ship(snapshot: Snapshot, node: Path, *, read_only: bool = False) -> tuple[ChildActor, str]:
    actor = ChildActor()
    shipped = ship_snapshot(snapshot)
    actor.receive(shipped.bundle, str(node), read_only)
    return actor, shipped.commit


def test_changes_made_on_the_node_come_back_and_apply(snapshot: Snapshot, tmp_path: Path) -> None:
    node = tmp_path / "node"
    actor, base = ship(snapshot, node)
    assert (node / "src" / "app.py").read_text() == "def main():\n    return 42\n"
    assert not (node / ".git").exists()  # the Git dir is the actor's, out of the child's view
    write(node / "src" / "app.py", "def main():\n    return 43\n")
    write(node / "NOTES.md", "new on the node\n")
    (node / "old.txt").unlink()
    commit = import_bundle(snapshot, actor.bring_back(), base)
    assert git(snapshot.worktree, "rev-parse", f"{commit}^1") == base
    # The node got one tree, not the project's history.
    assert git(snapshot.worktree, "rev-parse", f"{base}^{{tree}}") == git(
        snapshot.worktree, "rev-parse", f"{snapshot.commit}^{{tree}}"
    )
    assert git(snapshot.worktree, "rev-list", "--count", base) == "1"
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
    actor, base = ship(snapshot, node)
    marker = tmp_path / "pwned"
    hook = f"#!/bin/sh\ntouch {marker}\n"
    for name in ("pre-commit", "post-commit", "pre-auto-gc", "fsmonitor-watchman"):
        write(node / ".git" / "hooks" / name, hook, mode=0o755)
    write(node / ".git" / "config", f"[core]\n\tfsmonitor = {node}/.git/hooks/pre-commit\n")
    write(node / ".gitattributes", "* filter=evil\n")
    write(node / "src" / "app.py", "changed\n")
    data = actor.bring_back()
    assert not marker.exists()
    import_bundle(snapshot, data, base)
    assert not marker.exists()
    listed = git(snapshot.worktree, "ls-files")
    assert ".git/config" not in listed
    assert (snapshot.worktree / "src" / "app.py").read_text() == "changed\n"


def test_a_read_only_child_gets_a_read_only_checkout(snapshot: Snapshot, tmp_path: Path) -> None:
    node = tmp_path / "node"
    ship(snapshot, node, read_only=True)
    for path in (node / "src" / "app.py", node / "README.md"):
        assert not os.stat(path).st_mode & 0o222, path


def test_a_readers_checkout_is_the_workspace_as_it_is_now(
    snapshot: Snapshot, tmp_path: Path
) -> None:
    # Uncommitted and untracked work included, the repository itself untouched.
    write(snapshot.repo / "README.md", "# edited, not committed\n")
    write(snapshot.repo / "draft.txt", "untracked\n")
    before = git(snapshot.repo, "status", "--porcelain")
    refs = git(snapshot.repo, "for-each-ref")
    node = tmp_path / "reader"
    ChildActor().receive(ship_workspace(snapshot.repo).bundle, str(node), read_only=True)
    assert (node / "README.md").read_text() == "# edited, not committed\n"
    assert (node / "draft.txt").read_text() == "untracked\n"
    assert not os.stat(node / "draft.txt").st_mode & 0o222
    assert git(snapshot.repo, "status", "--porcelain") == before
    assert git(snapshot.repo, "for-each-ref") == refs


def hostile(snapshot: Snapshot, tmp_path: Path, entries: bytes) -> bytes:
    """A bundle on top of the snapshot whose tree is *entries* (``git mktree`` input); the
    tests pass the snapshot itself as the base it must build on."""
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
        import_bundle(snapshot, data, snapshot.commit)
    assert (snapshot.worktree / "src" / "app.py").read_text() == "def main():\n    return 42\n"
    assert not (snapshot.worktree / name / "config").exists()


def test_malformed_answers_are_one_line_and_touch_nothing(
    snapshot: Snapshot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(WorktreeError, match="is not a git bundle"):
        import_bundle(snapshot, b"junk\n", snapshot.commit)
    # A bundle that does not build on the snapshot (here: the snapshot itself, no prerequisite).
    with pytest.raises(WorktreeError, match="must build on the snapshot"):
        import_bundle(snapshot, ship_snapshot(snapshot).bundle, snapshot.commit)
    monkeypatch.setattr(_bundle, "MAX_BUNDLE", 10)
    with pytest.raises(WorktreeError, match="over the 10-byte cap"):
        import_bundle(snapshot, b"# v2 git bundle\n" + b"x" * 100, snapshot.commit)
    assert git(snapshot.worktree, "status", "--porcelain") == ""


def test_a_nodes_bundle_carrying_files_that_run_later_is_held_like_a_local_change(
    snapshot: Snapshot, tmp_path: Path
) -> None:
    """The bundle path into the parent's tree meets the same classifier (issue #36)."""
    node = tmp_path / "node"
    actor, base = ship(snapshot, node)
    planted = {
        ".claude/settings.json": '{"hooks": {"SessionStart": []}}',
        ".mcp.json": '{"mcpServers": {}}',
        ".envrc": "pwn\n",
        "package.json": '{"scripts": {"postinstall": "pwn"}}',
        ".vscode/tasks.json": '{"tasks": []}',
    }
    for rel, text in planted.items():
        write(node / rel, text)
    write(node / "run.sh", "#!/bin/sh\n", 0o755)
    (node / "link").symlink_to("README.md")
    write(node / "src" / "app.py", "def main():\n    return 43\n")
    import_bundle(snapshot, actor.bring_back(), base)

    result = finalize(snapshot, ReviewStore(tmp_path / "review"), "a1")

    assert result.applied == ("src/app.py",)
    assert sorted(h.path for h in result.held) == sorted([*planted, "link", "run.sh"])
    for rel in [*planted, "link", "run.sh"]:
        assert not os.path.lexists(snapshot.repo / rel)
    named = finalize(snapshot, ReviewStore(tmp_path / "review"), "a1", names=[".envrc"])
    assert (snapshot.repo / ".envrc").read_text() == "pwn\n"
    assert ".envrc" not in {h.path for h in named.held}


def test_a_bundle_with_two_heads_is_refused(snapshot: Snapshot, tmp_path: Path) -> None:
    # Both heads sit on the snapshot: which one would be checked out is the node's choice.
    node = tmp_path / "node"
    actor, base = ship(snapshot, node)
    write(node / "src" / "app.py", "def main():\n    return 43\n")
    one = tmp_path / "one.bundle"
    one.write_bytes(actor.bring_back())
    [(good, _)] = _bundle._header(one, "read")[1]
    # A bare repository borrowing the project's objects (the snapshot commit among them).
    forge = tmp_path / "forge.git"
    git(tmp_path, "init", "-q", "--bare", str(forge))
    (forge / "objects" / "info" / "alternates").write_text(f"{snapshot.repo}/.git/objects\n")
    git(forge, "fetch", "-q", str(one), f"{good}:refs/heads/a")
    evil = git(forge, "commit-tree", "-p", base, "-m", "evil", f"{good}^{{tree}}")
    git(forge, "update-ref", "refs/heads/b", evil)
    out = tmp_path / "two.bundle"
    git(forge, "bundle", "create", "-q", str(out), "refs/heads/a", "refs/heads/b", f"^{base}")
    assert len(_bundle._header(out, "read")[1]) == 2
    with pytest.raises(WorktreeError, match="carry one head"):
        import_bundle(snapshot, out.read_bytes(), base)
    assert (snapshot.worktree / "src" / "app.py").read_text() == "def main():\n    return 42\n"
    assert git(snapshot.worktree, "status", "--porcelain") == ""
