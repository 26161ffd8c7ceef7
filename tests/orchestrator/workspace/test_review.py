"""The pre-image store: record, diff, accept and revert, on real files."""

from __future__ import annotations

import os
import stat
import subprocess
import threading

import pytest

from orchestrator.workspace._changes import Conflict
from orchestrator.workspace._review import FileDiff, ReviewStore


@pytest.fixture
def store(tmp_path):
    return ReviewStore(tmp_path / "session" / "review")


@pytest.fixture
def work(tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    return root


def test_store_directory_and_files_are_private(store, work):
    (work / "f.txt").write_text("new\n")
    store.record("w1", work / "f.txt", b"old\n", 0o100644)
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700
    files = [p for p in store.root.rglob("*") if p.is_file() and p.name != ".lock"]
    assert len(files) == 2
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}


def test_diff_is_a_unified_diff_with_three_lines_of_context(store, work):
    lines = [f"line {i}\n" for i in range(1, 11)]
    path = work / "f.txt"
    store.record("w1", path, "".join(lines).encode(), 0o100644)
    lines[4] = "line five\n"
    path.write_text("".join(lines))
    path.chmod(0o644)
    assert store.diff() == [
        FileDiff(
            path=str(path),
            owner="w1",
            status="modified",
            diff=(
                f"--- {path}\n+++ {path}\n@@ -2,7 +2,7 @@\n"
                " line 2\n line 3\n line 4\n-line 5\n+line five\n line 6\n line 7\n line 8\n"
            ),
        )
    ]
    assert store.diff(context=0)[0].diff.endswith("@@ -5 +5 @@\n-line 5\n+line five\n")
    whole = store.diff(context=1000)[0].diff
    assert whole.count("\n ") == 9


def test_diff_statuses_binary_mode_and_missing_newline(store, work):
    (work / "added.txt").write_text("no newline")
    store.record("w1", work / "added.txt", None, None)
    store.record("w1", work / "deleted.txt", b"gone\n", 0o100644)
    (work / "bin").write_bytes(b"\0\1 after")
    store.record("w1", work / "bin", b"\0\1 before", 0o100644)
    (work / "run.sh").write_text("#!/bin/sh\n")
    (work / "run.sh").chmod(0o755)
    store.record("w1", work / "run.sh", b"#!/bin/sh\n", 0o100644)
    by_name = {os.path.basename(d.path): d for d in store.diff()}
    assert {n: d.status for n, d in by_name.items()} == {
        "added.txt": "added",
        "bin": "modified",
        "deleted.txt": "deleted",
        "run.sh": "mode",
    }
    assert by_name["added.txt"].diff == (
        f"--- /dev/null\n+++ {work}/added.txt\n@@ -0,0 +1 @@\n+no newline\n"
        "\\ No newline at end of file\n"
    )
    assert by_name["deleted.txt"].diff.endswith("@@ -1 +0,0 @@\n-gone\n")
    assert by_name["bin"].diff == f"Binary files {work}/bin and {work}/bin differ\n"
    assert by_name["run.sh"].diff == "old mode 100644\nnew mode 100755\n"


def test_first_record_wins_and_files_back_at_baseline_drop_out(store, work):
    path = work / "f.txt"
    path.write_text("first child\n")
    store.record("w1", path, b"original\n", 0o100644)
    path.write_text("second child\n")
    store.record("w2", path, b"first child\n", 0o100644)
    [entry] = store.diff()
    assert entry.owner == "w1"
    assert "-original\n+second child\n" in entry.diff
    path.write_text("original\n")
    path.chmod(0o644)
    assert store.diff() == []


def test_the_store_survives_a_restart(store, work):
    (work / "f.txt").write_text("changed\n")
    store.record("w1", work / "f.txt", b"before\n", 0o100644)
    again = ReviewStore(store.root)
    assert [d.path for d in again.diff()] == [str(work / "f.txt")]


def test_selectors_pick_owners_paths_and_directories(store, work):
    for owner, name in (("w1", "a.txt"), ("w2", "sub/b.txt"), ("w2", "sub/c.txt")):
        (work / name).parent.mkdir(exist_ok=True)
        (work / name).write_text("new\n")
        store.record(owner, work / name, None, None)
    names = lambda diffs: [os.path.relpath(d.path, work) for d in diffs]  # noqa: E731
    assert names(store.diff(["w1"])) == ["a.txt"]
    assert names(store.diff(["w2"])) == ["sub/b.txt", "sub/c.txt"]
    assert names(store.diff([str(work / "sub")])) == ["sub/b.txt", "sub/c.txt"]
    assert names(store.diff([str(work / "sub/c.txt"), "w1"])) == ["a.txt", "sub/c.txt"]
    assert store.diff(["nobody"]) == []


