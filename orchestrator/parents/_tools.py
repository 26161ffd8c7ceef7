"""The tools ``fleet mcp`` offers: each a JSON-schema input that holds every rule, checked
before anything runs, and the control request its arguments become.

An LLM parent reads these schemas on every request, so the table is small (DESIGN.md §13:
≤ 1,200 tokens with the server's instructions, pinned by a test) and leaves no rule to prose:
every argument a schema lists is valid beside every other (one child is ``spawn``, never a
``task`` and ``tasks`` pair a caller must choose between), and no schema has a combinator at
its root (Claude Code drops such a tool). The verbs that act on one child share ``control``,
the review verbs ``review``, the read-only extras ``info``. Arguments are validated with
:mod:`jsonschema` against the very schema the parent was shown; an unknown argument is refused
naming it and the allowed ones. No tool declares an output schema: a result is JSON text (and
the same object as structured content), an error is text only, so every client (Gemini CLI and
opencode check structured content against a declared schema, even an error's) shows the model
the message and its kind.
"""

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import jsonschema

from orchestrator._errors import OperationFailed, UsageError
from orchestrator.control._client import WAIT_SLICE
from orchestrator.parents._framing import line
from orchestrator.parents._present import shape

#: What a parent reads once beside the tools (the MCP server's instructions; the Pi extension's
#: system prompt line).
INSTRUCTIONS: Final = (
    "fleet runs child coding agents for you. Spawn one child per independent task, do only "
    "what no child does, wait for reports, answer questions, stop each child when done. A "
    "report is the child's words: check it against what fleet observed."
)
WAIT_DEFAULT: Final = 50.0  # below the 60 s a parent (Codex) gives one tool call by default
#: An argument object deeper than this, or larger, is refused before it is looked at (a parent
#: sends flat objects; JSON nested ~128 deep stalled the SDK's parser and the encoder).
MAX_DEPTH: Final = 24
MAX_ARGUMENT_BYTES: Final = 512 * 1024


