"""read, ls, find and grep against real files."""

import os

import pytest
import trio

from child.tools import ToolContext, build_tools
from child.tools._fs import MAX_FIND_RESULTS, MAX_GREP_MATCHES, MAX_LS_ENTRIES


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "main.py").write_text("import os\nprint('Hello')\n")
    (root / "src" / "pkg" / "util.py").write_text("def hello():\n    return 'hello'\n")
    (root / "README.md").write_text("# Demo\nhello world\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("hello from git\n")
    (root / "blob.bin").write_bytes(b"hello\0\1\2")
    return root


async def call(root, name, **args):
    ctx = ToolContext(workspace=root)
    with trio.fail_after(10):
        return await build_tools([name], ctx)[name].run(ctx, args)


async def test_read_numbers_lines(ws):
    result = await call(ws, "read", path="src/main.py")
    assert not result.is_error
    assert result.text == "     1\timport os\n     2\tprint('Hello')\n"


async def test_read_pages_with_offset_and_limit_and_says_how_to_continue(ws):
    (ws / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    result = await call(ws, "read", path="long.txt", offset=4, limit=3)
    assert result.text.splitlines() == [
        "     4\tline 4",
        "     5\tline 5",
        "     6\tline 6",
        "[truncated: showing lines 4-6 of 10; use offset=7 to continue]",
    ]


async def test_read_caps_a_long_file_at_2000_lines(ws):
    (ws / "big.txt").write_text("x\n" * 5000)
    lines = (await call(ws, "read", path="big.txt")).text.splitlines()
    assert len(lines) == 2001
    assert lines[-1] == "[truncated: showing lines 1-2000 of 5000; use offset=2001 to continue]"


async def test_read_caps_bytes_and_clips_very_long_lines(ws):
    (ws / "wide.txt").write_text(("y" * 5000 + "\n") * 100)
    text = (await call(ws, "read", path="wide.txt")).text
    assert len(text.encode()) <= 50 * 1024 + 200
    first = text.splitlines()[0]
    assert first.endswith("… [line truncated]")
    assert len(first) < 2100
    assert "use offset=" in text.splitlines()[-1]


async def test_read_outside_the_workspace_is_allowed(ws, tmp_path):
    (tmp_path / "outside.txt").write_text("shared\n")
    result = await call(ws, "read", path="../outside.txt")
    assert result.text == "     1\tshared\n"


async def test_read_of_a_binary_file_is_a_short_note(ws):
    result = await call(ws, "read", path="blob.bin")
    assert result.text == "blob.bin is a binary file (8 bytes); not shown."
    assert not result.is_error


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("nope.txt", "read: nope.txt does not exist; check the path with ls or find"),
        ("src", "read: src is a directory; list it with ls"),
    ],
)
async def test_read_errors_are_one_line(ws, path, message):
    result = await call(ws, "read", path=path)
    assert result.is_error
    assert result.text == message


async def test_read_offset_past_the_end_is_an_error(ws):
    result = await call(ws, "read", path="src/main.py", offset=9)
    assert result.is_error
    assert "offset 9 is past the end of src/main.py (2 lines)" in result.text


async def test_read_empty_file_and_fifo(ws):
    (ws / "empty").write_text("")
    assert (await call(ws, "read", path="empty")).text == "empty is empty."
    os.mkfifo(ws / "pipe")
    result = await call(ws, "read", path="pipe")
    assert result.is_error
    assert "not a regular file" in result.text


async def test_ls_sorts_and_marks_directories_and_symlinks(ws):
    (ws / "link").symlink_to(ws / "src")
    result = await call(ws, "ls")
    assert result.text.splitlines() == [".git/", "blob.bin", "link@", "README.md", "src/"]


async def test_ls_errors_and_cap(ws):
    assert "does not exist" in (await call(ws, "ls", path="missing")).text
    assert "is a file" in (await call(ws, "ls", path="README.md")).text
    many = ws / "many"
    many.mkdir()
    for n in range(MAX_LS_ENTRIES + 5):
        (many / f"f{n:04}").touch()
    lines = (await call(ws, "ls", path="many")).text.splitlines()
    assert len(lines) == MAX_LS_ENTRIES + 1
    assert lines[-1] == "[truncated: 5 more entries not shown]"


