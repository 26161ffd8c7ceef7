"""Copy-back from a worktree into the parent workspace, against real Git repositories."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from orchestrator.workspace import _apply
from orchestrator.workspace._changes import Change, Conflict, changed_paths
from orchestrator.workspace._copyback import finalize
from orchestrator.workspace._review import ReviewStore
from orchestrator.workspace._worktree import WorktreeError, create_worktree
from tests.orchestrator.workspace._gitutil import git, write


def tree(root: Path) -> dict[str, tuple[str, int, bytes]]:
    """Every entry under ``root`` but ``.git``, hidden temp files included: kind, mode, bytes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        out[Path(dirpath).relative_to(root).as_posix() + "/"] = ("dir", 0, b"")
        for name in [*filenames, *(d for d in dirnames if Path(dirpath, d).is_symlink())]:
            path = Path(dirpath, name)
            if name == ".git":
                continue
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", 0, os.fsencode(os.readlink(path)))
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return out


def land_all(snap, review):
    """Copy back every change, held files included, as a person naming each would."""
    names = [c.path for c in changed_paths(snap)]
    return finalize(snap, review, "worker-1", names=names)


@pytest.fixture
def repo(tmp_path: Path, git_home) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        write(root / name, f"{name} line 1\nline 2\n")
    write(root / "tool.sh", "#!/bin/sh\n")
    write(root / "bin.dat", bytes(range(256)))
    write(root / "private.txt", "secret\n", 0o600)
    write(root / "pkg" / "only.py", "x = 1\n")
    (root / "link").symlink_to("a.txt")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "initial")
    return root


@pytest.fixture
def snap(repo, tmp_path):
    return create_worktree(repo, tmp_path / "wt")


@pytest.fixture
def review(tmp_path):
    return ReviewStore(tmp_path / "session" / "review")


def change_everything(wt: Path) -> None:
    write(wt / "a.txt", "modified\n")
    write(wt / "new" / "dir" / "n.txt", "added\n")
    (wt / "d.txt").unlink()
    (wt / "tool.sh").chmod(0o755)
    (wt / "link").unlink()
    write(wt / "link", "a file now\n")
    write(wt / "bin.dat", b"\0\r\n\xff" * 64)
    (wt / "to-b").symlink_to("b.txt")
    write(wt / "private.txt", "still secret\n")
    (wt / "pkg" / "only.py").unlink()
    os.utime(wt / "c.txt", (1, 1))  # touched, same bytes: not a change


def test_changed_paths_names_every_kind_of_change(snap):
    change_everything(snap.worktree)
    assert changed_paths(snap) == [
        Change(path="a.txt", status="modified"),
        Change(path="bin.dat", status="modified"),
        Change(path="d.txt", status="deleted"),
        Change(path="link", status="type"),
        Change(path="new/dir/n.txt", status="added"),
        Change(path="pkg/only.py", status="deleted"),
        Change(path="private.txt", status="modified"),
        Change(path="to-b", status="added"),
        Change(path="tool.sh", status="mode"),
    ]


def test_recreating_a_deleted_file_with_the_same_bytes_is_no_change(snap):
    original = (snap.worktree / "a.txt").read_bytes()
    (snap.worktree / "a.txt").unlink()
    write(snap.worktree / "a.txt", original)
    assert changed_paths(snap) == []
    (snap.worktree / "a.txt").unlink()
    write(snap.worktree / "a.txt", original + b"more\n")
    assert changed_paths(snap) == [Change(path="a.txt", status="modified")]


def test_changes_staged_or_unstaged_inside_the_worktree_index_count_by_content(snap):
    git(snap.worktree, "rm", "-q", "--cached", "a.txt")  # untracked now, same bytes
    write(snap.worktree / "b.txt", "staged by the child\n")
    git(snap.worktree, "add", "b.txt")
    assert changed_paths(snap) == [Change(path="b.txt", status="modified")]


def test_finalize_applies_every_change_byte_exact(repo, snap, review):
    change_everything(snap.worktree)
    result = land_all(snap, review)
    assert result.error == ""
    assert result.conflicts == ()
    assert result.applied == result.changed
    assert len(result.changed) == 9
    expected = tree(snap.worktree)
    del expected["pkg/"]  # the child emptied it; the copy-back removes it as Git would
    assert {k: v[:1] + v[2:] for k, v in tree(repo).items()} == {
        k: v[:1] + v[2:] for k, v in expected.items()
    }
    assert (repo / "tool.sh").stat().st_mode & 0o111 == 0o111
    assert stat.S_IMODE((repo / "private.txt").stat().st_mode) == 0o600  # parent's bits kept
    assert os.readlink(repo / "to-b") == "b.txt"
    assert {d.path for d in review.diff()} == {str(repo / p) for p in result.changed}
    assert {d.owner for d in review.diff()} == {"worker-1"}


