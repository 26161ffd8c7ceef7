"""Output caps, path helpers and error translation shared by every tool."""

from pathlib import Path
from typing import Any, ClassVar

import pytest

from child.tools import ToolContext, ToolResult
from child.tools._base import (
    MAX_OUTPUT_BYTES,
    MAX_OUTPUT_LINES,
    BaseTool,
    ToolError,
    clip_head,
    clip_tail,
    optional_int,
)


def test_clip_head_keeps_short_text_unchanged():
    text = "a\nb\n"
    assert clip_head(text) == text


def test_clip_head_caps_lines_and_says_how_many_were_cut():
    text = "".join(f"{n}\n" for n in range(3000))
    clipped = clip_head(text, hint="use offset")
    lines = clipped.splitlines()
    assert len(lines) == MAX_OUTPUT_LINES + 1
    assert lines[-2] == str(MAX_OUTPUT_LINES - 1)
    assert lines[-1] == "[truncated: 1000 more lines not shown; use offset]"


def test_clip_head_caps_bytes_and_cuts_one_huge_line():
    clipped = clip_head("é" * 100_000)  # 200 000 bytes on one line
    body, note = clipped.rsplit("\n", 1)
    assert len(body.encode()) <= MAX_OUTPUT_BYTES + 40
    assert body.startswith("é" * 1000)
    assert body.endswith("[line truncated]")
    assert note.startswith("[truncated:")


def test_clip_tail_keeps_the_end_and_counts_dropped_bytes():
    text = "".join(f"{n}\n" for n in range(3000))
    clipped = clip_tail(text, omitted_bytes=7)
    lines = clipped.splitlines()
    assert lines[0] == "[truncated: first 1000 lines and 7 earlier bytes not shown]"
    assert lines[-1] == "2999"
    assert len(lines) == MAX_OUTPUT_LINES + 1


def test_context_stores_the_real_workspace_and_resolves_relative_paths(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    ctx = ToolContext(workspace=tmp_path / "link")
    assert ctx.workspace == real
    assert ctx.resolve("a/b") == real / "a" / "b"
    assert ctx.resolve("/etc/hosts") == Path("/etc/hosts")
    assert ctx.display(real / "a" / "b") == "a/b"
    assert ctx.display(real) == "."
    assert ctx.display(Path("/etc/hosts")) == "/etc/hosts"


def test_optional_int_rejects_booleans_and_small_values():
    assert optional_int({"n": 3}, "n", tool="t", minimum=1) == 3
    assert optional_int({}, "n", tool="t", minimum=1) is None
    for bad in (True, 0, "3", 1.5):
        with pytest.raises(ToolError, match="argument 'n' must be an integer >= 1"):
            optional_int({"n": bad}, "n", tool="t", minimum=1)


class _Failing(BaseTool):
    name = "failing"
    description = "raises what it is told"
    parameters: ClassVar[dict[str, Any]] = {"type": "object"}

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def execute(self, ctx, args):
        raise self.error


async def test_run_turns_tool_and_os_errors_into_one_line_error_results(tmp_path):
    ctx = ToolContext(workspace=tmp_path)
    result = await _Failing(ToolError("failing: nope; do this")).run(ctx, {})
    assert result == ToolResult(text="failing: nope; do this", is_error=True)
    denied = PermissionError(13, "Permission denied", "/x/y")
    result = await _Failing(denied).run(ctx, {})
    assert result == ToolResult(text="failing: /x/y: Permission denied", is_error=True)


async def test_run_lets_programming_errors_through(tmp_path):
    with pytest.raises(KeyError):
        await _Failing(KeyError("bug")).run(ToolContext(workspace=tmp_path), {})
