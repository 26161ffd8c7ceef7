"""The fleet's value types, shared by every room: a child's record and state, a spawn request.

A :class:`ChildRecord` is what ``peek`` shows and a handoff returns; the registry that holds the
records lives in :mod:`orchestrator.core._registry`.
"""

import collections
import enum
import time
from collections.abc import Mapping
from typing import Any, Final

import attrs

from orchestrator._errors import UsageError

RETAINED_REPORTS: Final = 8
REPORT_CLIP: Final = 1200
#: The most recent activities (tool calls, messages) a child's record keeps, with their times.
RECENT_ACTIVITIES: Final = 200


class State(enum.StrEnum):
    STARTING = "starting"
    WORKING = "working"
    IDLE = "idle"
    PAUSED = "paused"
    WAITING = "waiting"
    #: Stopped without finalizing: no process, its worktree, locks and context kept.
    HIBERNATED = "hibernated"
    STOPPED = "stopped"
    FAILED = "failed"


TERMINAL: Final = frozenset({State.STOPPED, State.FAILED})
ACTIVE: Final = frozenset({State.STARTING, State.WORKING, State.WAITING})


def clip(text: str, limit: int = REPORT_CLIP) -> str:
    """*text* cut to *limit* characters with a visible marker."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown_state(state: str, activity: str) -> tuple[str, str]:
    """The state and activity a person reads: ``idle`` after a good turn (activity ``idle``)
    is ``done``, and an activity that only repeats the state is left out."""
    if state == "idle" and activity == "idle":
        return "done", ""
    return state, "" if activity == state else activity


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
    #: Each change of :attr:`activity` that says more than the state: (wall time, activity).
    recent: collections.deque[tuple[float, str]] = attrs.Factory(
        lambda: collections.deque(maxlen=RECENT_ACTIVITIES)
    )
    last_event_at: float = attrs.Factory(time.monotonic)
    started_at: float = attrs.Factory(time.monotonic)
    tokens: int = 0
    cost_usd: float | None = None
    #: The ledger's entry (input/output/cache tokens, model, budget, levels reached).
    usage: dict[str, Any] = attrs.Factory(dict)
    report: str = ""
    error: str = ""
    failure: dict[str, Any] | None = None
    sandboxed: bool | None = None
    #: Why the child runs unsandboxed (``--allow-unsandboxed`` and the cause); "" when it is not.
    unsandboxed_reason: str = ""
    pid: int | None = None
    question: str | None = None
    changed: list[str] = attrs.Factory(list)
    applied: list[str] = attrs.Factory(list)
    conflicts: list[dict[str, str]] = attrs.Factory(list)
    remaining: list[str] = attrs.Factory(list)
    #: Changed paths kept in its worktree because they run later or instruct an agent
    #: (``{path, why}``), and ordinary ones not landed yet (``stop --hold``).
    held: list[dict[str, str]] = attrs.Factory(list)
    pending: list[str] = attrs.Factory(list)
    #: The model role it runs on ("" for none) and every model it ran on, in order (a quota
    #: error moves it to the role's next candidate).
    role: str = ""
    models: list[str] = attrs.Factory(list)
    #: Why the supervisor stopped the child before it finished (a spent budget, a loop the gate
    #: could not break); "" while it runs or when it stopped as asked.
    incomplete: str = ""
    #: The JSON Schema its result must satisfy (docs/governance.md "Checked results"), and the
    #: last valid result parsed from its report; ``None`` without a schema.
    schema: dict[str, Any] | None = None
    result: Any = None
    #: What the supervisor saw of its last settled turn (``core._evidence``): duration, usage,
    #: commands, changed files with line counts, whether the report was clipped.
    observed: dict[str, Any] = attrs.Factory(dict)

    def touch(self, activity: str | None = None) -> None:
        self.last_event_at = time.monotonic()
        if activity is not None:
            if activity and activity != self.activity and activity != str(self.state):
                self.recent.append((round(time.time(), 3), activity))
            self.activity = activity

    def recent_activities(self) -> list[dict[str, Any]]:
        """Its recent activities, oldest first (a page's timeline between journal records)."""
        return [{"at": at, "activity": activity} for at, activity in self.recent]

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
            "unsandboxed_reason": self.unsandboxed_reason,
            "usage": self.usage | {"tokens": self.tokens, "cost_usd": self.cost_usd},
            "question": self.question,
            "role": self.role,
            "models": list(self.models),
            "held": len(self.held),
        }

    def progress_row(self) -> dict[str, Any]:
        """A working child in one row (``wait``'s ``working``): its activity, checklist and age."""
        progress = self.progress
        now = time.monotonic()
        return {
            "key": self.key,
            "name": self.name,
            "state": str(self.state),
            "activity": clip(self.activity, 120),
            "checklist": f"{progress['done']}/{progress['total']}" if progress["total"] else "",
            "current": progress.get("current"),
            "age_s": round(now - self.started_at, 1),
            "last_event_age_s": round(now - self.last_event_at, 1),
        }

    def peek_line(self) -> str:
        """One human line: ``a1 scout-1 working 2/5 — reading README.md``; a child whose last
        turn ended well and that waits for more is ``done``, and no word is said twice."""
        progress = self.progress
        done_total = f" {progress['done']}/{progress['total']}" if progress["total"] else ""
        state, activity = shown_state(str(self.state), self.activity)
        return f"{self.key} {self.name} {state}{done_total}" + (
            f" — {activity}" if activity else ""
        )

    def handoff(self) -> dict[str, Any]:
        """What ``stop`` returns (CLI.md's shape); ``last`` clipped as a settle note's report,
        ``result`` beside it for a checked child."""
        shape = {
            "key": self.key,
            "name": self.name,
            "state": str(self.state),
            "task": self.task,
            "workspace": self.workspace,
            "changed": list(self.changed),
            "applied": list(self.applied),
            "remaining": list(self.remaining),
            "conflicts": list(self.conflicts),
            "held": list(self.held),
            "pending": list(self.pending),
            "last": clip(self.report),
            "error": self.error,
            "sandboxed": self.sandboxed,
            "unsandboxed_reason": self.unsandboxed_reason,
            "failure": self.failure,
            "role": self.role,
            "models": list(self.models),
            "incomplete": self.incomplete,
            "observed": dict(self.observed),
        }
        return self.with_result(shape)

    def with_result(self, shape: dict[str, Any]) -> dict[str, Any]:
        """*shape* (a note, a handoff) with the parsed ``result`` of a checked child."""
        if self.schema is not None:
            shape["result"] = self.result
        return shape


