"""One parent tool call as a command: ``fleet tool NAME [ARGUMENTS]``.

A parent whose agent runs a command per tool call (the Pi extension) gets exactly what ``fleet
mcp`` gives its clients: the same tools (``fleet tool --list``), the same validation before
anything runs, the same control requests and the same framed result. The supervisor starts on
demand, as for any verb (the CLI's own control call).
"""

import json
from collections.abc import Callable
from typing import Any

from orchestrator._errors import FleetError, UsageError
from orchestrator.parents._tools import BY_NAME, outcome

#: One control request (op, payload) to the session's supervisor: the CLI's own call, which
#: starts the supervisor on demand and retries once a request that never reached it.
Call = Callable[[str, dict[str, Any]], dict[str, Any]]


def arguments_of(text: str) -> dict[str, Any]:
    """The JSON object *text* holds (empty: no arguments), or a one-line usage error."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"tool arguments are not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError("tool arguments must be a JSON object")
    return value


def run_tool(call: Call, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The result of the tool *name* for *arguments*, or the :class:`FleetError` it met, its
    message starting with the tool's name."""
    tool = BY_NAME.get(name)
    if tool is None:
        raise UsageError(f"{name}: no such tool (tools: {', '.join(BY_NAME)})")
    try:
        op, payload = tool.request(arguments)
        return outcome(op, call(op, payload))
    except FleetError as exc:
        message = str(exc)
        if not message.startswith(f"{name}: "):
            exc.args = (f"{name}: {message}", *exc.args[1:])
        raise
