import fnmatch
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.governance._globmatch import owns, witness_path
from orchestrator.governance._ownership import (
    LockConflict,
    LockTable,
    SpecError,
    _probe_case_insensitive,
    may_overlap,
    normalize,
)

# --- an independent reference matcher: fnmatch per component, "**" spans whole components ---


def _ref_match(spec: list[str], path: list[str]) -> bool:
    if not spec:
        return not path
    head, rest = spec[0], spec[1:]
    if head == "**":
        if not rest:
            return len(path) >= 1
        return any(_ref_match(rest, path[k:]) for k in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], head) and _ref_match(rest, path[1:])


def _ref_owns(spec: str, path: str) -> bool:
    """A spec owns what it matches and everything below: some leading part of path matches."""
    spec_parts, path_parts = spec.split("/")[1:], path.split("/")[1:]
    return any(_ref_match(spec_parts, path_parts[:k]) for k in range(1, len(path_parts) + 1))


_TOKEN = st.sampled_from(["a", "b", "c", "*", "?", "[ab]", "[!a]", "[a-c]", "[]b]", "["])
_SPEC_PART = st.one_of(
    st.just("**"), st.lists(_TOKEN, min_size=1, max_size=3).map("".join), st.just("ab")
)
_SPEC = st.lists(_SPEC_PART, min_size=1, max_size=4).map(lambda parts: "/r/" + "/".join(parts))
_PATH_PART = st.sampled_from(["a", "b", "c", "ab", "ba", "abc", "]", "[", "x"])
_PATH = st.lists(_PATH_PART, min_size=1, max_size=5).map(lambda parts: "/r/" + "/".join(parts))


@settings(max_examples=400, deadline=None)
@given(a=_SPEC, b=_SPEC, paths=st.lists(_PATH, min_size=1, max_size=12))
def test_may_overlap_never_misses_a_path_owned_by_both(a: str, b: str, paths: list[str]) -> None:
    for path in paths:
        if _ref_owns(a, path) and _ref_owns(b, path):
            assert may_overlap(a, b), (a, b, path)


@settings(max_examples=400, deadline=None)
@given(a=_SPEC, b=_SPEC)
def test_every_reported_overlap_has_a_witness_owned_by_both(a: str, b: str) -> None:
    witness = witness_path(a, b)
    if witness is not None:
        assert _ref_owns(a, witness), (a, b, witness)
        assert _ref_owns(b, witness), (a, b, witness)


@settings(max_examples=400, deadline=None)
@given(spec=_SPEC, path=_PATH)
def test_owns_agrees_with_the_reference_matcher(spec: str, path: str) -> None:
    assert owns(spec, path) == _ref_owns(spec, path)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("/r/src/**", "/r/src/a.py", True),
        ("/r/*.py", "/r/docs/x.md", False),
        ("/r/*.py", "/r/x.py", True),
        # x.md may be a directory holding y.py, which **/*.py matches.
        ("/r/**/*.py", "/r/docs/x.md", True),
        ("/r/src/**/*.py", "/r/docs/x.md", False),
        ("/r/**/*.py", "/r/docs/deep/x.py", True),
        ("/r/a/*/c", "/r/a/b/*", True),
        ("/r/[ab].py", "/r/a.py", True),
        ("/r/[!a].py", "/r/a.py", False),
        ("/r/src", "/r/src/deep/file.py", True),
        ("/r/src", "/r/srcx", False),
        ("/r/a/*.py", "/r/a/b/c.md", False),
        ("/r/a/*", "/r/a/b/c", True),
        ("/r/**", "/elsewhere/x", False),
        ("/", "/r/anything", True),
    ],
)
def test_may_overlap_examples(a: str, b: str, expected: bool) -> None:
    assert may_overlap(a, b) is expected
    assert may_overlap(b, a) is expected


def test_witness_names_a_concrete_shared_path() -> None:
    assert witness_path("/r/a/*/c", "/r/a/b/*") == "/r/a/b/c"
    assert witness_path("/r/*.py", "/r/docs/x.md") is None


def test_may_overlap_refuses_a_spec_that_was_not_normalized() -> None:
    with pytest.raises(SpecError, match="not normalized"):
        may_overlap("src/**", "/r/src")


