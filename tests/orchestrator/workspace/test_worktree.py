"""Snapshots into detached worktrees, against real Git repositories."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator.workspace._worktree import (
    Snapshot,
    WorktreeError,
    create_worktree,
    remove_worktree,
)
from tests.orchestrator.workspace._gitutil import git, write


def tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[str, int, bytes]]:
    """Every entry under ``root`` but ``.git``: kind, executable bit, bytes (or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in [*filenames, *(d for d in dirnames if Path(dirpath, d).is_symlink())]:
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            if name == ".git" or rel.startswith(skip):
                continue
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", 0, os.fsencode(os.readlink(path)))
            else:
                out[rel] = ("file", st.st_mode & stat.S_IXUSR, path.read_bytes())
    return out


@pytest.fixture
def repo(tmp_path: Path, git_home) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    for name in ("a.txt", "b.txt", "c.txt", "d.txt", "e.txt"):
        write(root / name, f"{name} line 1\nline 2\n")
    write(root / "tool.sh", "#!/bin/sh\necho tool\n")
    write(root / "bin.dat", bytes(range(256)))
    write(root / ".gitignore", "*.log\nbuild/\n")
    write(root / "pkg" / "mod.py", "x = 1\n")
    (root / "link").symlink_to("a.txt")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "initial")
    return root


def dirty(root: Path) -> None:
    """Staged, unstaged, both, deleted, untracked, ignored, +x, symlink and binary changes."""
    write(root / "a.txt", "staged only\n")
    git(root, "add", "a.txt")
    write(root / "b.txt", "unstaged\r\nwith CRLF\r\n")
    write(root / "c.txt", "staged first\n")
    git(root, "add", "c.txt")
    write(root / "c.txt", "then edited again\n")
    (root / "d.txt").unlink()
    git(root, "rm", "-q", "--cached", "e.txt")  # staged deletion of a file that stays: untracked
    (root / "tool.sh").chmod(0o755)
    write(root / "bin.dat", b"\0\xff\xfe binary\r\n\0" * 100)
    write(root / "staged-new.txt", "new and staged\n")
    git(root, "add", "staged-new.txt")
    write(root / "new" / "deep" / "n.txt", "untracked\n")
    (root / "new" / "to-dir").symlink_to("deep")
    (root / "dangling").symlink_to("does/not/exist")
    (root / "link").unlink()
    (root / "link").symlink_to("b.txt")
    write(root / "debug.log", "ignored\n")
    write(root / "build" / "out.bin", b"ignored")


def test_snapshot_is_the_exact_workspace_without_ignored_files(repo, tmp_path):
    dirty(repo)
    snap = create_worktree(repo, tmp_path / "wt")
    assert snap.repo == repo
    assert snap.worktree == tmp_path / "wt"
    expected = tree(repo, skip=("debug.log", "build/"))
    assert "e.txt" in expected
    assert "d.txt" not in expected
    assert tree(snap.worktree) == expected
    listing = git(repo, "ls-tree", "-r", snap.commit)
    assert "120000 blob" in next(line for line in listing.splitlines() if line.endswith("\tlink"))
    assert "100755 blob" in next(line for line in listing.splitlines() if "tool.sh" in line)
    assert git(repo, "cat-file", "blob", f"{snap.commit}:link") == "b.txt"


def test_snapshot_commit_is_on_no_branch_and_parents_head(repo, tmp_path):
    dirty(repo)
    head = git(repo, "rev-parse", "HEAD")
    snap = create_worktree(repo, tmp_path / "wt")
    assert git(snap.worktree, "rev-parse", "HEAD") == snap.commit
    assert git(repo, "rev-parse", f"{snap.commit}^") == head
    assert git(repo, "for-each-ref", "--contains", snap.commit) == ""
    assert git(snap.worktree, "status", "--porcelain") == ""


