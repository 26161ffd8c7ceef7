"""The read-only file tools: ``read``, ``ls``, ``find`` and ``grep``.

They may look outside the workspace (a scout reads the whole repository; the OS sandbox is what
confines a child), never follow symlinked directories while walking, skip ``.git``, what
``.gitignore``/``.ignore`` exclude (``_ignore``, as ripgrep does) and binary files, and keep
every result within the output caps. The blocking file work runs in a worker thread that polls
for cancellation, so an abandoned walk stops promptly.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from ._base import (
    BINARY_SNIFF_BYTES,
    MAX_OUTPUT_BYTES,
    MAX_OUTPUT_LINES,
    BaseTool,
    ToolContext,
    ToolError,
    ToolResult,
    clip_head,
    clip_line,
    is_binary,
    optional_int,
    optional_str,
    require_str,
)
from ._glob import compile_glob
from ._ignore import list_files, tree_order

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from pathlib import Path
    from typing import BinaryIO

MAX_LINE_CHARS = 2000
MAX_LS_ENTRIES = 500
MAX_FIND_RESULTS = 1000
MAX_GREP_MATCHES = 200
MAX_GREP_LINE_CHARS = 500
#: grep skips files larger than this: generated blobs and logs drown the useful matches.
MAX_GREP_FILE_BYTES = 10 * 1024 * 1024
#: Whether ``rg`` lists the files when it is on PATH (the tests turn it off for the fallback).
USE_RG = True


def _walk(root: Path, ctx: ToolContext) -> Iterator[tuple[str, bool]]:
    """Yield ``(relative-posix, is_dir)`` under ``root`` in a top-down walk's order: the files
    ripgrep would list (no ``.git``, nothing git-ignored or in ``.ignore``; see ``_ignore``) and
    their directories, without anything the context forbids (the state directory, symlinks into
    it)."""
    files = list_files(root, lambda path: not ctx.forbidden(path), use_rg=USE_RG)
    return tree_order(files)


class ReadTool(BaseTool):
    name = "read"
    description = (
        "Read a text file with line numbers. Relative paths resolve against the workspace. "
        f"Shows up to {MAX_OUTPUT_LINES} lines or {MAX_OUTPUT_BYTES // 1024} KB; use offset "
        "(1-based line) and limit to page through longer files."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to read."},
            "offset": {"type": "integer", "minimum": 1, "description": "First line (1-based)."},
            "limit": {"type": "integer", "minimum": 1, "description": "Maximum lines to show."},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        path = ctx.resolve(require_str(args, "path", tool="read"))
        offset = optional_int(args, "offset", tool="read", minimum=1) or 1
        limit = optional_int(args, "limit", tool="read", minimum=1) or MAX_OUTPUT_LINES
        text = await trio.to_thread.run_sync(_read, path, ctx.display(path), offset, limit)
        return ToolResult(text=text)


def _read(path: Path, shown: str, offset: int, limit: int) -> str:
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            # Opening a FIFO or a terminal device would block the tool forever.
            raise ToolError(f"read: {shown} is not a regular file; only files can be read")
        with path.open("rb") as file:
            head = file.read(BINARY_SNIFF_BYTES)
            if is_binary(head):
                size = os.fstat(file.fileno()).st_size
                return f"{shown} is a binary file ({size} bytes); not shown."
            file.seek(0)
            return _numbered(file, shown, offset, min(limit, MAX_OUTPUT_LINES))
    except FileNotFoundError:
        raise ToolError(f"read: {shown} does not exist; check the path with ls or find") from None
    except IsADirectoryError:
        raise ToolError(f"read: {shown} is a directory; list it with ls") from None


def _numbered(file: BinaryIO, shown: str, offset: int, limit: int) -> str:
    out: list[str] = []
    budget = MAX_OUTPUT_BYTES
    last = offset - 1
    total = 0
    for total, raw in enumerate(file, start=1):  # total ends as the line count
        if offset <= total < offset + limit and budget > 0:
            line = raw.decode(errors="replace").rstrip("\r\n")
            entry = f"{total:>6}\t{clip_line(line, MAX_LINE_CHARS)}\n"
            budget -= len(entry.encode())
            if budget >= 0:
                out.append(entry)
                last = total
    if total == 0:
        return f"{shown} is empty."
    if offset > total:
        raise ToolError(
            f"read: offset {offset} is past the end of {shown} ({total} lines); "
            "pass a smaller offset"
        )
    text = "".join(out)
    if last < total:
        text += (
            f"[truncated: showing lines {offset}-{last} of {total}; "
            f"use offset={last + 1} to continue]\n"
        )
    return text


class LsTool(BaseTool):
    name = "ls"
    description = (
        "List a directory (default: the workspace), sorted, directories marked with '/', "
        "symlinks with '@'."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "Directory to list."}},
        "additionalProperties": False,
    }

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        path = ctx.resolve(optional_str(args, "path", tool="ls") or ".")
        text = await trio.to_thread.run_sync(_ls, path, ctx.display(path))
        return ToolResult(text=text)


def _ls(path: Path, shown: str) -> str:
    try:
        entries = sorted(os.scandir(path), key=lambda entry: (entry.name.casefold(), entry.name))
    except FileNotFoundError:
        raise ToolError(f"ls: {shown} does not exist; list its parent to find it") from None
    except NotADirectoryError:
        raise ToolError(f"ls: {shown} is a file, not a directory; read it instead") from None
    if not entries:
        return f"{shown} is empty."
    names = []
    for entry in entries[:MAX_LS_ENTRIES]:
        if entry.is_symlink():
            names.append(entry.name + "@")
        elif entry.is_dir():
            names.append(entry.name + "/")
        else:
            names.append(entry.name)
    if len(entries) > MAX_LS_ENTRIES:
        names.append(f"[truncated: {len(entries) - MAX_LS_ENTRIES} more entries not shown]")
    return "\n".join(names) + "\n"


class FindTool(BaseTool):
    name = "find"
    description = (
        "Find files and directories by glob under path (default: the workspace), skipping "
        ".git and what .gitignore or .ignore exclude. A pattern without '/' matches names "
        "at any depth ('*.py'); with '/' it matches the path relative to path "
        "('src/**/test_*.py'). '**' spans directories, '{a,b}' alternates. "
        f"At most {MAX_FIND_RESULTS} results."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Glob, e.g. '*.py' or 'src/**/*.ts'."},
            "path": {"type": "string", "description": "Directory to search."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        pattern = require_str(args, "pattern", tool="find")
        root = ctx.resolve(optional_str(args, "path", tool="find") or ".")
        matches = await trio.to_thread.run_sync(_find, ctx, root, ctx.display(root), pattern)
        if not matches:
            return ToolResult(text=f"No files match {pattern!r} under {ctx.display(root)}.")
        lines = [ctx.display(path) + ("/" if is_dir else "") for path, is_dir in matches]
        if len(matches) > MAX_FIND_RESULTS:
            lines[MAX_FIND_RESULTS:] = [
                f"[truncated: stopped after {MAX_FIND_RESULTS} results; narrow the pattern or path]"
            ]
        return ToolResult(text=clip_head("\n".join(lines) + "\n"))


def _find(ctx: ToolContext, root: Path, shown: str, pattern: str) -> list[tuple[Path, bool]]:
    if not root.is_dir():
        raise ToolError(f"find: {shown} is not a directory; pass a directory as path")
    if pattern.startswith("/"):
        raise ToolError(f"find: pattern {pattern!r} is absolute; pass the directory as path")
    matcher = compile_glob(pattern.removeprefix("./"))
    matches: list[tuple[Path, bool]] = []
    for relative, is_dir in _walk(root, ctx):
        if matcher(relative):
            matches.append((root / relative, is_dir))
            # One past the cap tells the caller to add the truncation note.
            if len(matches) > MAX_FIND_RESULTS:
                break
    return matches


class GrepTool(BaseTool):
    name = "grep"
    description = (
        "Search file contents with a Python regular expression under path (a file or "
        "directory, default: the workspace), skipping .git, git-ignored, binary and huge "
        "files. Prints "
        f"'file:line:text'. glob filters files like find's pattern. At most {MAX_GREP_MATCHES} "
        "matches."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression (Python syntax)."},
            "path": {"type": "string", "description": "File or directory to search."},
            "glob": {"type": "string", "description": "Only files matching this glob."},
            "ignore_case": {"type": "boolean", "description": "Case-insensitive match."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        pattern = require_str(args, "pattern", tool="grep")
        root = ctx.resolve(optional_str(args, "path", tool="grep") or ".")
        glob = optional_str(args, "glob", tool="grep")
        ignore_case = args.get("ignore_case", False)
        if not isinstance(ignore_case, bool):
            raise ToolError(f"grep: argument 'ignore_case' must be a boolean (got {ignore_case!r})")
        try:
            regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as error:
            raise ToolError(f"grep: invalid regular expression {pattern!r}: {error}") from None
        matcher = compile_glob(glob) if glob else None
        hits = await trio.to_thread.run_sync(_grep, ctx, root, regex, matcher)
        if not hits:
            return ToolResult(text=f"No matches for {pattern!r} under {ctx.display(root)}.")
        if len(hits) > MAX_GREP_MATCHES:
            hits[MAX_GREP_MATCHES:] = [
                f"[truncated: stopped after {MAX_GREP_MATCHES} matches; narrow the pattern or path]"
            ]
        return ToolResult(text=clip_head("\n".join(hits) + "\n"))


def _grep(
    ctx: ToolContext,
    root: Path,
    regex: re.Pattern[str],
    matcher: Callable[[str], bool] | None,
) -> list[str]:
    try:
        mode = root.stat().st_mode
    except FileNotFoundError:
        raise ToolError(f"grep: {ctx.display(root)} does not exist; check it with ls") from None
    if stat.S_ISDIR(mode):
        files = [
            root / relative
            for relative, is_subdir in _walk(root, ctx)
            if not is_subdir and (matcher is None or matcher(relative))
        ]
    else:
        files = [root]
    hits: list[str] = []
    for path in files:
        trio.from_thread.check_cancelled()
        # One past the cap tells the caller to add the truncation note.
        room = MAX_GREP_MATCHES + 1 - len(hits)
        found = itertools.islice(_grep_file(path, regex), room)
        hits.extend(f"{ctx.display(path)}:{number}:{line}" for number, line in found)
        if len(hits) > MAX_GREP_MATCHES:
            break
    return hits


def _grep_file(path: Path, regex: re.Pattern[str]) -> Iterator[tuple[int, str]]:
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_GREP_FILE_BYTES:
            return
        data = path.read_bytes()
    except OSError:
        # A dangling symlink, a socket or an unreadable file is not worth failing the search.
        return
    if is_binary(data):
        return
    for number, line in enumerate(data.decode(errors="replace").splitlines(), start=1):
        if regex.search(line):
            yield number, clip_line(line, MAX_GREP_LINE_CHARS)
