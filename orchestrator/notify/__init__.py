"""Notifications for people: a child that needs input, settled or failed reaches a person.

``subagents.notify`` (:class:`orchestrator._config.NotifyConfig`) names the receivers: a command
(an argv, the event JSON on its stdin), a webhook (the event POSTed as JSON, bounded retries)
and the desktop notifier where one exists (``notify-send``; ``osascript`` on macOS). The
supervisor hands every settle note to :class:`Notifier`, which never blocks it: each receiver
has its own bounded queue, a full queue drops the event and counts it, and a slow or failing
receiver delays nobody else. An event carries the child's key, name, state and one clipped
line of context, scrubbed of every secret the supervisor holds — never a token, never a report
longer than the clip.

Import rule: the foundation (``orchestrator._config``, ``_records``, ``_errors``) and the
standard library and trio only; the supervisor passes the scrubber in.
"""

from orchestrator.notify._events import (
    CONTEXT_CLIP,
    Event,
    budget_event,
    event_for,
    needs_input,
)
from orchestrator.notify._notifier import Notifier
from orchestrator.notify._receivers import desktop_argv

__all__ = [
    "CONTEXT_CLIP",
    "Event",
    "Notifier",
    "budget_event",
    "desktop_argv",
    "event_for",
    "needs_input",
]
