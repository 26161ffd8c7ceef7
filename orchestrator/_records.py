"""The fleet registry: one record per child, read by ``peek`` from memory only.

Keys are ``a1``, ``a2``, … in spawn order within the session. Retired records (stopped,
failed, discarded) leave the live fleet; the newest :data:`RETAINED_REPORTS` stay readable.
"""

import collections
import enum
import time
from collections.abc import Collection, Iterator
from typing import Any, Final

import attrs

from orchestrator._errors import NotFound, UsageError

RETAINED_REPORTS: Final = 8
REPORT_CLIP: Final = 1200


class State(enum.StrEnum):
    STARTING = "starting"
    WORKING = "working"
    IDLE = "idle"
    PAUSED = "paused"
    WAITING = "waiting"
    STOPPED = "stopped"
    FAILED = "failed"


TERMINAL: Final = frozenset({State.STOPPED, State.FAILED})
ACTIVE: Final = frozenset({State.STARTING, State.WORKING, State.WAITING})


def clip(text: str, limit: int = REPORT_CLIP) -> str:
    """*text* cut to *limit* characters with a visible marker."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@attrs.define(eq=False)
class ChildRecord:
    """What the supervisor knows about one child. Mutated only by its run."""

    key: str
    name: str
    agent: str
    mode: str
    task: str
    workspace: str
    backend: str
    surface: str = "process"
    workflow_mode: str = "build"
    depth: int = 1
    parent: str | None = None
    state: State = State.STARTING
    queued: bool = False
    turn: int = 0
    progress: dict[str, Any] = attrs.Factory(
        lambda: {"done": 0, "total": 0, "current": None, "next": []}
    )
    activity: str = "starting"
    last_event_at: float = attrs.Factory(time.monotonic)
    tokens: int = 0
    cost_usd: float | None = None
    report: str = ""
    error: str = ""
    failure: dict[str, Any] | None = None
    sandboxed: bool | None = None
    pid: int | None = None
    question: str | None = None
    changed: list[str] = attrs.Factory(list)
    applied: list[str] = attrs.Factory(list)
    conflicts: list[dict[str, str]] = attrs.Factory(list)
    remaining: list[str] = attrs.Factory(list)

    def touch(self, activity: str | None = None) -> None:
        self.last_event_at = time.monotonic()
        if activity is not None:
            self.activity = activity

    def peek(self) -> dict[str, Any]:
        """The ``peek`` entry (CLI.md's shape)."""
        return {
            "key": self.key,
            "name": self.name,
            "agent": self.agent,
            "mode": self.mode,
            "workflow_mode": self.workflow_mode,
            "state": str(self.state),
            "queued": self.queued,
            "progress": dict(self.progress),
            "activity": self.activity,
            "last_event_age_s": round(time.monotonic() - self.last_event_at, 3),
            "surface": self.surface,
            "sandboxed": self.sandboxed,
            "usage": {"tokens": self.tokens, "cost_usd": self.cost_usd},
            "question": self.question,
        }

    def peek_line(self) -> str:
        """One human line: ``a1 scout-1 idle 2/5 — reading README.md``."""
        progress = self.progress
        done_total = f" {progress['done']}/{progress['total']}" if progress["total"] else ""
        return f"{self.key} {self.name} {self.state}{done_total} — {self.activity}"

    def handoff(self) -> dict[str, Any]:
        """What ``stop`` returns (CLI.md's shape)."""
        return {
            "key": self.key,
            "name": self.name,
            "state": str(self.state),
            "task": self.task,
            "workspace": self.workspace,
            "changed": list(self.changed),
            "applied": list(self.applied),
            "remaining": list(self.remaining),
            "conflicts": list(self.conflicts),
            "last": self.report,
            "error": self.error,
            "sandboxed": self.sandboxed,
            "failure": self.failure,
        }


@attrs.define(eq=False)
class Registry:
    """Live records by key, plus the newest retired ones."""

    records: dict[str, ChildRecord] = attrs.Factory(dict)
    retired: collections.OrderedDict[str, ChildRecord] = attrs.Factory(collections.OrderedDict)
    _next: int = 1

    def new_key(self) -> str:
        key = f"a{self._next}"
        self._next += 1
        return key

    def add(self, record: ChildRecord) -> None:
        if any(r.name == record.name for r in self.records.values()):
            raise UsageError(f"spawn: a live child is already named {record.name!r} (pick another)")
        self.records[record.key] = record

    def live(self) -> Iterator[ChildRecord]:
        return iter(list(self.records.values()))

    def retire(self, key: str, *, pinned: Collection[str] = ()) -> None:
        """Move *key* to the retired reports; the oldest beyond the newest 8 are dropped,
        except *pinned* ones (an unresolved worktree stays recoverable)."""
        record = self.records.pop(key, None)
        if record is None:
            return
        self.retired[key] = record
        evictable = [k for k in self.retired if k not in pinned]
        while len(self.retired) > RETAINED_REPORTS and evictable:
            self.retired.pop(evictable.pop(0))

    def find(self, ref: str, *, include_retired: bool = True) -> ChildRecord:
        """A child by key or unique name."""
        if ref in self.records:
            return self.records[ref]
        named = [r for r in self.records.values() if r.name == ref]
        if include_retired:
            if ref in self.retired:
                return self.retired[ref]
            named += [r for r in self.retired.values() if r.name == ref]
        if len(named) == 1:
            return named[0]
        if len(named) > 1:
            raise UsageError(f"{ref!r} names {len(named)} children (use a key such as a1)")
        raise NotFound(f"no child {ref!r} in this session (see fleet peek)")
