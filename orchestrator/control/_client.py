"""The control client: one request to the session's supervisor over its control socket.

Every CLI verb is such a request. This module (with :mod:`._daemon_client`) is all
a verb needs, so a ``fleet`` command imports neither the supervisor nor its launchers:
:mod:`orchestrator.control._server` is the server side.

Two clients speak the same frames. :func:`call_async` is an :mod:`ipc` channel, for a caller
already inside trio (``fleet top``). :func:`call` is what a one-shot verb uses: a blocking
socket and the stdlib JSON codec, because importing trio and the ipc codec costs several
times an interpreter's start, and an LLM parent runs verbs in a loop. It writes exactly the
frames an ipc channel writes (``tests/orchestrator/control/test_sync_client.py`` compares
them) and sends the hello and the request together: the server handles the frames that
came with the hello once it has answered it.
"""

import json
import os
import socket as _socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from orchestrator._errors import ERROR_KINDS, FleetError, Unreachable, UsageError

if TYPE_CHECKING:
    import ipc

CONTROL_OWNER: Final = "control"
WAIT_SLICE: Final = 100.0  # a control request may not wait longer than the 120 s IPC cap


class NotConnected(Unreachable):
    """No connection to the supervisor: the request never reached it (safe to send again)."""


async def ignore_event(envelope: "ipc.Envelope") -> None:
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


async def _no_requests(envelope: "ipc.Envelope") -> "ipc.Message":
    import ipc  # noqa: PLC0415

    return ipc.Reply(ok=False, error="the control client serves no requests")


# -- the blocking client -------------------------------------------------------------------

MAX_FRAME: Final = 1 << 20  # ipc.MAX_FRAME: the largest body either end accepts
PROTOCOL_VERSION: Final = 1  # ipc.PROTOCOL_VERSION
_HELLO_CORR: Final = "0"
_CALL_CORR: Final = "1"
_dumps: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate key")
    return obj


_loads: Final = json.JSONDecoder(object_pairs_hook=_unique).decode


def control_frame(token: str, corr: str, type_: str, body: dict[str, Any]) -> bytes:
    """The frame an ipc channel of owner ``control`` writes for a request *body*."""
    head = {"v": PROTOCOL_VERSION, "token": token, "owner": CONTROL_OWNER, "corr": corr}
    data = _dumps({**head, "kind": "request", "type": type_, "body": body}).encode()
    if len(data) > MAX_FRAME:
        raise UsageError(f"{type_}: {len(data)} bytes exceed the {MAX_FRAME}-byte frame limit")
    return len(data).to_bytes(4, "big") + data


def _receive(sock: _socket.socket, size: int, deadline: float, op: str, timeout: float) -> bytes:
    chunks: list[bytes] = []
    while size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Unreachable(f"supervisor did not answer {op} within {timeout:g} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(size, 65536))
        except TimeoutError:
            raise Unreachable(f"supervisor did not answer {op} within {timeout:g} s") from None
        except OSError as exc:
            raise Unreachable(f"supervisor connection broke during {op}: {exc}") from None
        if not chunk:
            raise Unreachable(f"supervisor closed the connection during {op}")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _response(
    sock: _socket.socket, corr: str, deadline: float, op: str, timeout: float
) -> dict[str, Any]:
    """The body of the ``reply`` answering *corr*; frames answering nothing are skipped."""
    while True:
        size = int.from_bytes(_receive(sock, 4, deadline, op, timeout), "big")
        if not 0 < size <= MAX_FRAME:
            raise Unreachable(f"supervisor sent a {size}-byte frame during {op}")
        try:
            frame = _loads(_receive(sock, size, deadline, op, timeout).decode())
        except ValueError as exc:  # UnicodeDecodeError too
            raise Unreachable(
                f"supervisor sent a frame that is not JSON during {op}: {exc}"
            ) from None
        if type(frame) is not dict or frame.get("kind") != "response":
            continue
        if frame.get("corr") != corr:
            continue
        body = frame.get("body")
        if (
            frame.get("type") != "reply"
            or type(body) is not dict
            or type(body.get("ok")) is not bool
            or type(body.get("data", {})) is not dict
            or type(body.get("error", "")) is not str
        ):
            raise Unreachable(f"supervisor answered {op} with a frame that is not a reply")
        return body


def call(
    socket: Path,
    token: str,
    op: str,
    args: Mapping[str, Any],
    *,
    timeout: float,
) -> dict[str, Any]:
    """:func:`call_async` without trio: one control request on a blocking socket."""
    timeout = min(max(timeout, 0.001), 120.0)
    try:
        hello = {"pid": os.getpid(), "role": "control", "backend": ""}
        data = control_frame(token, _HELLO_CORR, "hello", hello) + control_frame(
            token, _CALL_CORR, "control", {"op": op, "args": dict(args)}
        )
    except (ValueError, TypeError) as exc:  # UnicodeEncodeError: a lone surrogate
        raise UsageError(f"{op}: the request is not representable as UTF-8 JSON: {exc}") from None
    deadline = time.monotonic() + timeout
    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as sock:
        sock.settimeout(min(timeout, 5.0))
        try:
            sock.connect(os.fspath(socket))
        except OSError as exc:  # nothing was sent: the request never reached a supervisor
            raise NotConnected(f"supervisor at {socket} is unreachable: {exc}") from None
        try:
            sock.sendall(data)
        except OSError as exc:
            raise Unreachable(f"supervisor at {socket} is unreachable: {exc}") from None
        try:
            welcome = _response(sock, _HELLO_CORR, deadline, op, timeout)
        except Unreachable as exc:
            raise Unreachable(f"supervisor at {socket} is unreachable: {exc}") from None
        if not welcome["ok"]:
            raise Unreachable(f"supervisor at {socket} refused the hello: {welcome.get('error')}")
        reply = _response(sock, _CALL_CORR, deadline, op, timeout)
    if not reply["ok"]:
        data_ = reply.get("data", {})
        kind = str(data_.get("kind", "error"))
        message = reply.get("error") or f"{op} request to {CONTROL_OWNER} failed"
        raise ERROR_KINDS.get(kind, FleetError)(message)
    result: dict[str, Any] = reply.get("data", {})
    return result


def op_timeout(op: str) -> float:
    """How long the client waits for *op* (the supervisor bounds its own work)."""
    return {
        "pause": 30.0,
        "stop": 90.0,
        "ask": 120.0,
        "spawn": 60.0,
        "wait": 115.0,
        "vote": 115.0,
        "events": 45.0,
        "revive": 60.0,
    }.get(op, 30.0)
