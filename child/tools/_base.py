"""What every tool shares: the result, the context, the protocol, paths and output caps.

The context hands the todo checklist's :class:`Progress` to its listener, so that value lives
here, below the checklist (:mod:`._todo`) that computes it.

A tool never raises for a user mistake (a missing file, an ambiguous edit, a path outside the
workspace): it returns a ``ToolResult`` with ``is_error=True`` and a one-line text the model can
act on. ``ToolError`` is the internal shortcut for that: tools raise it deep inside a helper and
``run`` turns it into the error result.
"""

from __future__ import annotations

import abc
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import attrs

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping

#: Every tool result is capped at this many UTF-8 bytes and lines (Pi's limits).
MAX_OUTPUT_BYTES = 50 * 1024
MAX_OUTPUT_LINES = 2000

#: How much of a file is sniffed for a NUL byte to call it binary (git's heuristic).
BINARY_SNIFF_BYTES = 8192


class ToolError(Exception):
    """A refusal or failure the model should read; ``str(error)`` is the one-line result text."""


@attrs.frozen(kw_only=True)
class ToolResult:
    text: str
    is_error: bool = False


@attrs.frozen(kw_only=True)
class Progress:
    """The todo checklist at a glance, as ``peek`` shows it: done/total leaves, the task in
    progress and the next three open ones."""

    done: int
    total: int
    current: str | None
    next: tuple[str, ...]


def _realpath(path: Path | str) -> Path:
    return Path(os.path.realpath(path))


def _realpaths(paths: Iterable[Path | str]) -> tuple[Path, ...]:
    return tuple(map(_realpath, paths))


def _paths(paths: Iterable[Path | str]) -> tuple[Path, ...]:
    return tuple(Path(path) for path in paths)


@attrs.define(eq=False)
class ToolContext:
    """What the child runtime lends its tools for one session.

    ``workspace`` is stored as a real path: bash runs there and ``edit``/``write`` are confined
    to it. ``may_write`` is asked once per resolved path before the first write to it; a string
    answer refuses the write with that text. ``on_progress`` hears every todo change.
    """

    workspace: Path = attrs.field(converter=_realpath)
    may_write: Callable[[Path], Awaitable[str | None]] | None = None
    on_progress: Callable[[Progress], None] | None = None
    #: Hears a background event the model should be told (a shell's watch matched).
    notify: Callable[[str], None] | None = None
    bash_timeout: float = 120.0
    #: The fleet state directory (every session's tokens, sockets, loadouts and logs): no tool
    #: reads, lists or writes anything below it but the paths in ``own`` (the child's workspace
    #: and scratch, which may lie inside it), sandboxed or not.
    state_dir: Path | None = None
    #: Every other fleet's state directory and the per-user runtime root (every fleet's control
    #: token and sockets): refused like ``state_dir``.
    fenced: tuple[Path, ...] = attrs.field(default=(), converter=_paths)
    own: tuple[Path, ...] = attrs.field(default=(), converter=_realpaths)
    # Paths ``may_write`` already allowed: it is asked before the *first* write only.
    _allowed: set[Path] = attrs.field(factory=set, init=False)

    async def check_may_write(self, path: Path) -> None:
        """Ask the ownership hook about ``path`` once; raise ``ToolError`` if it refuses."""
        if self.may_write is None or path in self._allowed:
            return
        refusal = await self.may_write(path)
        if refusal is not None:
            raise ToolError(refusal)
        self._allowed.add(path)

    def resolve(self, raw: str) -> Path:
        """``raw`` made absolute against the workspace (``~`` expanded), ``..`` not yet folded.

        Refuses (``ToolError``) a path that names, or a symlink makes resolve to, anything in
        the state directory but the child's own workspace and scratch.
        """
        path = Path(raw).expanduser()
        path = path if path.is_absolute() else self.workspace / path
        root = self.forbidden_root(path)
        if root is not None:
            raise ToolError(
                f"refused {raw}: it is inside the fleet state directory {root}, "
                "which no child may read or write"
            )
        return path

    def forbidden(self, path: Path) -> bool:
        """Whether ``path`` (as named, or with symlinks resolved) lies in the state directory
        or a fenced one outside the child's own workspace and scratch."""
        return self.forbidden_root(path) is not None

    def forbidden_root(self, path: Path) -> Path | None:
        """The state directory (or fenced one) ``path`` lies in outside the child's own
        workspace and scratch, or ``None``."""
        dirs: tuple[Path, ...] = (*((self.state_dir,) if self.state_dir else ()), *self.fenced)
        own = (self.workspace, *self.own)
        for named in dirs:
            roots = {Path(os.path.normpath(named)), _realpath(named)}
            for form in {Path(os.path.normpath(path)), _realpath(path)}:
                if any(form.is_relative_to(root) for root in roots) and not any(
                    form.is_relative_to(mine) for mine in own
                ):
                    return named
        return None

    def display(self, path: Path) -> str:
        """``path`` relative to the workspace when inside it, so the model can pass it back."""
        try:
            relative = path.relative_to(self.workspace)
        except ValueError:
            return str(path)
        return str(relative) if relative.parts else "."