def test_parent_index_head_branches_and_stash_are_untouched(repo, tmp_path):
    write(repo / "a.txt", "stashed\n")
    git(repo, "stash", "-q")
    git(repo, "branch", "feature")
    dirty(repo)
    index = repo / ".git" / "index"
    before = (
        index.read_bytes(),
        index.stat().st_mtime_ns,
        git(repo, "symbolic-ref", "HEAD"),
        git(repo, "rev-parse", "HEAD"),
        git(repo, "for-each-ref"),
        git(repo, "stash", "list"),
        tree(repo),
    )
    create_worktree(repo, tmp_path / "wt")
    after = (
        index.read_bytes(),
        index.stat().st_mtime_ns,
        git(repo, "symbolic-ref", "HEAD"),
        git(repo, "rev-parse", "HEAD"),
        git(repo, "for-each-ref"),
        git(repo, "stash", "list"),
        tree(repo),
    )
    assert after == before


def test_snapshot_of_a_repository_without_commits(tmp_path, git_home):
    root = tmp_path / "empty"
    root.mkdir()
    git(root, "init", "-q")
    write(root / "staged.txt", "staged\n")
    git(root, "add", "staged.txt")
    write(root / "sub" / "untracked.bin", b"\0\1\2")
    snap = create_worktree(root, tmp_path / "wt")
    assert tree(snap.worktree) == tree(root)
    assert set(tree(snap.worktree)) == {"staged.txt", "sub/untracked.bin"}
    assert git(root, "rev-list", "--parents", "-n1", snap.commit) == snap.commit


def test_snapshot_of_a_linked_worktree(repo, tmp_path):
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", str(linked), "-b", "feature")
    write(linked / "a.txt", "changed in the linked worktree\n")
    write(linked / "only-here.txt", "untracked\n")
    snap = create_worktree(linked, tmp_path / "wt")
    assert snap.repo == linked
    assert tree(snap.worktree) == tree(linked)
    assert git(repo, "rev-parse", f"{snap.commit}^") == git(linked, "rev-parse", "HEAD")
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"