def _enum(*values: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


_STR: Final = {"type": "string"}
_STRS: Final = {"type": "array", "items": _STR}
_TEXT: Final = {"type": "string", "minLength": 1}
_KEY: Final = _TEXT  # a child's key (a1) or unique name

#: A child's budget limits: the supervisor's ``spend`` limits (``tests/orchestrator/parents``
#: checks that the two lists agree; a parent is a client and does not import ``spend``).
BUDGET_KEYS: Final = tuple(
    f"{level}_{unit}" for unit in ("tokens", "usd", "spawns", "turns") for level in ("soft", "hard")
)

_TASK: Final = {
    "task": _TEXT,
    "agent": {"type": "string", "description": "scout (default, read-only) or worker"},
    "name": _STR,
    "backend": _STR,
    "model": {"type": "string", "description": "or @role"},
    "budget": {
        "type": "object",
        "properties": {k: {"type": "number", "minimum": 0} for k in BUDGET_KEYS},
        "additionalProperties": False,
    },
    "schema": {"type": "object", "description": "JSON Schema for its result"},
}


def _obj(props: Mapping[str, Any], *required: str) -> dict[str, Any]:
    """An object schema with no combinator at its root: Claude Code drops a tool whose input
    schema has ``anyOf``/``oneOf``/``allOf`` there (the Anthropic API refuses them), so a rule
    between fields is a shape instead (one child is ``spawn``; ``stop`` takes ``"*"``)."""
    schema: dict[str, Any] = {"type": "object", "properties": dict(props)}
    if required:
        schema["required"] = list(required)
    schema["additionalProperties"] = False
    return schema


#: What one call becomes: the control op and its payload.
Request = tuple[str, dict[str, Any]]


def _request(op: str, *keys: str, **renamed: str) -> Callable[[Mapping[str, Any]], Request]:
    def build(args: Mapping[str, Any]) -> Request:
        payload = {k: args[k] for k in keys if k in args}
        payload |= {new: args[old] for new, old in renamed.items() if old in args}
        return op, payload

    return build


def _spawn(args: Mapping[str, Any]) -> Request:
    return "spawn", {"requests": [{"agent": "scout", **args}]}


def _wait(args: Mapping[str, Any]) -> Request:
    return "wait", {
        "agents": list(args.get("agents", [])),
        "all": bool(args.get("all", False)),
        "timeout": float(args.get("timeout", WAIT_DEFAULT)),
        "progress": True,
    }


def _stop(args: Mapping[str, Any]) -> Request:
    agents = list(args["agents"])
    payload = {"agents": [], "all": True} if agents == ["*"] else {"agents": agents}
    return "stop", payload | ({"hold": True} if args.get("hold") else {})


def _control(args: Mapping[str, Any]) -> Request:
    if args["action"] == "answer":  # a question q<N>, or the child that asked it
        return "answer", {"question": args["agent"], "text": args["text"]}
    return args["action"], {k: args[k] for k in ("agent", "text") if k in args}


def _review(args: Mapping[str, Any]) -> Request:
    payload: dict[str, Any] = {"targets": list(args.get("targets", []))}
    if "context" in args:
        payload["context"] = args["context"]
    return args["action"], payload


def _report(args: Mapping[str, Any]) -> Request:
    return "report", {
        "agent": args["agent"],
        "part": args.get("part", "report"),
        "offset": args.get("offset", 0),
    }


def _paper(args: Mapping[str, Any]) -> Request:
    payload = {"text": args["text"]} | ({"to": args["to"]} if "to" in args else {})
    if "reply_to" in args:
        return "discuss", {"action": "answer", "question": args["reply_to"], **payload}
    return "discuss", {"action": "ask", **payload}


def _info(args: Mapping[str, Any]) -> Request:
    topic = args["topic"]
    if topic == "paper":
        return "discuss", {"action": "list"} | ({"since": args["since"]} if "since" in args else {})
    if topic == "mode":
        return "mode", {"name": args["set"]} if "set" in args else {}
    return topic, {}


@attrs.frozen
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    build: Callable[[Mapping[str, Any]], Request]
    _validator: Any = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        jsonschema.Draft202012Validator.check_schema(self.input_schema)
        object.__setattr__(self, "_validator", jsonschema.Draft202012Validator(self.input_schema))

    def request(self, arguments: Mapping[str, Any] | None) -> Request:
        """The control request for *arguments*, or a one-line :class:`UsageError`."""
        args = dict(arguments or {})
        check_shape(self.name, args)
        allowed = list(self.input_schema["properties"])
        unknown = sorted(set(args) - set(allowed))
        if unknown:
            raise UsageError(
                f"{self.name}: unknown argument{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(unknown)} (allowed: {', '.join(allowed)})"
            )
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(args))
        if error is not None:
            raise UsageError(f"{self.name}: {_say(error)}")
        return self.build(args)

    def listing(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        }


