"""The control client: one request to the session's supervisor over its control socket.

Every CLI verb is such a request. This module (with :mod:`._daemon_client`) is all
a verb needs, so a ``fleet`` command imports neither the supervisor nor its launchers:
:mod:`orchestrator.control._server` is the server side.

Two clients speak the same frames. :func:`call_async` is an :mod:`ipc` channel, for a caller
already inside trio (``fleet top``). :func:`call` is what a one-shot verb uses: a blocking
socket and the stdlib JSON codec (:mod:`._blocking`, re-exported here), because importing
trio and the ipc codec costs several times an interpreter's start, and an LLM parent runs
verbs in a loop.
"""

from __future__ import annotations

import os

from orchestrator._errors import ERROR_KINDS, FleetError, Unreachable
from orchestrator.control._blocking import (
    CONTROL_OWNER,
    NotConnected,
    call,
    control_frame,
    read_token,
    refusal_frame,
)

# typing costs a warm verb (cli._fast) a tenth of an interpreter start: checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path
    from typing import Any, Final

    import ipc

__all__ = [
    "CONTROL_OWNER",
    "WAIT_SLICE",
    "NotConnected",
    "call",
    "call_async",
    "control_frame",
    "ignore_event",
    "op_timeout",
    "read_token",
    "refusal_frame",
]

WAIT_SLICE: Final = 100.0  # a control request may not wait longer than the 120 s IPC cap


async def ignore_event(envelope: ipc.Envelope) -> None:
    """Neither end of a control connection sends events."""
    return


async def call_async(
    socket: Path,
    token: str,
    op: str,
    args: Mapping[str, Any],
    *,
    timeout: float,  # noqa: ASYNC109 - the request deadline sent over the wire
) -> dict[str, Any]:
    """One control request; raises the :class:`FleetError` the supervisor reported."""
    import trio  # noqa: PLC0415 - only a caller inside trio pays for it

    import ipc  # noqa: PLC0415

    try:
        channel, _ = await ipc.open_client(
            socket,
            owner=CONTROL_OWNER,
            token=token,
            hello=ipc.Hello(pid=os.getpid(), role="control"),
            request_timeout=min(max(timeout, 1.0), ipc.check_timeout(120.0)),
        )
    except (OSError, ipc.HandshakeError) as exc:
        raise NotConnected(f"supervisor at {socket} is unreachable: {exc}") from None
    reply: ipc.Message | None = None
    error: FleetError | None = None
    # Errors are kept out of the nursery so the caller sees the FleetError itself, not an
    # exception group around it.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.serve, _no_requests, ignore_event)
        try:
            reply = await channel.request(
                ipc.Control(op=op, args=dict(args)), timeout=min(max(timeout, 0.001), 120.0)
            )
        except ipc.RemoteError as exc:
            kind = str(exc.data.get("kind", "error"))
            error = ERROR_KINDS.get(kind, FleetError)(str(exc))
        except ipc.RequestTimeout:
            error = Unreachable(f"supervisor did not answer {op} within {timeout:g} s")
        except ipc.ChannelClosed as exc:
            error = Unreachable(f"supervisor closed the connection during {op}: {exc}")
        finally:
            await channel.aclose()
            nursery.cancel_scope.cancel()
    if error is not None:
        raise error
    assert isinstance(reply, ipc.Reply)  # noqa: S101 - RemoteError covers error replies
    return reply.data


async def _no_requests(envelope: ipc.Envelope) -> ipc.Message:
    import ipc  # noqa: PLC0415

    return ipc.Reply(ok=False, error="the control client serves no requests")


def op_timeout(op: str) -> float:
    """How long the client waits for *op* (the supervisor bounds its own work)."""
    return {
        "pause": 30.0,
        "stop": 90.0,
        "ask": 120.0,
        "spawn": 60.0,
        "wait": 115.0,
        "vote": 115.0,
        "map": 115.0,
        "land": 118.0,
        "events": 45.0,
        "revive": 60.0,
    }.get(op, 30.0)
