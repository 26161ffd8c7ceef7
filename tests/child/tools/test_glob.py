"""The glob dialect ``find`` and ``grep --glob`` understand."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from child.tools._glob import compile_glob


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.py", "a.py", True),
        ("*.py", "deep/er/a.py", True),
        ("*.py", "a.pyc", False),
        ("src/*.py", "src/a.py", True),
        ("src/*.py", "src/x/a.py", False),
        ("src/**/*.py", "src/a.py", True),
        ("src/**/*.py", "src/x/y/a.py", True),
        ("src/**/*.py", "lib/src/a.py", False),
        ("**/test_*.py", "test_a.py", True),
        ("**/test_*.py", "t/test_a.py", True),
        ("*.{ts,tsx}", "a.tsx", True),
        ("*.{ts,tsx}", "a.js", False),
        ("{src,lib/{a,b}}/*.c", "lib/b/x.c", True),
        ("{src,lib/{a,b}}/*.c", "lib/c/x.c", False),
        ("file?.txt", "file1.txt", True),
        ("file?.txt", "file10.txt", False),
        ("[!a]b", "cb", True),
        ("[!a]b", "ab", False),
        ("[a-c]x", "bx", True),
        ("[[]x", "[x", True),
        ("a+b(c).txt", "a+b(c).txt", True),
        ("[unclosed", "[unclosed", True),
        ("{unclosed", "{unclosed", True),
    ],
)
def test_glob_matches_like_a_shell_with_globstar(pattern, path, expected):
    assert compile_glob(pattern)(path) is expected


@given(st.text(alphabet="ab/*?[]{},!.-", max_size=12), st.text(alphabet="ab/.", max_size=12))
def test_any_pattern_compiles_and_answers(pattern, path):
    assert compile_glob(pattern)(path) in {True, False}


@given(st.from_regex(r"[a-z]{1,5}(/[a-z]{1,5}){0,3}", fullmatch=True))
def test_a_literal_path_matches_itself_and_star_never_crosses_a_slash(path):
    assert compile_glob(path)(path)
    assert compile_glob("*/*")(path) is (path.count("/") == 1)


@pytest.mark.parametrize("pattern", ["[?-/]", "[?--]", "[z-a]x"])
def test_a_reversed_class_range_matches_nothing_instead_of_raising(pattern):
    matcher = compile_glob(pattern)
    assert not matcher("a")
    assert not matcher("ax")
