"""What a control reply becomes for a parent's model: every text a child wrote framed or
neutralised (:mod:`._framing`), the moderator brief worded with the tools the parent has.

The control replies are the CLI's ``--json`` shapes; here a settled note's ``report``, a
handoff's ``last``, a side answer and a ``report`` page become framed quotes, and a child's
one-line texts (activity, peek line, question, error) lose what could read as structure.
"""

import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from orchestrator.parents._framing import frame, line

__all__ = ["WORKING", "progress_line", "shape"]

WORKING: Final = frozenset({"starting", "working", "waiting"})

#: ``fleet VERB`` in the brief, as the tool (and action) a parent calls instead.
_VERBS: Final = {
    "peek": "`peek`",
    "steer": "`control` steer",
    "answer": "`control` answer",
    "wait": "`wait`",
    "stop": "`stop`",
    "discard": "`control` discard",
    "diff": "`review` diff",
    "discuss": "`paper`",
    "vote": "a vote (`fleet vote` in a shell)",
}
_FLEET_VERB: Final = re.compile(r"\bfleet (" + "|".join(_VERBS) + r")\b")


def _lines(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    for key in keys:
        if isinstance(row.get(key), str):
            row[key] = line(row[key])
    return row


def _questions(data: dict[str, Any]) -> None:
    data["questions"] = [_lines(dict(q), "text") for q in data.get("questions", [])]


def _observed(observed: Mapping[str, Any]) -> dict[str, Any]:
    """What the supervisor observed, with the texts the child chose (a command's input, a
    file's name) neutralised: fleet measured them, the child wrote them."""
    shaped = dict(observed)
    shaped["commands"] = [_lines(dict(c), "input") for c in observed.get("commands", [])]
    shaped["files"] = [_lines(dict(f), "path") for f in observed.get("files", [])]
    return shaped


def _paths(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    for key in keys:
        if isinstance(row.get(key), list):
            row[key] = [line(p) if isinstance(p, str) else p for p in row[key]]
    return row


def _note(note: Mapping[str, Any]) -> dict[str, Any]:
    shaped = _lines(dict(note), "peek", "error")
    if isinstance(note.get("observed"), dict):
        shaped["observed"] = _observed(note["observed"])
    shaped["report"] = frame(
        str(note["key"]), str(note.get("report") or ""), clipped=bool(note.get("clipped"))
    )
    if isinstance(note.get("question"), dict):
        shaped["question"] = _lines(dict(note["question"]), "text")
    return shaped


def _wait(data: dict[str, Any]) -> dict[str, Any]:
    _questions(data)
    data["working"] = [_lines(dict(r), "activity", "current") for r in data.get("working", [])]
    data["settled"] = [_note(n) for n in data.get("settled", [])]
    return data


def _peek(data: dict[str, Any]) -> dict[str, Any]:
    _questions(data)
    data["agents"] = [_lines(dict(a), "activity") for a in data.get("agents", [])]
    return data


def _stop(data: dict[str, Any]) -> dict[str, Any]:
    handoffs = []
    for handoff in data.get("handoffs", []):
        shaped = _paths(_lines(dict(handoff), "error"), "changed", "applied", "remaining")
        shaped["last"] = frame(str(handoff["key"]), str(handoff.get("last") or ""))
        if isinstance(handoff.get("observed"), dict):
            shaped["observed"] = _observed(handoff["observed"])
        handoffs.append(shaped)
    data["handoffs"] = handoffs
    return data


def _ask(data: dict[str, Any]) -> dict[str, Any]:
    data["answer"] = frame(str(data["key"]), str(data.get("answer") or ""), "answer")
    return data


def _report(data: dict[str, Any]) -> dict[str, Any]:
    part = f"{data['part']} (characters {data['offset']}-{data['offset'] + len(data['text'])} "
    part += f"of {data['total']})"
    data["text"] = frame(str(data["key"]), str(data["text"]), part)
    return data


def _brief(data: dict[str, Any]) -> dict[str, Any]:
    data["text"] = _FLEET_VERB.sub(lambda m: _VERBS[m[1]], str(data.get("text", "")))
    return data


_SHAPES: Final[dict[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "wait": _wait,
    "peek": _peek,
    "stop": _stop,
    "ask": _ask,
    "report": _report,
    "brief": _brief,
}


def shape(op: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The reply of control *op* as the parent's model reads it."""
    reshape = _SHAPES.get(op)
    return reshape(dict(data)) if reshape is not None else dict(data)


def progress_line(working: list[Mapping[str, Any]], questions: int) -> str:
    """One line for a progress notification: who works on what, and open questions."""
    parts = []
    for agent in working[:6]:
        progress = agent.get("progress") or {}
        done = f" {progress.get('done')}/{progress.get('total')}" if progress.get("total") else ""
        parts.append(f"{agent['key']}{done} {line(str(agent.get('activity') or ''), 60)}")
    if len(working) > 6:
        parts.append(f"+{len(working) - 6} more")
    asked = f"{questions} open question(s); " if questions else ""
    return asked + ("; ".join(parts) if parts else "no child is working")
