"""Model scripts: what the scripted model answers, one turn per request.

A script is a list of turns written as JSON-like dicts (or `Turn` objects). A turn is an answer
(``text`` and/or ``tool_calls``) or a fault (``status``, ``stall``), optionally delayed::

    {"text": "done"}
    {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]}
    {"status": 500, "body": "overloaded"}      # HTTP error, body sent verbatim
    {"stall": True, "text": "partial"}         # headers + first chunk, then nothing until close
    {"delay": 0.5, "text": "late"}             # wait, then answer
    {"hold": True, "text": "when let go"}      # wait until the test calls ModelServer.release()
    {"text": "hi", "usage": {"input_tokens": 7, "output_tokens": 3}}

A held turn is how a test acts while a client waits on its model call (steers it, looks at its
processes) without a race against a fixed delay that a loaded machine can lose.

Tool names are whatever the client under test calls its tools (Pi: ``read``; Claude Code:
``Read``; Codex: ``exec_command``): the server does not interpret them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs

_TURN_KEYS = ("text", "tool_calls", "status", "body", "stall", "delay", "hold", "usage")
_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_tokens", "cost")

T = TypeVar("T")


class ScriptError(ValueError):
    """A script turn is malformed; `where` names it (``turn 2``) and the message says why."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"model script {where}: {problem}")
        self.where = where
        self.problem = problem


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts reported with a turn, so clients' usage and cost mapping can be tested."""

    input_tokens: int = 100
    output_tokens: int = 20
    cache_read_tokens: int = 0
    #: A cost the server reports with the usage (OpenAI chat ``usage.cost``, as gateways do).
    cost: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@attrs.frozen(kw_only=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class Turn:
    """One scripted model reply. ``status`` set means an HTTP error instead of an answer."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    status: int | None = None
    body: str = ""
    stall: bool = False
    delay: float = 0.0
    #: Answer only once the test has called :meth:`ModelServer.release` (after any delay).
    hold: bool = False
    usage: Usage = Usage()

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], *, where: str) -> Turn:
        """Validate one JSON-like turn; raise `ScriptError` naming `where` on any mistake."""
        unknown = sorted(set(raw) - set(_TURN_KEYS))
        if unknown:
            raise ScriptError(where, f"unknown key {unknown[0]!r}; use one of {_TURN_KEYS}")
        text = _typed(raw, "text", str, default="", where=where)
        status = raw.get("status")
        if status is not None and (
            not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599
        ):
            raise ScriptError(where, f"status must be an HTTP error code 400-599, got {status!r}")
        body = _typed(raw, "body", str, default="", where=where)
        if body and status is None:
            raise ScriptError(where, "body is only sent with a status; add one or drop body")
        stall = _typed(raw, "stall", bool, default=False, where=where)
        hold = _typed(raw, "hold", bool, default=False, where=where)
        delay = raw.get("delay", 0.0)
        if (
            not isinstance(delay, int | float)
            or isinstance(delay, bool)
            or not math.isfinite(delay)
            or delay < 0
        ):
            raise ScriptError(
                where, f"delay must be a finite number of seconds >= 0, got {delay!r}"
            )
        calls = tuple(
            _tool_call(item, where=f"{where} tool_calls[{index}]")
            for index, item in enumerate(_typed(raw, "tool_calls", list, default=[], where=where))
        )
        if status is not None and (text or calls or stall):
            raise ScriptError(where, "a status fault cannot also carry text, tool_calls or stall")
        return cls(
            text=text,
            tool_calls=calls,
            status=status,
            body=body,
            stall=stall,
            delay=float(delay),
            hold=hold,
            usage=_usage(raw.get("usage", {}), where=f"{where} usage"),
        )


def parse_script(turns: Sequence[Mapping[str, Any] | Turn]) -> tuple[Turn, ...]:
    """Turn a list of dicts (or `Turn`s) into validated turns."""
    parsed: list[Turn] = []
    for index, raw in enumerate(turns):
        if isinstance(raw, Turn):
            parsed.append(raw)
        elif isinstance(raw, Mapping):
            parsed.append(Turn.from_mapping(raw, where=f"turn {index}"))
        else:
            raise ScriptError(f"turn {index}", f"expected a dict, got {type(raw).__name__}")
    return tuple(parsed)


def _tool_call(raw: object, *, where: str) -> ToolCall:
    if not isinstance(raw, Mapping):
        raise ScriptError(where, f"expected a dict with name and arguments, got {raw!r}")
    unknown = sorted(set(raw) - {"name", "arguments"})
    if unknown:
        raise ScriptError(where, f"unknown key {unknown[0]!r}; use name and arguments")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ScriptError(where, f"name must be a non-empty string, got {name!r}")
    arguments = raw.get("arguments", {})
    if not isinstance(arguments, Mapping):
        raise ScriptError(where, f"arguments must be a dict, got {arguments!r}")
    return ToolCall(name=name, arguments=dict(arguments))


def _usage(raw: object, *, where: str) -> Usage:
    if not isinstance(raw, Mapping):
        raise ScriptError(where, f"expected a dict of token counts, got {raw!r}")
    unknown = sorted(set(raw) - set(_USAGE_KEYS))
    if unknown:
        raise ScriptError(where, f"unknown key {unknown[0]!r}; use one of {_USAGE_KEYS}")
    for key, value in raw.items():
        if key == "cost":  # any number: a hostile model may report a negative cost
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ScriptError(where, f"cost must be a number, got {value!r}")
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ScriptError(where, f"{key} must be an int >= 0, got {value!r}")
    return Usage(**raw)


def _typed(raw: Mapping[str, Any], key: str, kind: type[T], *, default: T, where: str) -> T:
    value = raw.get(key, default)
    if not isinstance(value, kind):
        raise ScriptError(where, f"{key} must be {kind.__name__}, got {value!r}")
    return value
