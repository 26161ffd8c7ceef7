"""A node's read-only checkouts linked to its store (``orchestrator.launch._read_trees``), from a
real snapshot bundle checked out by Git once."""

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.launch import _read_trees
from orchestrator.launch._ray_node import _check_out
from orchestrator.launch._read_trees import ReadTrees
from orchestrator.workspace._bundle import ship_workspace


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('app')\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "link").symlink_to("src/app.py")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "w"]):
        subprocess.run([*git, *args], check=True)
    (root / "untracked.txt").write_text("as it is now\n")  # a reader sees the work tree
    return root


@pytest.fixture
def bundle(repo) -> bytes:
    return ship_workspace(repo).bundle


def counted(calls: list[str]):
    def extract(data: bytes, directory: str) -> str:
        calls.append(directory)
        return _check_out(data, directory)

    return extract


def test_each_reader_gets_the_snapshot_read_only_from_one_checkout(tmp_path, bundle):
    trees = ReadTrees(str(tmp_path))
    calls: list[str] = []
    for name in ("one", "two"):
        tree = tmp_path / name
        assert trees.check_out(bundle, str(tree), counted(calls))
        assert (tree / "src" / "app.py").read_text() == "print('app')\n"
        assert (tree / "untracked.txt").read_text() == "as it is now\n"
        assert os.readlink(tree / "link") == "src/app.py"
        assert stat.S_IMODE((tree / "src" / "app.py").stat().st_mode) == 0o400
        assert stat.S_IMODE((tree / "run.sh").stat().st_mode) == 0o500
        assert not (tree / ".git").exists()
    assert len(calls) == 1
    assert not os.path.exists(os.path.dirname(calls[0]))  # the one checkout's Git dir is gone
    one, two = (tmp_path / name / "src" / "app.py" for name in ("one", "two"))
    assert one.stat().st_ino == two.stat().st_ino  # both link the stored file: no copy
    [store] = [p for p in tmp_path.iterdir() if p.name.startswith(_read_trees.STORE_PREFIX)]
    assert store.name.startswith(f"{_read_trees.STORE_PREFIX}{os.getpid()}-")
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    trees.close()
    assert not store.exists()
    assert (tmp_path / "one" / "src" / "app.py").read_text() == "print('app')\n"


def test_a_planted_link_in_the_checkout_is_not_written_through(tmp_path, bundle):
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    tree.mkdir()
    outside.write_text("kept\n")
    (tree / "run.sh").symlink_to(outside)
    with pytest.raises(FileExistsError):
        ReadTrees(str(tmp_path)).check_out(bundle, str(tree), counted([]))
    assert outside.read_text() == "kept\n"


def test_a_tree_over_the_cap_is_not_kept_and_nothing_is_written(tmp_path, bundle, monkeypatch):
    monkeypatch.setattr(_read_trees, "MAX_TREE_BYTES", 4)
    tree = tmp_path / "tree"
    assert not ReadTrees(str(tmp_path)).check_out(bundle, str(tree), counted([]))
    assert not tree.exists()


def test_a_later_batch_of_an_unchanged_workspace_is_written_from_the_kept_tree(tmp_path, repo):
    first = ship_workspace(repo)
    time.sleep(1.1)  # a snapshot commit a second later: another commit id, another bundle
    second = ship_workspace(repo)
    assert (first.commit, first.bundle) != (second.commit, second.bundle)
    assert first.tree == second.tree
    trees, calls = ReadTrees(str(tmp_path)), list[str]()
    for name, shipped in (("one", first), ("two", second)):
        tree = tmp_path / name
        assert trees.check_out(shipped.bundle, str(tree), counted(calls), shipped.tree)
        assert (tree / "untracked.txt").read_text() == "as it is now\n"
    assert len(calls) == 1

    (repo / "untracked.txt").write_text("changed\n")  # a changed workspace: a new tree
    third = ship_workspace(repo)
    assert third.tree != first.tree
    assert trees.check_out(third.bundle, str(tmp_path / "three"), counted(calls), third.tree)
    assert (tmp_path / "three" / "untracked.txt").read_text() == "changed\n"
    assert len(calls) == 2


def test_a_bundle_that_holds_another_tree_than_it_is_sent_as_fails_and_is_not_kept(tmp_path, repo):
    shipped = ship_workspace(repo)
    (repo / "untracked.txt").write_text("changed\n")
    other = ship_workspace(repo)
    trees, calls = ReadTrees(str(tmp_path)), list[str]()
    with pytest.raises(ValueError, match=f"holds tree {shipped.tree}, not {other.tree}"):
        trees.check_out(shipped.bundle, str(tmp_path / "one"), counted(calls), other.tree)
    assert not (tmp_path / "one").exists()
    assert trees.check_out(other.bundle, str(tmp_path / "two"), counted(calls), other.tree)
    assert (tmp_path / "two" / "untracked.txt").read_text() == "changed\n"
    assert len(calls) == 2


def test_a_store_over_the_kept_number_of_trees_goes_and_its_checkouts_stay(tmp_path, repo):
    trees, calls = ReadTrees(str(tmp_path)), list[str]()
    for i in range(_read_trees.KEPT + 1):
        (repo / "untracked.txt").write_text(f"version {i}\n")
        shipped = ship_workspace(repo)
        assert trees.check_out(
            shipped.bundle, str(tmp_path / f"t{i}"), counted(calls), shipped.tree
        )
    [store] = [p for p in tmp_path.iterdir() if p.name.startswith(_read_trees.STORE_PREFIX)]
    assert len(list(store.iterdir())) == _read_trees.KEPT  # the oldest tree's went
    for i in range(_read_trees.KEPT + 1):
        assert (tmp_path / f"t{i}" / "untracked.txt").read_text() == f"version {i}\n"
    trees.close()


def test_a_store_left_by_a_node_process_that_died_goes_when_the_next_makes_its_own(
    tmp_path, bundle
):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that is gone (reused pids only keep a store longer)
    left = tmp_path / f"{_read_trees.STORE_PREFIX}{dead.pid}-abc123"
    (left / "tree").mkdir(parents=True)
    (left / "tree" / "f").write_text("x")
    (left / "tree" / "f").chmod(0o400)
    living = tmp_path / f"{_read_trees.STORE_PREFIX}{os.getppid()}-def456"
    living.mkdir()
    trees = ReadTrees(str(tmp_path))
    assert trees.check_out(bundle, str(tmp_path / "one"), counted([]))
    assert not left.exists()
    assert living.exists()  # its process runs
    trees.close()