def test_review_round_trip_diff_revert_accept(repo, snap, review):
    before = tree(repo)
    change_everything(snap.worktree)
    assert land_all(snap, review).error == ""
    statuses = {os.path.relpath(d.path, repo): d.status for d in review.diff(["worker-1"])}
    assert statuses == {c.path: c.status for c in changed_paths(snap)}
    assert review.revert(["worker-1"]).failed == ()
    assert tree(repo) == before
    assert review.diff() == []

    assert land_all(snap, review).error == ""
    assert len(review.accept()) == 9
    assert review.diff() == []
    assert review.revert().reverted == ()
    assert (repo / "a.txt").read_text() == "modified\n"


def test_drift_in_the_parent_blocks_everything_until_resolved(repo, snap, review):
    change_everything(snap.worktree)
    original = (repo / "a.txt").read_bytes()
    write(repo / "a.txt", "the user edited this meanwhile\n")
    before = tree(repo)
    result = land_all(snap, review)
    assert result.conflicts == (
        Conflict(path="a.txt", reason="changed in the parent since the snapshot"),
    )
    assert result.applied == ()
    assert result.error.startswith(f"copy back from {snap.worktree}: 1 changed path(s) conflict")
    assert tree(repo) == before
    assert snap.worktree.is_dir()
    assert review.diff() == []

    write(repo / "a.txt", original)
    retried = land_all(snap, review)
    assert retried.error == ""
    assert (repo / "a.txt").read_text() == "modified\n"


@pytest.mark.parametrize(
    ("drift", "reason"),
    [
        (lambda r: (r / "a.txt").chmod(0o755), "mode changed in the parent since the snapshot"),
        (lambda r: (r / "a.txt").unlink(), "deleted in the parent since the snapshot"),
        (
            lambda r: write(r / "new" / "dir" / "n.txt", "x"),
            "created in the parent since the snapshot",
        ),
        (lambda r: write(r / "d.txt", "edited"), "changed in the parent since the snapshot"),
    ],
)
def test_each_kind_of_parent_drift_is_a_conflict(repo, snap, review, drift, reason):
    change_everything(snap.worktree)
    drift(repo)
    before = tree(repo)
    result = land_all(snap, review)
    assert [c.reason for c in result.conflicts] == [reason]
    assert tree(repo) == before


def test_finalize_again_after_success_is_a_no_op(repo, snap, review):
    change_everything(snap.worktree)
    first = land_all(snap, review)
    after = tree(repo)
    second = land_all(snap, review)
    assert second.error == ""
    assert second.applied == first.applied
    assert tree(repo) == after


def test_a_path_already_holding_the_childs_version_counts_as_applied(repo, snap, review):
    write(snap.worktree / "a.txt", "same edit on both sides\n")
    write(snap.worktree / "b.txt", "only the child\n")
    write(repo / "a.txt", "same edit on both sides\n")
    result = land_all(snap, review)
    assert result.error == ""
    assert result.applied == ("a.txt", "b.txt")
    diffs = {Path(d.path).name: d.status for d in review.diff()}
    assert diffs == {"a.txt": "modified", "b.txt": "modified"}


def five_changes(wt: Path) -> list[str]:
    write(wt / "a.txt", "one\n")
    write(wt / "b.txt", "two\n")
    write(wt / "fresh" / "c.txt", "three\n")
    (wt / "d.txt").unlink()
    write(wt / "e.txt", "five\n")
    return ["a.txt", "b.txt", "d.txt", "e.txt", "fresh/c.txt"]


def fail_at(monkeypatch, name: str, path: str) -> None:
    real = getattr(_apply, name)

    def failing(snapshot, op):
        if op.delta.path == path:
            raise OSError(errno.EIO, "injected I/O error", path)
        real(snapshot, op)

    monkeypatch.setattr(_apply, name, failing)