@attrs.frozen(kw_only=True)
class SpawnRequest:
    """One task to delegate (``fleet spawn`` / the API)."""

    task: str
    agent: str = "scout"
    mode: str | None = None
    name: str | None = None
    backend: str | None = None
    model: str | None = None
    command: tuple[str, ...] = ()
    surface: str | None = None
    #: A model role (``@role`` in ``model`` says the same); its candidates pick the model.
    role: str | None = None
    #: A usage budget (``soft_tokens``, ``hard_tokens``, ``soft_usd``, ``hard_usd``) that may
    #: only lower the configured one.
    budget: Mapping[str, Any] | None = None
    #: A JSON Schema (an object) the child's result must satisfy; checked at spawn.
    schema: dict[str, Any] | None = attrs.field(default=None, eq=False)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "SpawnRequest":
        """From a ``--batch`` JSON entry; unknown keys are an error."""
        known = {"task", "agent", "mode", "name", "backend", "model", "command", "surface"}
        known.add("role")
        known.add("budget")
        known.add("schema")
        unknown = set(data) - known
        if unknown:
            raise UsageError(f"spawn: unknown batch key {min(unknown)!r}")
        task = data.get("task")
        if not isinstance(task, str) or not task.strip():
            raise UsageError("spawn: every batch entry needs a non-empty task")
        command = data.get("command") or ()
        if not isinstance(command, (list, tuple)) or not all(isinstance(c, str) for c in command):
            raise UsageError("spawn: command must be a list of strings")
        keys = ("agent", "mode", "name", "backend", "model", "surface", "role")
        fields = {k: data.get(k) for k in keys}
        for key, value in fields.items():
            if value is not None and not isinstance(value, str):
                raise UsageError(f"spawn: {key} must be a string")
        budget = data.get("budget")
        if budget is not None and not isinstance(budget, Mapping):
            raise UsageError("spawn: budget must be a mapping (soft_tokens, hard_tokens, ...)")
        schema = data.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise UsageError("spawn: schema must be a JSON Schema object")
        return cls(
            budget=budget,
            task=task,
            agent=fields["agent"] or "scout",
            mode=fields["mode"],
            name=fields["name"],
            backend=fields["backend"],
            model=fields["model"],
            command=tuple(command),
            surface=fields["surface"],
            role=fields["role"],
            schema=schema,
        )


def budget_from_text(text: str) -> dict[str, float | int]:
    """``--budget``: a bare number of tokens (the hard limit), or ``KEY=NUMBER,...`` with the
    keys ``soft_``/``hard_`` + ``tokens``, ``usd``, ``spawns``, ``turns`` (the supervisor
    checks them)."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if len(items) == 1 and "=" not in items[0]:
        items = [f"hard_tokens={items[0]}"]
    budget: dict[str, float | int] = {}
    for item in items:
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not key or not raw:
            raise UsageError(
                f"--budget {text!r}: {item!r} must be KEY=NUMBER "
                "(soft_/hard_ tokens, usd, spawns, turns) or one number of tokens"
            )
        try:
            budget[key] = int(raw) if raw.isdigit() else float(raw)
        except ValueError:
            raise UsageError(f"--budget {text!r}: {key} {raw!r} is not a number") from None
    if not budget:
        raise UsageError("--budget: give a number of tokens or KEY=NUMBER pairs")
    return budget
