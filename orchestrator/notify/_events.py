"""One event for people, built from a settle note: the child, its state and one clipped line."""

import time
from collections.abc import Callable
from typing import Any, Final

from orchestrator._records import ChildRecord, clip

#: The context line's length: enough to recognise the child's last words, never a report.
CONTEXT_CLIP: Final = 200

Event = dict[str, Any]
Scrub = Callable[[str], str]


def _line(text: str, scrub: Scrub) -> str:
    # Scrub first (a token cut by the clip would escape the redactor), then one line, then clip.
    words = " ".join(scrub(text).split())
    return clip(words, CONTEXT_CLIP)


def _base(kind: str, record: ChildRecord, session: str, context: str, scrub: Scrub) -> Event:
    return {
        "kind": kind,
        "session": session,
        "key": record.key,
        "name": scrub(record.name),
        "state": str(record.state),
        "context": _line(context, scrub),
        "at": round(time.time(), 3),
    }


def event_for(
    record: ChildRecord,
    *,
    session: str,
    report: str,
    error: str,
    failure: bool,
    scrub: Scrub,
) -> Event:
    """The ``settled`` or ``failed`` event for a settle note."""
    failed = failure or bool(error) or str(record.state) == "failed"
    kind = "failed" if failed else "settled"
    context = (error or report) if failed else report
    return _base(kind, record, session, context, scrub)


def budget_event(record: ChildRecord, *, session: str, line: str, scrub: Scrub) -> Event:
    """The ``budget`` event: a soft limit (the child's or the session's) was reached."""
    return _base("budget", record, session, line, scrub)


def needs_input(
    record: ChildRecord, *, session: str, question: tuple[str, str], after_s: float, scrub: Scrub
) -> Event:
    """The ``needs-input`` event: *question* (id, text) stayed unanswered for *after_s*."""
    event = _base("needs-input", record, session, question[1], scrub)
    event["question"] = question[0]
    event["waited_s"] = after_s
    return event