@pytest.mark.parametrize("k", [0, 1, 3, 4])
def test_failure_at_file_k_of_n_restores_the_parent(repo, snap, review, monkeypatch, k):
    paths = five_changes(snap.worktree)
    before = tree(repo)
    fail_at(monkeypatch, "apply_op", paths[k])
    result = land_all(snap, review)
    assert tree(repo) == before  # no temp, backup or created directory left either
    assert result.applied == ()
    assert result.restored == tuple(paths[:k])
    assert result.error.startswith(f"copy back from {snap.worktree}: applying {paths[k]!r} failed")
    assert "parent is unchanged" in result.error
    assert review.diff() == []


def test_rollback_failure_names_exactly_what_stayed_applied(repo, snap, review, monkeypatch):
    paths = five_changes(snap.worktree)
    original = (repo / "b.txt").read_bytes()
    fail_at(monkeypatch, "apply_op", paths[3])
    fail_at(monkeypatch, "restore_op", paths[1])
    result = land_all(snap, review)
    assert result.applied == ("b.txt",)
    assert result.restored == ("a.txt", "d.txt")
    assert (repo / "b.txt").read_text() == "two\n"
    backups = [p for p in repo.iterdir() if p.name.startswith(".fleet-old-")]
    assert len(backups) == 1
    assert backups[0].read_bytes() == original
    assert f"'b.txt' (original saved as '{backups[0].name}')" in result.error
    assert "restored: 'a.txt', 'd.txt'" in result.error
    assert (repo / "a.txt").read_text() == "a.txt line 1\nline 2\n"
    assert (repo / "d.txt").exists()
    assert not (repo / "fresh").exists()


def test_a_failure_while_preparing_leaves_nothing_behind(repo, snap, review, monkeypatch):
    five_changes(snap.worktree)
    before = tree(repo)
    real = _apply.stage

    def failing(snapshot, op, fd, new, algo):
        if op.delta.path == "fresh/c.txt":
            raise OSError(errno.ENOSPC, "No space left on device", ".fleet-new-0123")
        real(snapshot, op, fd, new, algo)

    monkeypatch.setattr(_apply, "stage", failing)
    result = land_all(snap, review)
    assert result.error == (
        f"copy back from {snap.worktree}: preparing fresh/c.txt failed (No space left on "
        "device); nothing in the parent changed; fix the cause and stop again"
    )
    assert result.applied == ()
    assert tree(repo) == before


def test_a_worktree_file_changing_during_copy_back_is_a_conflict(repo, snap, review, monkeypatch):
    five_changes(snap.worktree)
    before = tree(repo)
    real = _apply.prepare

    def edit_then_prepare(snapshot, ops, created, algo):
        write(snapshot.worktree / "b.txt", "the child was still writing\n")
        real(snapshot, ops, created, algo)

    monkeypatch.setattr(_apply, "prepare", edit_then_prepare)
    result = land_all(snap, review)
    assert result.conflicts == (
        Conflict(path="b.txt", reason="changed in the worktree during copy-back; stop again"),
    )
    assert tree(repo) == before


def test_a_parent_file_changing_during_copy_back_is_a_conflict(repo, snap, review, monkeypatch):
    # The user saves b.txt after the plan checked it: a conflict before anything is applied,
    # not an apply error and a rollback; the user's save is kept.
    five_changes(snap.worktree)
    real = _apply.prepare

    def save_then_prepare(snapshot, ops, created, algo):
        write(repo / "b.txt", "the user saved this meanwhile\n")
        real(snapshot, ops, created, algo)

    monkeypatch.setattr(_apply, "prepare", save_then_prepare)
    result = finalize(snap, review, "worker-1")
    assert result.conflicts == (
        Conflict(path="b.txt", reason="changed in the parent during copy-back"),
    )
    assert (result.applied, result.restored) == ((), ())
    assert result.error.startswith(f"copy back from {snap.worktree}: 1 changed path(s) conflict")
    assert (repo / "b.txt").read_text() == "the user saved this meanwhile\n"
    assert (repo / "a.txt").read_text() == "a.txt line 1\nline 2\n"
    assert not (repo / "fresh").exists()
    assert not [p for p in repo.iterdir() if p.name.startswith(".fleet-")]


