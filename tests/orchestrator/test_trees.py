"""A handed-off child's scratch directory is deleted, and nothing outside it."""

import os
from pathlib import Path

from orchestrator._trees import remove_tree


def test_remove_tree_takes_unwritable_dirs_and_never_follows_a_link(tmp_path: Path) -> None:
    scratch = tmp_path / "a1"
    (scratch / "claude" / "home").mkdir(parents=True)
    (scratch / "claude" / "home" / "session.jsonl").write_text("{}\n")
    outside = tmp_path / "workspace"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (scratch / "link").symlink_to(outside)
    (scratch / "claude" / "home" / "to-file").symlink_to(outside / "keep.txt")
    os.chmod(scratch / "claude" / "home", 0o500)
    os.chmod(scratch / "claude", 0o000)
    remove_tree(scratch)
    assert not scratch.exists()
    assert (outside / "keep.txt").read_text() == "mine"
    assert oct(outside.stat().st_mode & 0o777) == oct(0o755 & ~_umask())


def test_remove_tree_leaves_a_symlinked_scratch_and_a_missing_one_alone(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "x").write_text("x")
    (tmp_path / "a2").symlink_to(target)
    remove_tree(tmp_path / "a2")
    remove_tree(tmp_path / "a3")
    assert (target / "x").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
