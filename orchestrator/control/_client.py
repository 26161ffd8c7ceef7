"""The control client: one request to the session's supervisor over its control socket.

Every CLI verb is such a request. This module (with :mod:`._daemon_client`) is all
a verb needs, so a ``fleet`` command imports neither the supervisor nor its launchers:
:mod:`orchestrator.control._server` is the server side.
"""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import trio

import ipc
from orchestrator._errors import ERROR_KINDS, FleetError, Unreachable

CONTROL_OWNER: Final = "control"
WAIT_SLICE: Final = 100.0  # a control request may not wait longer than the 120 s IPC cap


class NotConnected(Unreachable):
    """No connection to the supervisor: the request never reached it (safe to send again)."""


async def ignore_event(envelope: ipc.Envelope) -> None:
    """Neither end of a control connection sends events."""
    return


def read_token(path: Path) -> str:
    """The control token (a 0600 file we own)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise Unreachable(
            f"control token {path}: {exc.strerror} (is the supervisor running?)"
        ) from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise Unreachable(f"control token {path}: not a private file of ours (remove it)")
        return os.read(fd, 256).decode().strip()
    finally:
        os.close(fd)


async def call_async(
    socket: Path,
    token: str,
    op: str,
    args: Mapping[str, Any],
    *,
    timeout: float,  # noqa: ASYNC109 - the request deadline sent over the wire
) -> dict[str, Any]:
    """One control request; raises the :class:`FleetError` the supervisor reported."""
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
    }.get(op, 30.0)
