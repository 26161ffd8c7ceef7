"""What the supervisor observed of a child's turn, set beside its report (DESIGN.md §14).

A report is the child's own words; the parent also gets what the fleet itself saw: how long
the turn took, its tokens and cost, the commands the child ran (from its ``tool_start`` /
``tool_end`` events) with whether each failed and its exit code where the event says it, the
files it changed in its worktree with line counts (read by the supervisor from the worktree,
never from the child's say), and whether the report reached the parent clipped.
"""

import difflib
import os
import time
from pathlib import Path
from typing import Any, Final

import attrs

import ipc
from orchestrator._records import REPORT_CLIP, clip

__all__ = ["TurnEvidence", "line_counts"]

MAX_COMMANDS: Final = 24
MAX_FILES: Final = 40
#: Files larger than this (either side) get no line count: counting must stay cheap.
COUNT_LIMIT: Final = 512 * 1024


@attrs.define(eq=False)
class TurnEvidence:
    """One run's current turn, as its events show it."""

    started: float = attrs.Factory(time.monotonic)
    commands: list[dict[str, Any]] = attrs.Factory(list)
    omitted: int = 0

    def new_turn(self) -> None:
        self.started = time.monotonic()
        self.commands = []
        self.omitted = 0

    def on_event(self, event: ipc.Event) -> None:
        if event.activity == "tool_start":
            if len(self.commands) >= MAX_COMMANDS:
                self.omitted += 1
                return
            self.commands.append({"tool": event.tool, "input": clip(event.text, 160), "ok": None})
        elif event.activity == "tool_end":
            for command in reversed(self.commands):
                if command["tool"] == event.tool and command["ok"] is None:
                    command["ok"] = not event.failed
                    code = _exit_code(event.text)
                    if code is not None:
                        command["exit"] = code
                    break

    def observed(
        self, *, report: str, tokens: int, cost_usd: float | None, files: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {
            "duration_s": round(time.monotonic() - self.started, 1),
            "tokens": tokens,
            "cost_usd": cost_usd,
            "commands": [dict(c) for c in self.commands],
            "commands_omitted": self.omitted,
            "files": files,
            "report_chars": len(report),
            "clipped": len(report) > REPORT_CLIP,
        }


def _exit_code(text: str) -> int | None:
    word, _, number = text.partition(" ")
    if word == "exit" and number.lstrip("-").isdigit():
        return int(number)
    return None


def line_counts(
    worktree: Path, changes: list[tuple[str, str, bytes | None]]
) -> list[dict[str, Any]]:
    """``{"path", "status", "added", "removed"}`` for each ``(path, status, old bytes)`` (``b""``
    for an added path, ``None`` when the old side is unknown); the new side is read from
    *worktree* without following a symlink. Blocking: run it in a thread."""
    rows = []
    for path, status, old in changes[:MAX_FILES]:
        new = b"" if status == "deleted" else _read(worktree / path)
        row: dict[str, Any] = {"path": path, "status": status, "added": None, "removed": None}
        if old is not None and new is not None and not (_binary(old) or _binary(new)):
            before = old.decode("utf-8", "replace").splitlines()
            after = new.decode("utf-8", "replace").splitlines()
            added = removed = 0
            for line in difflib.unified_diff(before, after, lineterm="", n=0):
                if line.startswith("+") and not line.startswith("+++"):
                    added += 1
                elif line.startswith("-") and not line.startswith("---"):
                    removed += 1
            row["added"], row["removed"] = added, removed
        rows.append(row)
    if len(changes) > MAX_FILES:
        rows.append({"path": f"… {len(changes) - MAX_FILES} more", "status": "omitted"})
    return rows


def _binary(data: bytes | None) -> bool:
    return data is not None and b"\0" in data[:8192]


def _read(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000 or st.st_size > COUNT_LIMIT:
            return None
        return os.read(fd, COUNT_LIMIT + 1)
    finally:
        os.close(fd)
