"""The tools ``fleet mcp`` offers: one control request each, named and shaped like the CLI.

Each :class:`Tool` has a JSON-schema input, a description that teaches the delegation
discipline in a few lines, and the control op its arguments become. The results are the
``--json`` shapes of ``docs/cli.md``.
"""

from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from orchestrator._errors import UsageError
from orchestrator.control._client import WAIT_SLICE

WAIT_DEFAULT: Final = 50.0  # below the 60 s a parent (Codex) gives one tool call by default

_STR: Final = {"type": "string"}
_STRS: Final = {"type": "array", "items": {"type": "string"}}
_AGENT: Final = {"type": "string", "description": "a child's key (a1) or unique name"}
_TEXT: Final = {"type": "string", "minLength": 1}
_TARGETS: Final = {**_STRS, "description": "agents or paths (default: everything)"}

_TASK_PROPS: Final = {
    "task": {"type": "string", "minLength": 1, "description": "the whole task, self-contained"},
    "agent": {"type": "string", "description": "agent definition (default scout; see agents)"},
    "mode": {"type": "string", "enum": ["scout", "fork", "worktree"]},
    "name": _STR,
    "backend": {"type": "string", "description": "builtin, claude, codex, pi, command, ..."},
    "model": {"type": "string", "description": "scripted:FILE, openai:MODEL, ... or a CLI's model"},
    "role": {"type": "string", "description": "a model role of roles.yaml (instead of model)"},
    "budget": {
        "type": "object",
        "description": "lower the child's usage budget (never above the configured one)",
        "properties": {
            key: {"type": "number", "minimum": 0}
            for key in ("soft_tokens", "hard_tokens", "soft_usd", "hard_usd")
        },
        "additionalProperties": False,
    },
    "schema": {
        "type": "object",
        "description": "a JSON Schema the child's final fenced json block must satisfy; "
        "wait returns the parsed object as result",
    },
}


