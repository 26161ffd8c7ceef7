"""The writing file tools, ``edit`` and ``write``, and the path guard they share.

Writes are confined to the workspace twice over: the lexical path (``..`` folded) and the real
path (every symlink followed, including a dangling last link and symlinked ancestors) must both
lie inside it, and neither may enter Git metadata. The write then goes to that checked real path
through a temporary sibling and ``os.replace``: readers never see half a file, a hard link to a
file outside is broken rather than written through, and the old mode is kept.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from ._base import BaseTool, ToolContext, ToolError, ToolResult, is_binary, require_str

if TYPE_CHECKING:
    from collections.abc import Mapping


def writable_path(ctx: ToolContext, raw: str, *, tool: str) -> Path:
    """The real path ``raw`` names, if a write there stays inside the workspace; else refuse."""
    requested = ctx.resolve(raw)
    lexical = Path(os.path.normpath(requested))
    real = Path(os.path.realpath(requested))
    workspace = ctx.workspace
    if not lexical.is_relative_to(workspace):
        raise ToolError(
            f"{tool}: refused {raw}: it is outside the workspace {workspace}; "
            "write only inside the workspace"
        )
    if not real.is_relative_to(workspace):
        raise ToolError(
            f"{tool}: refused {raw}: a symlink makes it resolve to {real}, outside the workspace "
            f"{workspace}; write only inside the workspace"
        )
    for path in (lexical, real):
        # casefold: on a case-insensitive file system ``.GIT`` is the same directory.
        if any(part.casefold() == ".git" for part in path.relative_to(workspace).parts):
            raise ToolError(
                f"{tool}: refused {raw}: it is inside Git metadata (.git); "
                "change working-tree files only"
            )
    if real == workspace:
        raise ToolError(f"{tool}: refused {raw}: it is the workspace directory; name a file")
    return real


def _replace_file(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` via a temporary sibling, keeping an existing file's mode."""
    try:
        mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = None
    temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.fleet-tmp")
    # 0o666 lets the umask decide a new file's mode, as a plain ``open`` would.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(temp, flags, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            if mode is not None:
                os.fchmod(file.fileno(), mode)
        # No fsync: this guards against torn reads by concurrent readers, not power loss; an
        # agent saving hundreds of edits should not pay a disk flush for each.
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _read_text(path: Path, shown: str) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ToolError(
            f"edit: {shown} does not exist; create it with write, or check the path with ls"
        ) from None
    except IsADirectoryError:
        raise ToolError(f"edit: {shown} is a directory; name a file") from None
    if is_binary(data):
        raise ToolError(f"edit: {shown} is a binary file; only text files can be edited")
    try:
        # newline handling stays byte-exact: the edit must not rewrite a file's line endings.
        return data.decode()
    except UnicodeDecodeError:
        raise ToolError(f"edit: {shown} is not UTF-8 text; it cannot be edited safely") from None


class EditTool(BaseTool):
    name = "edit"
    description = (
        "Replace one exact occurrence of old_text with new_text in a file inside the workspace. "
        "old_text must match exactly once, whitespace included; add surrounding lines to make "
        "it unique."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to edit."},
            "old_text": {"type": "string", "description": "Exact text to replace (unique)."},
            "new_text": {"type": "string", "description": "Replacement text."},
        },
        "required": ["path", "old_text", "new_text"],
        "additionalProperties": False,
    }

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        path = writable_path(ctx, require_str(args, "path", tool="edit"), tool="edit")
        old = require_str(args, "old_text", tool="edit")
        new = require_str(args, "new_text", tool="edit", empty_ok=True)
        if old == new:
            raise ToolError("edit: old_text and new_text are identical; nothing would change")
        shown = ctx.display(path)
        content = await trio.to_thread.run_sync(_read_text, path, shown)
        count = content.count(old)
        if count == 0 and "\r\n" in content and "\r\n" not in old:
            # Models write "\n"; a CRLF file should still be editable without changing endings.
            old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
            count = content.count(old)
        if count == 0:
            raise ToolError(
                f"edit: old_text was not found in {shown}; read the file and copy the exact "
                "text, whitespace included"
            )
        if count > 1:
            raise ToolError(
                f"edit: old_text occurs {count} times in {shown}; include more surrounding "
                "lines so it matches exactly once"
            )
        await ctx.check_may_write(path)
        index = content.index(old)
        updated = content[:index] + new + content[index + len(old) :]
        await trio.to_thread.run_sync(_replace_file, path, updated.encode())
        first = content.count("\n", 0, index) + 1
        removed, added = old.count("\n") + 1, new.count("\n") + 1
        return ToolResult(
            text=f"Edited {shown} at line {first}: replaced {removed} line(s) with {added}."
        )


class WriteTool(BaseTool):
    name = "write"
    description = (
        "Create or overwrite a file inside the workspace with content (parent directories are "
        "created). Prefer edit for changing part of an existing file."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to write."},
            "content": {"type": "string", "description": "The whole new file content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        path = writable_path(ctx, require_str(args, "path", tool="write"), tool="write")
        content = require_str(args, "content", tool="write", empty_ok=True)
        shown = ctx.display(path)
        if path.is_dir():
            raise ToolError(f"write: {shown} is a directory; name a file")
        await ctx.check_may_write(path)
        existed = path.exists()
        data = content.encode()

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            _replace_file(path, data)

        await trio.to_thread.run_sync(write)
        verb = "Overwrote" if existed else "Created"
        return ToolResult(text=f"{verb} {shown} ({len(data)} bytes).")
