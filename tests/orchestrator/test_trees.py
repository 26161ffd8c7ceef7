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


def test_a_tree_emptied_by_another_process_meanwhile_is_no_error(
    tmp_path: Path, monkeypatch
) -> None:
    # Two node processes sweep the same dead store: one's rmtree finds a directory it listed
    # already gone, and its os.open fails; that is not retried (os.open needs its flags).
    tree = tmp_path / "store"
    (tree / "gone").mkdir(parents=True)
    real = os.open

    def opened(path, flags, *args, **kwargs):
        if os.path.basename(path) == "gone":
            raise FileNotFoundError(2, "swept by another process", path)
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", opened)
    remove_tree(tree)  # raised TypeError from retrying os.open without its flags
    monkeypatch.undo()
    remove_tree(tree)
    assert not tree.exists()
