"""The blocking control client: control requests on one plain Unix socket, without trio.

What a one-shot verb uses (:func:`orchestrator.control._client.call`, and the warm verbs of
``orchestrator.cli._fast``): importing trio and the ipc codec costs several times an
interpreter's start, and an LLM parent runs verbs in a loop. It imports no more than the
stdlib's JSON codec and the ``_socket`` extension (not even :mod:`pathlib` or :mod:`socket`).

A :class:`Connection` writes exactly the frames an ipc channel of owner ``control`` writes
(``tests/orchestrator/control/test_sync_client.py`` compares them), sends the hello with its
first request (the server handles the frames that came with the hello once it has answered
it), and may carry further requests, one at a time, each with its own correlation id.
"""

from __future__ import annotations

import _socket
import json
import os
import time

from orchestrator._errors import ERROR_KINDS, FleetError, Refused, Unreachable, UsageError

# typing costs a warm verb (cli._fast) a tenth of an interpreter start: checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Final

CONTROL_OWNER: Final = "control"
MAX_FRAME: Final = 1 << 20  # ipc.MAX_FRAME: the largest body either end accepts
PROTOCOL_VERSION: Final = 1  # ipc.PROTOCOL_VERSION
HELLO_CORR: Final = "0"
_dumps: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


class NotConnected(Unreachable):
    """No connection to the supervisor: the request never reached it (safe to send again)."""


def read_token(path: str | os.PathLike[str]) -> str:
    """The control token (a 0600 file we own)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise Unreachable(
            f"control token {os.fspath(path)}: {exc.strerror} (is the supervisor running?)"
        ) from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise Unreachable(
                f"control token {os.fspath(path)}: not a private file of ours (remove it)"
            )
        return os.read(fd, 256).decode().strip()
    finally:
        os.close(fd)


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


def refusal_frame(message: str) -> bytes:
    """The answer to the hello of a control connection the supervisor refuses (its peer is a
    child, or sandboxed): a failed reply of kind ``refused``, so the verb fails at once
    (exit 4) instead of waiting for a supervisor that answers. It carries no token: the peer
    is never sent the one it may lack."""
    body = {"ok": False, "error": message, "data": {"kind": Refused.kind}}
    head = {"v": PROTOCOL_VERSION, "token": "", "owner": CONTROL_OWNER, "corr": HELLO_CORR}
    data = _dumps({**head, "kind": "response", "type": "reply", "body": body}).encode()
    return len(data).to_bytes(4, "big") + data


def request_frame(token: str, corr: str, op: str, args: Mapping[str, Any]) -> bytes:
    """The frame of one control request, or a one-line usage error: too large, or not
    representable as UTF-8 JSON (a lone surrogate from an undecodable argument)."""
    try:
        return control_frame(token, corr, "control", {"op": op, "args": dict(args)})
    except (ValueError, TypeError) as exc:  # UnicodeEncodeError too
        raise UsageError(f"{op}: the request is not representable as UTF-8 JSON: {exc}") from None


class Connection:
    """One control connection; :meth:`open` it, :meth:`request` on it, :meth:`close` it."""

    def __init__(self, sock: _socket.socket, path: str, token: str) -> None:
        self._sock = sock
        self._path = path
        self._token = token
        self._sent = 0  # requests sent; the first carries the hello

    @classmethod
    def open(cls, path: str | os.PathLike[str], token: str, *, timeout: float) -> Connection:
        """Connect to the control socket at *path*; :class:`NotConnected` if nothing listens."""
        where = os.fspath(path)
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(min(max(timeout, 0.001), 5.0))
        try:
            sock.connect(where)
        except OSError as exc:  # nothing was sent: the request never reached a supervisor
            sock.close()
            raise NotConnected(f"supervisor at {where} is unreachable: {exc}") from None
        return cls(sock, where, token)

    def close(self) -> None:
        self._sock.close()

    def request(self, op: str, args: Mapping[str, Any], *, timeout: float) -> dict[str, Any]:
        """One control request; raises the :class:`FleetError` the supervisor reported."""
        timeout = min(max(timeout, 0.001), 120.0)
        first = self._sent == 0
        corr = str(self._sent + 1)
        data = request_frame(self._token, corr, op, args)
        if first:
            hello = {"pid": os.getpid(), "role": "control", "backend": ""}
            data = control_frame(self._token, HELLO_CORR, "hello", hello) + data
        deadline = time.monotonic() + timeout
        self._sent += 1
        try:
            self._sock.sendall(data)
        except OSError as exc:
            broken = Unreachable(f"supervisor at {self._path} is unreachable: {exc}")
            if first:  # a refusal may have closed the connection first: its answer tells
                self._welcome(deadline, op, timeout, broken)
            raise broken from None
        if first:
            self._welcome(deadline, op, timeout, None)
        reply = self._response(corr, deadline, op, timeout)
        if not reply["ok"]:
            data_ = reply.get("data", {})
            kind = str(data_.get("kind", "error"))
            message = reply.get("error") or f"{op} request to {CONTROL_OWNER} failed"
            raise ERROR_KINDS.get(kind, FleetError)(message)
        result: dict[str, Any] = reply.get("data", {})
        return result

    def _welcome(
        self, deadline: float, op: str, timeout: float, broken: Unreachable | None
    ) -> None:
        """Read the answer to the hello: return when it is welcomed; raise :class:`Refused`
        at once when the supervisor refused this connection (so no caller waits for it to
        answer), else *broken* or :class:`Unreachable`."""
        try:
            welcome = self._response(HELLO_CORR, deadline, op, timeout)
        except Unreachable as exc:
            if broken is not None:
                raise broken from None
            raise Unreachable(f"supervisor at {self._path} is unreachable: {exc}") from None
        if welcome["ok"]:
            if broken is not None:
                raise broken
            return
        error = welcome.get("error") or "refused"
        if welcome.get("data", {}).get("kind") == Refused.kind:
            raise Refused(f"the supervisor at {self._path} refused this connection: {error}")
        raise Unreachable(f"supervisor at {self._path} refused the hello: {error}")

    def _receive(self, size: int, deadline: float, op: str, timeout: float) -> bytes:
        chunks: list[bytes] = []
        while size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unreachable(f"supervisor did not answer {op} within {timeout:g} s")
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(min(size, 65536))
            except TimeoutError:
                raise Unreachable(f"supervisor did not answer {op} within {timeout:g} s") from None
            except OSError as exc:
                raise Unreachable(f"supervisor connection broke during {op}: {exc}") from None
            if not chunk:
                raise Unreachable(f"supervisor closed the connection during {op}")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def _response(self, corr: str, deadline: float, op: str, timeout: float) -> dict[str, Any]:
        """The body of the ``reply`` answering *corr*; frames answering nothing are skipped."""
        while True:
            size = int.from_bytes(self._receive(4, deadline, op, timeout), "big")
            if not 0 < size <= MAX_FRAME:
                raise Unreachable(f"supervisor sent a {size}-byte frame during {op}")
            try:
                frame = _loads(self._receive(size, deadline, op, timeout).decode())
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
    socket: str | os.PathLike[str],
    token: str,
    op: str,
    args: Mapping[str, Any],
    *,
    timeout: float,
) -> dict[str, Any]:
    """One control request on a connection of its own."""
    request_frame(token, "1", op, args)  # a request that cannot be sent fails before connecting
    connection = Connection.open(socket, token, timeout=timeout)
    try:
        return connection.request(op, args, timeout=timeout)
    finally:
        connection.close()