def test_copy_back_in_a_sha256_repository(tmp_path, git_home, review):
    root = tmp_path / "sha256"
    root.mkdir()
    git(root, "init", "-q", "--object-format=sha256")
    write(root / "a.txt", "committed\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "c")
    snap = create_worktree(root, tmp_path / "wt")
    write(snap.worktree / "a.txt", "child\n")
    write(snap.worktree / "b.txt", "new\n")
    result = land_all(snap, review)
    assert result.error == ""
    assert result.applied == ("a.txt", "b.txt")
    assert (root / "a.txt").read_text() == "child\n"


def test_deleting_a_directorys_last_file_and_reverting_it(repo, snap, review):
    (snap.worktree / "pkg" / "only.py").unlink()
    assert land_all(snap, review).error == ""
    assert not (repo / "pkg").exists()
    result = review.revert()
    assert result.reverted == (str(repo / "pkg" / "only.py"),)
    assert (repo / "pkg" / "only.py").read_text() == "x = 1\n"


@pytest.mark.parametrize(
    "case",
    [
        (lambda w: write(w / ".GIT" / "config", "x"), ".GIT/config", "inside Git metadata"),
        (lambda w: write(w / "sub" / ".Git", "gitdir: /x"), "sub/.Git", "inside Git metadata"),
        (lambda w: write(w / "GIT~1" / "HEAD", "x"), "GIT~1/HEAD", "inside Git metadata"),
        (lambda w: (w / "esc").symlink_to("/etc"), "esc", "symlink to absolute path"),
        (lambda w: (w / "up").symlink_to("../../x"), "up", "escapes the workspace"),
    ],
)
def test_guarded_paths_block_the_whole_copy_back(repo, snap, review, case):
    make, path, reason = case
    write(snap.worktree / "a.txt", "harmless\n")
    make(snap.worktree)
    before = tree(repo)
    result = land_all(snap, review)
    assert [c.path for c in result.conflicts] == [path]
    assert reason in result.conflicts[0].reason
    assert tree(repo) == before


def test_a_git_file_the_child_writes_is_never_a_change(repo, snap, review):
    write(snap.worktree / "sub" / ".git", "gitdir: /elsewhere\n")
    write(snap.worktree / "sub" / "real.txt", "kept\n")
    result = land_all(snap, review)
    assert result.changed == ("sub/real.txt",)
    assert result.error == ""
    assert not (repo / "sub" / ".git").exists()


def test_a_rewritten_worktree_git_file_is_refused(repo, snap, review):
    write(snap.worktree / "a.txt", "child\n")
    (snap.worktree / ".git").write_text(f"gitdir: {repo / '.git'}\n")
    with pytest.raises(WorktreeError, match=r"\.git file no longer points into"):
        land_all(snap, review)
    assert (repo / "a.txt").read_text() == "a.txt line 1\nline 2\n"


def test_an_ancestor_swapped_for_a_symlink_in_the_parent_is_refused(repo, snap, review, tmp_path):
    outside = tmp_path / "outside"
    write(outside / "only.py", "x = 1\n")
    write(snap.worktree / "pkg" / "only.py", "x = 2\n")
    (repo / "pkg" / "only.py").unlink()
    (repo / "pkg").rmdir()
    (repo / "pkg").symlink_to(outside)
    result = land_all(snap, review)
    assert result.conflicts == (Conflict(path="pkg/only.py", reason="ancestor 'pkg' is a symlink"),)
    assert (outside / "only.py").read_text() == "x = 1\n"


def test_a_symlink_swapped_in_at_apply_time_stops_the_write(
    repo, snap, review, tmp_path, monkeypatch
):
    outside = tmp_path / "outside"
    write(outside / "only.py", "x = 1\n")
    write(snap.worktree / "a.txt", "first\n")
    write(snap.worktree / "pkg" / "only.py", "x = 2\n")
    real = _apply.apply_op

    def swap_then_apply(snapshot, op):
        if op.delta.path == "pkg/only.py":
            (repo / "pkg").rename(tmp_path / "moved-away")
            (repo / "pkg").symlink_to(outside)
        real(snapshot, op)

    monkeypatch.setattr(_apply, "apply_op", swap_then_apply)
    result = land_all(snap, review)
    assert result.restored == ("a.txt",)
    assert (outside / "only.py").read_text() == "x = 1\n"
    assert (repo / "a.txt").read_text() == "a.txt line 1\nline 2\n"


def test_lookalike_of_an_existing_parent_file_is_refused(repo, snap, review):
    write(repo / "it\u2019s.txt", "curly\n")
    write(snap.worktree / "it's.txt", "straight\n")
    result = land_all(snap, review)
    assert result.conflicts == (
        Conflict(
            path="it's.txt",
            reason="lookalike of existing 'it\u2019s.txt' (typographic quote, space or dash)",
        ),
    )