class Tool(Protocol):
    """A tool the agent loop can offer a model (OpenAI function-calling shape) and run."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> dict[str, Any]: ...

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult: ...


class BaseTool(abc.ABC):
    """Turns the expected failures of a tool into error results so ``run`` never raises them.

    ``ToolError`` carries its own one-line text; an ``OSError`` (permission denied, disk full,
    a path component that is a file) becomes ``<tool>: <path>: <reason>``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        try:
            return await self.execute(ctx, args)
        except ToolError as error:
            return ToolResult(text=str(error), is_error=True)
        except OSError as error:
            where = f"{error.filename}: " if error.filename is not None else ""
            reason = error.strerror or str(error)
            return ToolResult(text=f"{self.name}: {where}{reason}", is_error=True)

    @abc.abstractmethod
    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        """Do the work; raise ``ToolError`` for anything the model should correct."""


def clip_head(text: str, *, hint: str = "") -> str:
    """Keep the start of ``text`` within the output caps, ending with a truncation note."""
    lines = text.splitlines(keepends=True)
    kept, whole = _fit(lines[:MAX_OUTPUT_LINES])
    if whole == len(lines):
        return text
    note = f"[truncated: {len(lines) - whole} more lines not shown{'; ' + hint if hint else ''}]"
    return "".join(kept).rstrip("\n") + "\n" + note


def clip_tail(text: str, *, omitted_bytes: int = 0) -> str:
    """Keep the end of ``text`` within the output caps (where errors usually are)."""
    lines = text.splitlines(keepends=True)
    kept, whole = _fit(lines[::-1][:MAX_OUTPUT_LINES], from_end=True)
    if whole == len(lines) and not omitted_bytes:
        return text
    extra = f" and {omitted_bytes} earlier bytes" if omitted_bytes else ""
    note = f"[truncated: first {len(lines) - whole} lines{extra} not shown]\n"
    return note + "".join(reversed(kept))


def _fit(lines: list[str], *, from_end: bool = False) -> tuple[list[str], int]:
    """The lines that fit ``MAX_OUTPUT_BYTES`` and how many of them are whole.

    When a line would overflow the budget a cut piece of it is kept too: one huge line
    (minified JavaScript, a progress bar) must not turn into an empty result.
    """
    kept: list[str] = []
    budget = MAX_OUTPUT_BYTES
    for line in lines:
        encoded = line.encode()
        if len(encoded) > budget:
            if budget == 0:
                return kept, len(kept)
            # errors="ignore" drops the multi-byte character the cut went through.
            if from_end:
                kept.append("[line truncated] … " + encoded[-budget:].decode(errors="ignore"))
            else:
                kept.append(encoded[:budget].decode(errors="ignore") + " … [line truncated]\n")
            return kept, len(kept) - 1
        kept.append(line)
        budget -= len(encoded)
    return kept, len(kept)


def clip_line(line: str, limit: int) -> str:
    """One line cut to ``limit`` characters with a visible marker."""
    return line if len(line) <= limit else line[:limit] + " … [line truncated]"


def is_binary(head: bytes) -> bool:
    return b"\0" in head[:BINARY_SNIFF_BYTES]


def require_str(args: Mapping[str, Any], key: str, *, tool: str, empty_ok: bool = False) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise ToolError(f"{tool}: argument '{key}' must be a string (got {type(value).__name__})")
    if not value and not empty_ok:
        raise ToolError(f"{tool}: argument '{key}' is empty; pass a value")
    return value


def optional_str(args: Mapping[str, Any], key: str, *, tool: str) -> str | None:
    return None if args.get(key) is None else require_str(args, key, tool=tool)


def optional_int(args: Mapping[str, Any], key: str, *, tool: str, minimum: int) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    # bool is an int subclass; a model sending ``true`` for a line number is a mistake.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ToolError(f"{tool}: argument '{key}' must be an integer >= {minimum} (got {value!r})")
    return value
