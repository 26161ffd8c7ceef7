"""What changed in the fleet between two ``peek`` snapshots, as the events a parent hears.

``fleet mcp`` polls ``peek`` and turns each change into notifications: ``settled`` when a
child's turn ends (idle, paused, stopped), ``failed``, and ``needs-input`` when a child asks
the parent a question. Only keys, names, states and a clipped line reach the parent.
"""

from collections.abc import Mapping
from typing import Any, Final

from orchestrator.parents._framing import line as one_line

SETTLED: Final = frozenset({"idle", "paused", "stopped"})
LINE: Final = 200


def fingerprint(peek: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a change is: any child's state, activity, progress or question, or the mode."""
    agents = tuple(
        (a["key"], a["state"], a.get("activity"), str(a.get("progress")), a.get("question"))
        for a in peek.get("agents", [])
    )
    questions = tuple((q["id"], q["key"]) for q in peek.get("questions", []))
    return (peek.get("mode"), agents, questions)


def events(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``settled``/``failed``/``needs-input`` events from *before* to *after*."""
    old = {a["key"]: a for a in (before or {}).get("agents", [])}
    asked = {q["id"] for q in (before or {}).get("questions", [])}
    found: list[dict[str, Any]] = []
    for agent in after.get("agents", []):
        was = old.get(agent["key"], {}).get("state")
        state = agent["state"]
        if state == was:
            continue
        event = "failed" if state == "failed" else "settled" if state in SETTLED else None
        if event is not None:
            found.append(_event(event, agent, str(agent.get("activity") or "")))
    names = {a["key"]: a for a in after.get("agents", [])}
    for question in after.get("questions", []):
        if question["id"] in asked:
            continue
        agent = names.get(question["key"], {"key": question["key"], "name": "", "state": ""})
        asking = _event("needs-input", agent, str(question.get("text", "")))
        asking["question"] = question["id"]
        found.append(asking)
    return found


def _event(kind: str, agent: Mapping[str, Any], line: str) -> dict[str, Any]:
    return {
        "event": kind,
        "key": agent["key"],
        "name": agent.get("name", ""),
        "state": agent.get("state", ""),
        "line": one_line(line, LINE),
    }