def test_no_filter_ident_eol_conversion_or_hook_runs(repo, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    write(repo / ".gitattributes", "*.txt filter=upper ident text eol=crlf\n")
    write(repo / "a.txt", "hello $Id$\nworld\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "attributes")
    for kind in ("clean", "smudge"):
        git(repo, "config", f"filter.upper.{kind}", f"sh -c 'touch {markers}/{kind}; tr a-z A-Z'")
    git(repo, "config", "filter.upper.required", "true")
    for hook in ("post-checkout", "post-commit", "reference-transaction", "post-index-change"):
        write(repo / ".git" / "hooks" / hook, f"#!/bin/sh\ntouch {markers}/{hook}\n", 0o755)
    raw = b"lower case $Id$\nmixed\r\nendings\n"
    write(repo / "a.txt", raw)
    write(repo / "new.txt", raw)
    snap = create_worktree(repo, tmp_path / "wt")
    assert (snap.worktree / "a.txt").read_bytes() == raw
    assert (snap.worktree / "new.txt").read_bytes() == raw
    blob = subprocess.run(
        ["git", "cat-file", "blob", f"{snap.commit}:a.txt"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    assert blob == raw
    assert sorted(p.name for p in markers.iterdir()) == []


def settle(root: Path) -> None:
    """Age every file and refresh the index, so Git sees them stat-clean rather than racy."""
    for path in root.rglob("*"):
        if ".git" not in path.parts and not path.is_symlink():
            os.utime(path, (1_600_000_000, 1_600_000_000))
    git(root, "update-index", "-q", "--refresh")


@pytest.mark.parametrize("how", ["attributes", "autocrlf"])
def test_clean_files_whose_blob_git_converted_keep_their_bytes(repo, tmp_path, how):
    if how == "attributes":
        write(repo / ".gitattributes", "*.txt text eol=crlf\n")
    else:
        git(repo, "config", "core.autocrlf", "true")
    crlf = b"windows\r\nline endings\r\n"
    write(repo / "a.txt", crlf)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "crlf")
    assert git(repo, "cat-file", "blob", "HEAD:a.txt") == "windows\nline endings"
    settle(repo)
    assert git(repo, "diff-files", "--name-only") == ""
    snap = create_worktree(repo, tmp_path / "wt")
    assert (snap.worktree / "a.txt").read_bytes() == crlf
    assert tree(snap.worktree) == tree(repo)


def test_split_index_intent_to_add_and_unmerged_entries(repo, tmp_path):
    git(repo, "checkout", "-qb", "side")
    write(repo / "a.txt", "side\n")
    git(repo, "commit", "-qam", "side")
    git(repo, "checkout", "-q", "main")
    write(repo / "a.txt", "main\n")
    git(repo, "commit", "-qam", "main")
    subprocess.run(["git", "merge", "-q", "side"], cwd=repo, capture_output=True, check=False)
    assert "<<<<<<<" in (repo / "a.txt").read_text()
    write(repo / "intent.txt", "intent to add\n")
    git(repo, "add", "-N", "intent.txt")
    git(repo, "config", "core.splitIndex", "true")
    git(repo, "update-index", "--split-index")
    assert list((repo / ".git").glob("sharedindex.*"))
    snap = create_worktree(repo, tmp_path / "wt")
    assert tree(snap.worktree) == tree(repo)


def test_snapshot_of_a_sha256_repository(tmp_path, git_home):
    root = tmp_path / "sha256"
    root.mkdir()
    git(root, "init", "-q", "--object-format=sha256")
    write(root / "a.txt", "committed\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "c")
    write(root / "a.txt", "dirty\n")
    write(root / "b.bin", b"\0untracked")
    snap = create_worktree(root, tmp_path / "wt")
    assert len(snap.commit) == 64
    assert tree(snap.worktree) == tree(root)


def test_names_that_need_quoting_survive(repo, tmp_path):
    names = [
        "new\nline.txt",
        '"quoted".txt',
        "back\\slash",
        " spaced ",
        "-dash",
        "ünïcödé",
        "tab\t",
    ]
    for name in names:
        write(repo / name, f"content of {name!r}\n")
    write(repo / "a.txt", "modified\n")
    snap = create_worktree(repo, tmp_path / "wt")
    assert tree(snap.worktree) == tree(repo)


def test_clean_submodule_is_kept_and_a_dirty_one_refused(repo, tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    git(sub, "init", "-q")
    write(sub / "lib.txt", "library\n")
    git(sub, "add", "-A")
    git(sub, "commit", "-qm", "lib")
    git(repo, "submodule", "add", "-q", str(sub), "mod")
    git(repo, "commit", "-qm", "submodule")
    snap = create_worktree(repo, tmp_path / "clean")
    assert (snap.worktree / "mod").is_dir()
    assert git(repo, "ls-tree", snap.commit, "mod").startswith("160000 commit")

    write(repo / "mod" / "lib.txt", "edited inside the submodule\n")
    with pytest.raises(WorktreeError, match=r"submodule 'mod' has changes") as caught:
        create_worktree(repo, tmp_path / "dirty")
    assert caught.value.path == repo / "mod"
    assert not (tmp_path / "dirty").exists()

    git(repo / "mod", "commit", "-qam", "moved")
    with pytest.raises(WorktreeError, match=r"submodule 'mod'"):
        create_worktree(repo, tmp_path / "moved")


def test_destination_must_be_new_or_empty(repo, tmp_path):
    dest = tmp_path / "taken"
    write(dest / "file", "x")
    with pytest.raises(WorktreeError, match="not an empty directory") as caught:
        create_worktree(repo, dest)
    assert caught.value.path == dest
    (dest / "file").unlink()
    assert tree(create_worktree(repo, dest).worktree) == tree(repo)


def test_outside_a_work_tree_is_an_error(tmp_path, git_home):
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(WorktreeError, match=r"^snapshot .*plain: git rev-parse failed \(fatal"):
        create_worktree(plain, tmp_path / "wt")


def test_remove_worktree_leaves_parent_refs_alone_and_is_idempotent(repo, tmp_path):
    dirty(repo)
    refs = git(repo, "for-each-ref")
    snap = create_worktree(repo, tmp_path / "wt")
    write(snap.worktree / "scratch.txt", "child output\n")
    remove_worktree(snap)
    assert not snap.worktree.exists()
    assert str(snap.worktree) not in git(repo, "worktree", "list", "--porcelain")
    assert git(repo, "for-each-ref") == refs
    remove_worktree(snap)  # already gone: still fine
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_remove_prunes_a_worktree_deleted_by_hand(repo, tmp_path):
    snap = create_worktree(repo, tmp_path / "wt")
    shutil.rmtree(snap.worktree)
    remove_worktree(Snapshot(repo=snap.repo, worktree=snap.worktree, commit=snap.commit))
    assert str(snap.worktree) not in git(repo, "worktree", "list", "--porcelain")
