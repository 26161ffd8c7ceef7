"""canonicalize(): realpath forms and the refusals that keep $HOME and visible paths read-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import Policy, SandboxError, SandboxSpec
from sandbox._paths import canonicalize, is_within


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def test_paths_are_resolved_and_deduplicated(layout, tmp_path):
    link = tmp_path / "repo-link"
    link.symlink_to(layout.repo)
    paths = canonicalize(
        SandboxSpec(
            policy=Policy.READ_ONLY,
            scratch=layout.scratch,
            visible=(link, layout.repo, layout.ipc),
            cwd=link,
        )
    )
    assert paths.visible == (layout.repo.resolve(), layout.ipc.resolve())
    assert paths.cwd == layout.repo.resolve()
    assert paths.scratch == layout.scratch.resolve()


@pytest.mark.parametrize("where", ["home", "parent of home"])
def test_writable_path_containing_home_is_refused(home, layout, where):
    writable = home if where == "home" else home.parent
    spec = SandboxSpec(policy=Policy.WORKER, scratch=layout.scratch, writable=(writable,))
    with pytest.raises(SandboxError, match=r"contains \$HOME") as caught:
        canonicalize(spec)
    assert caught.value.path == writable.resolve()


def test_scratch_containing_home_is_refused(home):
    with pytest.raises(SandboxError, match=rf"writable path {home} contains \$HOME"):
        canonicalize(SandboxSpec(policy=Policy.READ_ONLY, scratch=home))


def test_writable_path_below_home_is_allowed(home, layout):
    # The default $FLEET_HOME (worktrees, scratch) lives under the user's home.
    worktree = home / ".local" / "state" / "fleet" / "wt"
    worktree.mkdir(parents=True)
    paths = canonicalize(
        SandboxSpec(policy=Policy.WORKER, scratch=layout.scratch, writable=(worktree,))
    )
    assert paths.writable == (worktree,)


@pytest.mark.parametrize("field", ["visible", "sockets"])
def test_visible_path_inside_a_writable_one_is_refused(layout, field):
    nested = layout.worktree / "repo"
    nested.mkdir()
    spec = SandboxSpec(
        policy=Policy.WORKER,
        scratch=layout.scratch,
        writable=(layout.worktree,),
        visible=(nested,) if field == "visible" else (),
        sockets=(nested,) if field == "sockets" else (),
    )
    with pytest.raises(SandboxError, match="would become writable") as caught:
        canonicalize(spec)
    assert caught.value.path == nested.resolve()


def test_visible_path_inside_scratch_is_refused(layout):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.repo.parent, visible=(layout.repo,))
    with pytest.raises(SandboxError, match="lies inside writable path"):
        canonicalize(spec)


def test_writable_inside_a_visible_path_is_allowed(layout):
    # A worktree below the repository: the later --bind wins over the --ro-bind.
    inner = layout.repo / "wt"
    inner.mkdir()
    spec = SandboxSpec(
        policy=Policy.WORKER, scratch=layout.scratch, visible=(layout.repo,), writable=(inner,)
    )
    assert canonicalize(spec).writable == (inner.resolve(),)


def test_missing_path_is_refused_with_its_role(layout):
    missing = layout.repo / "gone"
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch, visible=(missing,))
    with pytest.raises(SandboxError, match=r"visible path .*gone cannot be resolved") as caught:
        canonicalize(spec)
    assert caught.value.path == missing


def test_scratch_must_be_a_directory(layout):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.repo / "README")
    with pytest.raises(SandboxError, match="is not a directory"):
        canonicalize(spec)


def test_cwd_outside_every_named_path_is_refused(layout, tmp_path):
    # bwrap would start the child in $HOME if it could not see the cwd.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch, cwd=elsewhere)
    with pytest.raises(SandboxError, match=r"cwd .* is not inside scratch"):
        canonicalize(spec)


def test_error_messages_are_one_line(layout):
    spec = SandboxSpec(policy=Policy.WORKER, scratch=layout.scratch, writable=(Path("/"),))
    with pytest.raises(SandboxError) as caught:
        canonicalize(spec)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("path", "ancestor", "within"),
    [
        ("/a/b", "/a/b", True),
        ("/a/b/c", "/a/b", True),
        ("/a/bc", "/a/b", False),
        ("/a", "/a/b", False),
        ("/anything", "/", True),
        ("/", "/", True),
        ("/", "/a", False),
        ("/a/b/", "/a", True),  # a trailing slash is dropped by Path: still below /a
    ],
)
def test_is_within_compares_components_not_string_prefixes(path, ancestor, within):
    assert is_within(Path(path), Path(ancestor)) is within
