"""One parent tool call as a command: ``fleet tool NAME [ARGUMENTS]``.

A parent whose agent runs a command per tool call (the Pi extension) gets exactly what ``fleet
mcp`` gives its clients: the same tools (``fleet tool --list``), the same validation before
anything runs, the same control requests and the same framed result. The supervisor starts on
demand, as for any verb, and once more if it ended while the parent lived.
"""

import json
from typing import Any

from orchestrator._config import Config
from orchestrator._errors import FleetError, Unreachable, UsageError
from orchestrator.control._client import call, op_timeout, read_token
from orchestrator.control._daemon_client import ensure_daemon
from orchestrator.parents._tools import BY_NAME, outcome


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


def run_tool(config: Config, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The result of the tool *name* for *arguments*, or the :class:`FleetError` it met, its
    message starting with the tool's name."""
    tool = BY_NAME.get(name)
    if tool is None:
        raise UsageError(f"{name}: no such tool (tools: {', '.join(BY_NAME)})")
    try:
        op, payload = tool.request(arguments)
        return outcome(op, _call(config, op, payload))
    except FleetError as exc:
        message = str(exc)
        if not message.startswith(f"{name}: "):
            exc.args = (f"{name}: {message}", *exc.args[1:])
        raise


def _call(config: Config, op: str, payload: dict[str, Any]) -> dict[str, Any]:
    ensure_daemon(config)
    paths = config.paths
    try:
        return call(
            paths.control_socket,
            read_token(paths.control_token),
            op,
            payload,
            timeout=op_timeout(op),
        )
    except Unreachable:
        # One that still answers had its reasons (a timeout): no second try. One that ended
        # (its idle rule, a crash) never ran the request: start the next and try again.
        try:
            call(paths.control_socket, read_token(paths.control_token), "ping", {}, timeout=5.0)
        except FleetError:
            ensure_daemon(config)
            return call(
                paths.control_socket,
                read_token(paths.control_token),
                op,
                payload,
                timeout=op_timeout(op),
            )
        raise