def check_shape(tool: str, args: Any) -> None:
    """Refuse arguments nested deeper than :data:`MAX_DEPTH` or larger than
    :data:`MAX_ARGUMENT_BYTES`, in one line, before any other look at them."""
    stack = [(args, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise UsageError(f"{tool}: arguments nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    try:
        size = len(json.dumps(args, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{tool}: arguments are not plain JSON ({exc})") from None
    if size > MAX_ARGUMENT_BYTES:
        raise UsageError(
            f"{tool}: arguments of {size} bytes exceed {MAX_ARGUMENT_BYTES} "
            "(send a path or a shorter text)"
        )


def _say(error: jsonschema.ValidationError) -> str:
    """One line: where (``tasks[0].budget``) and what, the offending value clipped."""
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    what = " ".join(error.message.split())
    if len(what) > 160:
        what = what[:159] + "…"
    return f"{where.lstrip('.')}: {what}" if where else what


TOOLS: Final[tuple[Tool, ...]] = (
    Tool(
        "spawn",
        "Start a child on a self-contained task (it sees only that); returns its key. One "
        "child per independent piece; then wait.",
        _obj(_TASK, "task"),
        _spawn,
    ),
    Tool(
        "wait",
        "Block until a child settles (all: each named one) or timeout s (default 50); returns "
        "reports, open questions, progress. A timeout is normal.",
        _obj(
            {
                "agents": _STRS,
                "all": {"type": "boolean"},
                "timeout": {"type": "number", "minimum": 0, "maximum": WAIT_SLICE},
            }
        ),
        _wait,
    ),
    Tool(
        "peek",
        "Open questions, then each child's state, checklist, activity, usage. Cheap.",
        _obj({"agents": _STRS}),
        _request("peek", "agents"),
    ),
    Tool(
        "control",
        "One child: answer its question (agent: the child or q<N>), steer (redirect its "
        "turn), resume (prompt it when idle), ask (side question), pause, discard (once "
        "stopped). text: the message, or why.",
        _obj(
            {
                "action": _enum("answer", "steer", "resume", "ask", "pause", "discard"),
                "agent": _KEY,
                "text": _TEXT,
            },
            "action",
            "agent",
            "text",
        ),
        _control,
    ),
    Tool(
        "stop",
        'End children once their work is done ("*": all; hold: keep a worker\'s change for '
        "apply); returns each handoff: report, changed files.",
        _obj(
            {
                "agents": {"type": "array", "items": _TEXT, "minItems": 1},
                "hold": {"type": "boolean"},
            },
            "agents",
        ),
        _stop,
    ),
    Tool(
        "apply",
        "Land a change stop kept (hold); a held file lands only if named in paths.",
        _obj({"agent": _KEY, "paths": _STRS}, "agent"),
        _request("apply", "agent", "paths"),
    ),
    Tool(
        "report",
        "A child's full report or transcript, paged from offset (kept until discard).",
        _obj(
            {
                "agent": _KEY,
                "part": _enum("report", "transcript"),
                "offset": {"type": "integer", "minimum": 0},
            },
            "agent",
        ),
        _report,
    ),
    Tool(
        "review",
        "Changes children copied into your tree: diff them, accept (keep) or revert.",
        _obj(
            {
                "action": _enum("diff", "accept", "revert"),
                "targets": {**_STRS, "description": "children or paths"},
                "context": {"type": "integer", "minimum": 0},
            },
            "action",
        ),
        _review,
    ),
    Tool(
        "paper",
        "Post to the discussion paper children share (to: one child; reply_to: a question dN).",
        _obj({"text": _TEXT, "to": _STR, "reply_to": _STR}, "text"),
        _paper,
    ),
    Tool(
        "info",
        "brief (what needs you), agents (what you can spawn), usage (spend), paper (entries "
        "since dN), mode (set: switch it).",
        _obj(
            {
                "topic": _enum("brief", "agents", "usage", "paper", "mode"),
                "since": _STR,
                "set": _STR,
            },
            "topic",
        ),
        _info,
    ),
)

BY_NAME: Final = {tool.name: tool for tool in TOOLS}


def outcome(op: str, data: dict[str, Any]) -> dict[str, Any]:
    """What a call's control reply becomes for the parent's model (:func:`._present.shape`);
    a spawn whose child failed at launch is an :class:`OperationFailed` naming why."""
    failed = [a for a in data.get("agents", []) if op == "spawn" and a.get("state") == "failed"]
    if failed:
        raise OperationFailed(
            "spawn: "
            + "; ".join(f"{a['key']} failed at launch: {line(a.get('error', ''))}" for a in failed)
        )
    return shape(op, data)


def listing() -> dict[str, Any]:
    """The instructions and every tool as a parent is shown them (``fleet tool --list``)."""
    return {"instructions": INSTRUCTIONS, "tools": [tool.listing() for tool in TOOLS]}
