"""The copy-back path rules, one case at a time, on real directories."""

from __future__ import annotations

import errno
import os
import posixpath
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.workspace._pathguard import (
    SiblingCheck,
    ancestor_problem,
    is_git_metadata,
    lexical_problem,
    link_target_problem,
    lstat_below,
    open_dir,
    twins_within,
)


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("", "empty path"),
        ("/etc/passwd", "absolute path"),
        ("../outside", "path has a '..' component"),
        ("a/../../b", "path has a '..' component"),
        ("a/./b", "path has a '.' component"),
        ("a//b", "path has a 'empty' component"),
        ("a/", "path has a 'empty' component"),
        (".git", "path is inside Git metadata ('.git')"),
        (".git/config", "path is inside Git metadata ('.git')"),
        ("sub/.git", "path is inside Git metadata ('.git')"),
        (".GIT/hooks/pre-commit", "path is inside Git metadata ('.GIT')"),
        ("x/.Git", "path is inside Git metadata ('.Git')"),
        (".git./config", "path is inside Git metadata ('.git.')"),
        (".git /config", "path is inside Git metadata ('.git ')"),
        (".git::$INDEX_ALLOCATION/x", "path is inside Git metadata ('.git::$INDEX_ALLOCATION')"),
        ("GIT~1/config", "path is inside Git metadata ('GIT~1')"),
        (".g\u200cit/config", "path is inside Git metadata ('.g\\u200cit')"),
        ("nul\0byte", "NUL byte in path"),
    ],
)
def test_lexically_unsafe_paths_are_refused(path, reason):
    assert lexical_problem(path) == reason


@pytest.mark.parametrize(
    "path",
    ["a.txt", "dir/sub/file", ".gitignore", ".github/workflows/ci.yml", "x.git", "..a", "a.."],
)
def test_ordinary_paths_pass(path):
    assert lexical_problem(path) is None
    assert not is_git_metadata(path.rsplit("/", 1)[-1])


@given(st.lists(st.sampled_from(["a", "b", ".", "..", "", ".git", "c.d"]), min_size=1, max_size=6))
def test_an_accepted_path_is_normalized_and_stays_inside(parts):
    path = "/".join(parts)
    if lexical_problem(path) is None:
        assert posixpath.normpath(path) == path
        assert not path.startswith(("/", "../"))
        assert ".git" not in path.split("/")


@pytest.mark.parametrize(
    ("path", "target", "reason"),
    [
        ("l", "/etc/passwd", "symlink to absolute path '/etc/passwd'"),
        ("l", "..", "symlink target '..' escapes the workspace"),
        ("a/b/l", "../../../x", "symlink target '../../../x' escapes the workspace"),
        ("l", ".git/config", "symlink target '.git/config' is inside Git metadata"),
        ("a/l", "../.GIT", "symlink target '../.GIT' is inside Git metadata"),
    ],
)
def test_escaping_symlink_targets_are_refused(path, target, reason):
    assert link_target_problem(path, target) == reason


@pytest.mark.parametrize(("path", "target"), [("l", "a.txt"), ("a/b/l", "../../c"), ("a/l", ".")])
def test_symlinks_inside_the_workspace_pass(path, target):
    assert link_target_problem(path, target) is None


def test_symlinked_dangling_and_file_ancestors_are_refused(tmp_path):
    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    assert ancestor_problem(tmp_path, "real/deep/new.txt") is None
    assert ancestor_problem(tmp_path, "missing/dir/new.txt") is None
    assert ancestor_problem(tmp_path, "link/deep/x") == "ancestor 'link' is a symlink"
    assert ancestor_problem(tmp_path, "dangling/x") == "ancestor 'dangling' is a symlink"
    assert ancestor_problem(tmp_path, "file/x") == "ancestor 'file' is not a directory"
    assert ancestor_problem(tmp_path, "link") is None  # the leaf itself may be a link


def test_open_dir_never_follows_a_symlink_and_creates_on_request(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OSError) as caught:
        open_dir(tmp_path, "link/sub", created=[])
    assert caught.value.errno in {errno.ELOOP, errno.ENOTDIR}
    assert not (tmp_path / "real" / "sub").exists()
    with pytest.raises(FileNotFoundError):
        open_dir(tmp_path, "real/a/b")
    created: list[str] = []
    fd = open_dir(tmp_path, "real/a/b", created=created)
    os.close(fd)
    assert created == ["real/a", "real/a/b"]
    assert (tmp_path / "real" / "a" / "b").is_dir()


def test_lstat_below_treats_a_symlinked_ancestor_as_absent(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert lstat_below(tmp_path, "real/f") is not None
    assert lstat_below(tmp_path, "link/f") is None
    assert lstat_below(tmp_path, "link") is not None


def test_unicode_normalization_twin_of_an_existing_name_is_refused(tmp_path):
    nfc = unicodedata.normalize("NFC", "caf\u00e9")
    nfd = unicodedata.normalize("NFD", nfc)
    (tmp_path / nfc).mkdir()
    check = SiblingCheck(root=tmp_path)
    assert check.problem(f"{nfd}/menu.txt") == f"Unicode-normalization twin of existing {nfc!r}"
    assert check.problem(f"{nfc}/menu.txt") is None


@pytest.mark.parametrize(
    ("existing", "new"),
    [
        ("it\u2019s.txt", "it's.txt"),
        ("it's.txt", "it\u2018s.txt"),
        (
            "Screenshot 2024-05-01 at 10.00.00\u202fAM.png",
            "Screenshot 2024-05-01 at 10.00.00 AM.png",
        ),
        ("\u201cquoted\u201d.md", '"quoted".md'),
        ("a\u2013b.txt", "a-b.txt"),
    ],
)
def test_lookalike_of_an_existing_name_is_refused(tmp_path, existing, new):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / existing).write_text("x")
    reason = SiblingCheck(root=tmp_path).problem(f"docs/{new}")
    shown = f"docs/{existing}"
    assert reason == f"lookalike of existing {shown!r} (typographic quote, space or dash)"


def test_an_exact_existing_name_or_a_distinct_new_one_passes(tmp_path):
    (tmp_path / "it\u2019s.txt").write_text("x")
    (tmp_path / "it's.txt").write_text("y")
    check = SiblingCheck(root=tmp_path)
    assert check.problem("it's.txt") is None
    assert check.problem("it\u2019s.txt") is None
    assert check.problem("its.txt") is None
    assert check.problem("new/dir/it\u2019s.txt") is None


def test_twins_within_one_change_set():
    nfc = unicodedata.normalize("NFC", "\u00fc.txt")
    nfd = unicodedata.normalize("NFD", nfc)
    assert twins_within([nfc, nfd, "plain.txt"]) == {
        nfc: f"Unicode-normalization twin of changed path {nfd!r}",
        nfd: f"Unicode-normalization twin of changed path {nfc!r}",
    }
    assert twins_within([nfc, "plain.txt"]) == {}