def _obj(props: Mapping[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": dict(props)}
    if required:
        schema["required"] = list(required)
    schema["additionalProperties"] = False
    return schema


def _out(*keys: str) -> dict[str, Any]:
    return {"type": "object", "properties": {k: {} for k in keys}, "required": list(keys)}


def _pick(*keys: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    def build(args: Mapping[str, Any]) -> dict[str, Any]:
        return {k: args[k] for k in keys if k in args}

    return build


def _spawn(args: Mapping[str, Any]) -> dict[str, Any]:
    if ("task" in args) == ("tasks" in args):
        raise UsageError("spawn: give either task (one child) or tasks (a batch)")
    if "tasks" in args:
        tasks = args["tasks"]
        if not isinstance(tasks, list) or not tasks:
            raise UsageError("spawn: tasks must be a non-empty list of task objects")
        return {"requests": tasks}
    request = {k: args[k] for k in _TASK_PROPS if k in args}
    request.setdefault("agent", "scout")
    return {"requests": [request]}


def _wait(args: Mapping[str, Any]) -> dict[str, Any]:
    timeout = args.get("timeout", WAIT_DEFAULT)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0:
        raise UsageError("wait: timeout must be a number of seconds >= 0")
    return {
        "agents": list(args.get("agents", [])),
        "all": bool(args.get("all", False)),
        "timeout": min(float(timeout), WAIT_SLICE),
    }


def _stop(args: Mapping[str, Any]) -> dict[str, Any]:
    agents = list(args.get("agents", []))
    every = bool(args.get("all", False))
    if not agents and not every:
        raise UsageError("stop: name at least one agent, or pass all")
    return {"agents": agents, "all": every}


def _targets(args: Mapping[str, Any]) -> dict[str, Any]:
    payload: dict[str, Any] = {"targets": list(args.get("targets", []))}
    if "context" in args:
        payload["context"] = args["context"]
    return payload


@attrs.frozen
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    build: Callable[[Mapping[str, Any]], dict[str, Any]]
    op: str = ""

    @property
    def control_op(self) -> str:
        return self.op or self.name


TOOLS: Final[tuple[Tool, ...]] = (
    Tool(
        "spawn",
        "Start child agents on tasks and return at once with their keys. Decompose first: one "
        "child per independent piece, each task self-contained (the child sees only it). Never "
        "do a child's task yourself meanwhile, and never spawn two children on the same piece. "
        "Give task for one child or tasks (a list of task objects) for a batch; then call wait.",
        _obj(
            {
                **_TASK_PROPS,
                "tasks": {"type": "array", "items": _obj(_TASK_PROPS, ("task",)), "minItems": 1},
            }
        ),
        _out("agents"),
        _spawn,
    ),
    Tool(
        "peek",
        "The fleet from memory, instantly: every child's state, progress, activity and open "
        "questions. Cheap; peek before you steer, pause or stop a child.",
        _obj({"agents": {**_STRS, "description": "children to show (default: all)"}}),
        _out("agents"),
        _pick("agents"),
    ),
    Tool(
        "usage",
        "Tokens and cost so far per child, per agent definition and for the session, with "
        "each budget and the levels reached.",
        _obj({"agents": {**_STRS, "description": "children to show (default: all)"}}),
        _out("session", "agents", "definitions"),
        _pick("agents"),
    ),
    Tool(
        "wait",
        "Block until a child settles (all=true: every named one) and return the coalesced "
        "settled notes with each child's final report. Bounded by timeout seconds (default 50, "
        "at most 100); a timeout is an error of kind 'timeout': call wait again or peek.",
        _obj(
            {
                "agents": _STRS,
                "all": {"type": "boolean"},
                "timeout": {"type": "number", "minimum": 0, "maximum": WAIT_SLICE},
            }
        ),
        _out("settled"),
        _wait,
    ),
    Tool(
        "steer",
        "Redirect a working child mid-turn with a short correction. Peek first: steer only a "
        "child that is really off course.",
        _obj({"agent": _AGENT, "text": _TEXT}, ("agent", "text")),
        _out("key", "state"),
        _pick("agent", "text"),
    ),
    Tool(
        "pause",
        "Clear a child's queue and abort its current turn; it keeps its context for resume.",
        _obj({"agent": _AGENT}, ("agent",)),
        _out("key", "state", "settled"),
        _pick("agent"),
    ),
    Tool(
        "resume",
        "Give an idle or paused child its next prompt (a follow-up on its own task).",
        _obj({"agent": _AGENT, "text": _TEXT}, ("agent", "text")),
        _out("key", "state"),
        _pick("agent", "text"),
    ),
    Tool(
        "ask",
        "Ask a child a side question and get its answer; its work is not redirected.",
        _obj({"agent": _AGENT, "text": _TEXT}, ("agent", "text")),
        _out("key", "answer"),
        _pick("agent", "text"),
    ),
    Tool(
        "answer",
        "Answer a question a child asked you (q<N>, or an agent with one open question). A "
        "waiting child is blocked until you answer.",
        _obj({"question": _STR, "text": _TEXT}, ("question", "text")),
        _out("question", "key"),
        _pick("question", "text"),
    ),
    Tool(
        "stop",
        "Stop children for good and return their handoffs (last report, changed files). Stop "
        "each child as soon as its work is done or no longer needed.",
        _obj({"agents": _STRS, "all": {"type": "boolean"}}),
        _out("handoffs"),
        _stop,
    ),
    Tool(
        "discard",
        "Forget a stopped child and its unresolved state (its copied-back changes stay).",
        _obj({"agent": _AGENT}, ("agent",)),
        _out("key", "discarded"),
        _pick("agent"),
    ),
    Tool(
        "diff",
        "Review the changes children copied back into your tree before you accept them.",
        _obj({"targets": _TARGETS, "context": {"type": "integer", "minimum": 0}}),
        _out("files"),
        _targets,
    ),
    Tool(
        "accept",
        "Keep copied-back changes (after diff) and forget their pre-images.",
        _obj({"targets": _TARGETS}),
        _out("files"),
        _targets,
    ),
    Tool(
        "revert",
        "Restore the pre-images of copied-back changes: rewrites files, so diff first.",
        _obj({"targets": _TARGETS}),
        _out("files"),
        _targets,
    ),
    Tool(
        "discuss",
        "The shared discussion paper: post a terse question (action ask, optionally to one "
        "agent), answer one (action answer, question dN), or read new entries (action list).",
        _obj(
            {
                "action": {"type": "string", "enum": ["ask", "answer", "list"]},
                "text": _STR,
                "to": _STR,
                "question": _STR,
                "since": _STR,
            },
            ("action",),
        ),
        _out("text"),
        _pick("action", "text", "to", "question", "since"),
    ),
    Tool(
        "vote",
        "A democracy round for a persistent, hard decision only: action start (request as in "
        "docs/coordination.md), then action wait with the round id, or abort.",
        _obj(
            {
                "action": {"type": "string", "enum": ["start", "wait", "abort"]},
                "request": {"type": "object"},
                "round": _STR,
                "agents": _STRS,
                "voters": {"type": "integer", "minimum": 1},
                "deadline": {"type": "number", "minimum": 0},
                "model": _STR,
                "timeout": {"type": "number", "minimum": 0, "maximum": WAIT_SLICE},
            },
            ("action",),
        ),
        _out("status"),
        _pick("action", "request", "round", "agents", "voters", "deadline", "model", "timeout"),
    ),
    Tool(
        "brief",
        "The moderator brief: what the fleet is doing and what needs you, in one short text.",
        _obj({}),
        _out("text"),
        _pick(),
    ),
    Tool(
        "agents",
        "The agent definitions you can spawn, with their modes and tools.",
        _obj({"scope": {"type": "string", "enum": ["default", "project", "both"]}}),
        _out("agents"),
        _pick("scope"),
    ),
    Tool(
        "mode",
        "Show the workflow mode, or set it with name.",
        _obj({"name": _STR}),
        _out("mode"),
        _pick("name"),
    ),
)

BY_NAME: Final = {tool.name: tool for tool in TOOLS}