async def test_find_by_name_at_any_depth_skips_git(ws):
    (ws / ".git" / "hook.py").write_text("")
    result = await call(ws, "find", pattern="*.py")
    assert result.text.splitlines() == ["src/main.py", "src/pkg/util.py"]


async def test_find_by_path_pattern_and_subdirectory(ws):
    assert (await call(ws, "find", pattern="src/**/u*.py")).text == "src/pkg/util.py\n"
    assert (await call(ws, "find", pattern="pkg", path="src")).text == "src/pkg/\n"


async def test_find_does_not_follow_symlinked_directories(ws):
    (ws / "loop").symlink_to(ws)
    result = await call(ws, "find", pattern="*.md")
    assert result.text == "README.md\n"


async def test_find_no_match_and_cap(ws):
    result = await call(ws, "find", pattern="*.rs")
    assert result.text == "No files match '*.rs' under .."
    assert not result.is_error
    many = ws / "many"
    many.mkdir()
    for n in range(MAX_FIND_RESULTS + 3):
        (many / f"f{n:05}.log").touch()
    lines = (await call(ws, "find", pattern="*.log")).text.splitlines()
    assert len(lines) == MAX_FIND_RESULTS + 1
    assert lines[-1].startswith(f"[truncated: stopped after {MAX_FIND_RESULTS} results")


async def test_find_rejects_an_absolute_pattern(ws):
    result = await call(ws, "find", pattern="/etc/*.conf")
    assert result.is_error
    assert "is absolute; pass the directory as path" in result.text


async def test_grep_prints_file_line_text_and_skips_git_and_binary(ws):
    result = await call(ws, "grep", pattern="hello")
    assert result.text.splitlines() == [
        "README.md:2:hello world",
        "src/pkg/util.py:1:def hello():",
        "src/pkg/util.py:2:    return 'hello'",
    ]


async def test_grep_ignore_case_glob_and_single_file(ws):
    result = await call(ws, "grep", pattern="hello", ignore_case=True, glob="*.py")
    assert result.text.splitlines() == [
        "src/main.py:2:print('Hello')",
        "src/pkg/util.py:1:def hello():",
        "src/pkg/util.py:2:    return 'hello'",
    ]
    result = await call(ws, "grep", pattern=r"^import", path="src/main.py")
    assert result.text == "src/main.py:1:import os\n"


async def test_grep_no_match_invalid_regex_and_missing_path(ws):
    assert (await call(ws, "grep", pattern="zebra")).text == "No matches for 'zebra' under .."
    bad = await call(ws, "grep", pattern="(unclosed")
    assert bad.is_error
    assert bad.text.startswith("grep: invalid regular expression '(unclosed':")
    missing = await call(ws, "grep", pattern="x", path="nope")
    assert missing.is_error
    assert "does not exist" in missing.text


async def test_grep_caps_matches_and_clips_lines(ws):
    (ws / "many.txt").write_text("match\n" * (MAX_GREP_MATCHES + 50))
    (ws / "wide.txt").write_text("match" + "z" * 1000 + "\n")
    lines = (await call(ws, "grep", pattern="^match$")).text.splitlines()
    assert len(lines) == MAX_GREP_MATCHES + 1
    assert lines[-1].startswith(f"[truncated: stopped after {MAX_GREP_MATCHES} matches")
    wide = (await call(ws, "grep", pattern="matchz", path="wide.txt")).text
    assert wide.rstrip("\n").endswith("… [line truncated]")
    assert len(wide) < 600


async def test_grep_rejects_a_non_boolean_ignore_case(ws):
    result = await call(ws, "grep", pattern="x", ignore_case="yes")
    assert result.is_error
    assert "'ignore_case' must be a boolean" in result.text


async def test_a_missing_required_argument_is_an_error_result(ws):
    result = await call(ws, "read")
    assert result.is_error
    assert result.text == "read: argument 'path' must be a string (got NoneType)"
