"""The lines ``fleet mcp`` reads from its parent, guarded before the MCP SDK parses them.

The SDK's JSON parser gives up on a message nested ~200 deep and drops it without an answer,
so a parent whose tool call carries such arguments would wait for ever. :func:`guard` finds
those lines first (a line with fewer brackets than :data:`MAX_WIRE_DEPTH` cannot be that deep,
so most lines cost one ``str.count``) and turns a deep ``tools/call`` into the same call with
its arguments replaced by :data:`TOO_DEEP`, which the server answers with a one-line usage
error for the caller's request id.
"""

import json
import os
from collections.abc import AsyncIterator
from typing import Any, Final

import anyio

__all__ = ["MAX_WIRE_DEPTH", "TOO_DEEP", "GuardedStdin", "guard"]

MAX_WIRE_DEPTH: Final = 96
#: The one argument a too-deep call arrives with (its value: how deep the message was).
TOO_DEEP: Final = "\x00fleet: nested too deeply"
_KEEP: Final = 2  # depth of the message that is kept: id, method, params.name


def _shallow(line: str) -> tuple[str, int]:
    """*line* with everything nested deeper than :data:`_KEEP` replaced by ``0``, and the
    deepest nesting seen."""
    out: list[str] = []
    depth = deepest = 0
    in_string = escaped = False
    for ch in line:
        if in_string:
            if depth <= _KEEP:
                out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch in "{[":
            depth += 1
            deepest = max(deepest, depth)
            if depth == _KEEP + 1:
                out.append("0")
            elif depth <= _KEEP:
                out.append(ch)
            continue
        if ch in "}]":
            if depth <= _KEEP:
                out.append(ch)
            depth -= 1
            continue
        if ch == '"':
            in_string = True
        if depth <= _KEEP:
            out.append(ch)
    return "".join(out), deepest


def guard(line: str) -> str:
    """*line*, or for a ``tools/call`` nested deeper than :data:`MAX_WIRE_DEPTH` the same call
    with :data:`TOO_DEEP` as its arguments (anything else that deep goes on as it is)."""
    if line.count("{") + line.count("[") <= MAX_WIRE_DEPTH:
        return line
    shallow, deepest = _shallow(line)
    if deepest <= MAX_WIRE_DEPTH:
        return line
    try:
        message: Any = json.loads(shallow)
    except ValueError:
        return line
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return line
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    call = {
        "jsonrpc": "2.0",
        "id": message.get("id"),
        "method": "tools/call",
        "params": {"name": name if isinstance(name, str) else "", "arguments": {TOO_DEEP: deepest}},
    }
    return json.dumps(call) + "\n"


class GuardedStdin:
    """Our stdin as the SDK's stdio transport reads it (lines), each one :func:`guard`-ed.

    Like the SDK's own claim, fd 0 is pointed at the null device while we serve, so nothing we
    start reads the parent's messages."""

    def __init__(self) -> None:
        self._fd = os.dup(0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        self._file = anyio.wrap_file(os.fdopen(self._fd, encoding="utf-8", errors="replace"))

    async def __aiter__(self) -> AsyncIterator[str]:
        async for line in self._file:
            yield guard(line)