def test_normalize_resolves_relative_specs_against_the_root(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    assert normalize("src/**", root=root, case_insensitive=False) == f"{root}/src/**"
    assert normalize("./src//a.py", root=root, case_insensitive=False) == f"{root}/src/a.py"
    assert normalize("/abs/x", root=root, case_insensitive=False) == "/abs/x"
    assert normalize("src/../lib/*", root=root, case_insensitive=False) == f"{root}/lib/*"


def test_normalize_resolves_a_symlinked_directory(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    (root / "real").mkdir()
    (root / "link").symlink_to(root / "real")
    assert normalize("link/*.py", root=root, case_insensitive=False) == f"{root}/real/*.py"
    assert normalize("link/new/a.py", root=root, case_insensitive=False) == (
        f"{root}/real/new/a.py"
    )


def test_normalize_keeps_wildcard_characters_in_a_real_directory_name_literal(
    tmp_path: Path,
) -> None:
    root = tmp_path.resolve() / "a[1]"
    root.mkdir()
    spec = normalize("x", root=root, case_insensitive=False)
    assert spec == f"{tmp_path.resolve()}/a[[]1]/x"
    assert owns(spec, f"{root}/x/y")


def test_normalize_refuses_dotdot_after_a_wildcard_and_empty_specs(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"'\.\.' follows a wildcard"):
        normalize("src/*/../x", root=tmp_path, case_insensitive=False)
    with pytest.raises(SpecError, match="non-empty"):
        normalize("", root=tmp_path, case_insensitive=False)


def test_normalize_case_folds_on_a_case_insensitive_file_system(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    folded = normalize("Src/Main.PY", root=root, case_insensitive=True)
    assert folded == f"{root}/src/main.py".lower()
    # A class holding a cased letter widens to "?": [A-Z] must also match lowered names.
    assert normalize("[A-Z]*.py", root=root, case_insensitive=True).endswith("/?*.py")
    assert normalize("[a-z]*.py", root=root, case_insensitive=True).endswith("/[a-z]*.py")
    assert may_overlap(
        normalize("SRC/[A-Z].py", root=root, case_insensitive=True),
        normalize("src/q.PY", root=root, case_insensitive=True),
    )
    assert normalize("Src", root=root, case_insensitive=False) == f"{root}/Src"


def test_case_probe_finds_this_file_system_case_sensitive_and_cleans_up(tmp_path: Path) -> None:
    before = set(os.listdir(tmp_path))
    assert _probe_case_insensitive(str(tmp_path)) is False
    assert set(os.listdir(tmp_path)) == before


def test_case_probe_assumes_the_platform_default_when_it_cannot_write(tmp_path: Path) -> None:
    assert _probe_case_insensitive(str(tmp_path / "Missing")) is False


def test_acquire_returns_normalized_specs_and_snapshot_lists_them(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    table = LockTable()
    assert table.acquire("a1", ["src/**", "src/**", "docs"], root=root) == (
        f"{root}/src/**",
        f"{root}/docs",
    )
    assert table.snapshot() == {"a1": (f"{root}/src/**", f"{root}/docs")}


def test_acquire_is_all_or_nothing(tmp_path: Path) -> None:
    table = LockTable()
    table.acquire("a2", ["src/**"], root=tmp_path)
    with pytest.raises(LockConflict) as caught:
        table.acquire("a1", ["docs", "src/a.py"], root=tmp_path)
    root = tmp_path.resolve()
    assert caught.value.spec == f"{root}/src/a.py"
    assert caught.value.holder == "a2"
    assert caught.value.holder_spec == f"{root}/src/**"
    assert caught.value.owner == "a1"
    message = str(caught.value)
    assert "\n" not in message
    assert f"path {root}/src/a.py is owned by a2 ({root}/src/**)" in message
    assert table.snapshot() == {"a2": (f"{root}/src/**",)}


def test_reacquiring_own_or_overlapping_own_specs_is_fine(tmp_path: Path) -> None:
    table = LockTable()
    table.acquire("a1", ["src/**"], root=tmp_path)
    table.acquire("a1", ["src/**", "src/a.py"], root=tmp_path)
    root = tmp_path.resolve()
    assert table.snapshot() == {"a1": (f"{root}/src/**", f"{root}/src/a.py")}


def test_conflict_through_a_symlinked_alias(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    table = LockTable()
    table.acquire("a1", ["real/x.py"], root=tmp_path)
    with pytest.raises(LockConflict):
        table.acquire("a2", ["alias/*.py"], root=tmp_path)


def test_release_is_idempotent_and_frees_the_paths(tmp_path: Path) -> None:
    table = LockTable()
    taken = table.acquire("a1", ["src"], root=tmp_path)
    assert table.release("a1") == taken
    assert table.release("a1") == ()
    assert table.snapshot() == {}
    assert table.acquire("a2", ["src/a.py"], root=tmp_path)


def test_holds_covers_concrete_paths_below_a_spec(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    table = LockTable()
    table.acquire("a1", ["real/*.py", "docs"], root=tmp_path)
    assert table.holds("a1", Path("real/a.py"))
    assert table.holds("a1", Path("alias/a.py"))
    assert table.holds("a1", tmp_path / "docs" / "deep" / "x.md")
    assert not table.holds("a1", Path("real/a.md"))
    assert not table.holds("a1", Path("src/a.py"))
    assert not table.holds("nobody", Path("docs"))


def test_empty_acquire_takes_nothing(tmp_path: Path) -> None:
    table = LockTable()
    assert table.acquire("a1", [], root=tmp_path) == ()
    assert table.snapshot() == {}


def test_case_folding_keeps_a_bracket_split_by_a_slash_literal(tmp_path: Path) -> None:
    # "[A/B]" is two components, "[A" and "B]", both literal: folding must not join them.
    root = tmp_path.resolve()
    assert normalize("[A/B]", root=root, case_insensitive=True) == f"{root}/[a/b]".lower()