def test_accept_forgets_the_pre_image_and_keeps_the_file(store, work):
    (work / "f.txt").write_text("keep me\n")
    store.record("w1", work / "f.txt", b"old\n", 0o100644)
    assert store.accept(["w1"]) == [str(work / "f.txt")]
    assert store.diff() == []
    assert store.revert().reverted == ()
    assert (work / "f.txt").read_text() == "keep me\n"


def test_revert_restores_bytes_mode_and_links_and_deletes_created_files(store, work):
    (work / "mod.txt").write_text("child\n")
    store.record("w1", work / "mod.txt", b"parent\n", 0o100600)
    (work / "created.txt").write_text("child made this\n")
    store.record("w1", work / "created.txt", None, None)
    store.record("w1", work / "sub" / "deleted.bin", b"\0\1\2", 0o100755)
    (work / "link").write_text("a file replaced the link\n")
    store.record("w1", work / "link", b"mod.txt", 0o120777)
    result = store.revert()
    assert result.failed == ()
    assert sorted(os.path.basename(p) for p in result.reverted) == [
        "created.txt",
        "deleted.bin",
        "link",
        "mod.txt",
    ]
    assert (work / "mod.txt").read_text() == "parent\n"
    assert stat.S_IMODE((work / "mod.txt").stat().st_mode) == 0o600
    assert not (work / "created.txt").exists()
    assert (work / "sub" / "deleted.bin").read_bytes() == b"\0\1\2"
    assert stat.S_IMODE((work / "sub" / "deleted.bin").stat().st_mode) == 0o755
    assert os.readlink(work / "link") == "mod.txt"
    assert sorted(p.name for p in work.iterdir()) == ["link", "mod.txt", "sub"]
    assert store.diff() == []


def test_revert_reports_each_file_it_cannot_restore(store, work, tmp_path):
    (work / "ok.txt").write_text("child\n")
    store.record("w1", work / "ok.txt", b"parent\n", 0o100644)
    (work / "dir").mkdir()
    (work / "dir" / "f.txt").write_text("child\n")
    store.record("w1", work / "dir" / "f.txt", b"parent\n", 0o100644)
    outside = tmp_path / "outside"
    outside.mkdir()
    (work / "dir" / "f.txt").rename(outside / "f.txt")
    (work / "dir").rmdir()
    (work / "dir").symlink_to(outside)  # the directory became a symlink: never write through it
    result = store.revert()
    assert result.reverted == (str(work / "ok.txt"),)
    assert [c.path for c in result.failed] == [str(work / "dir" / "f.txt")]
    assert result.failed[0] == Conflict(
        path=str(work / "dir" / "f.txt"),
        reason=result.failed[0].reason,
    )
    assert result.failed[0].reason.startswith("cannot restore it (")
    assert (outside / "f.txt").read_text() == "child\n"
    assert [d.path for d in store.diff()] == [str(work / "dir" / "f.txt")]


def test_revert_never_touches_the_git_index(store, tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@e",
        "GIT_COMMITTER_NAME": "t",
    }
    env["GIT_COMMITTER_EMAIL"] = "t@e"
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=env)
    (repo / "f.txt").write_text("committed\n")
    subprocess.run(["git", "add", "f.txt"], cwd=repo, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", "c"], cwd=repo, check=True, env=env)
    (repo / "f.txt").write_text("child\n")
    store.record("w1", repo / "f.txt", b"committed\n", 0o100644)
    index = (repo / ".git" / "index").read_bytes()
    assert store.revert().reverted == (str(repo / "f.txt"),)
    assert (repo / ".git" / "index").read_bytes() == index
    assert (repo / "f.txt").read_text() == "committed\n"


def test_concurrent_records_keep_one_baseline_per_path(store, work):
    path = work / "f.txt"
    path.write_text("final\n")
    threads = [
        threading.Thread(target=store.record, args=(f"w{i}", path, f"v{i}\n".encode(), 0o100644))
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    [entry] = store.diff()
    assert entry.diff.count("\n-v") == 1
    assert f"-v{entry.owner[1:]}\n" in entry.diff
