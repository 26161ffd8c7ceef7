"""The egress proxy: a sandboxed child's only way to the network.

Every sandboxed child runs with ``--unshare-net``. A child that talks to a model gets one Unix
socket bound into its sandbox, served here by an :class:`EgressProxy` holding that child's
allowlist of ``host:port`` pairs (its model endpoint plus the definition's ``egress:`` list).
The child's runtime relays its connections through the socket (``child/backends/_egress.py``).

Only the launched child and its descendants may use the socket (``SO_PEERCRED`` pid, checked
against the process tree): a sibling that finds the path gets a refusal, not the allowlist.
One connection carries one HTTP ``CONNECT host:port HTTP/1.x`` request. The request head is
bounded (:data:`MAX_HEAD_BYTES`) and must arrive within :data:`HEAD_TIMEOUT` seconds; the
target must match an allowlisted pair exactly (host compared case-insensitively; nothing is
resolved that the client did not name, so a name that resolves elsewhere never widens the
list). An allowed target is dialled with ``trio.open_tcp_stream``, answered ``200`` and relayed
both ways until both sides are done. Anything else — another method, a malformed or oversize
head, a slow client, a target off the list, more than :data:`MAX_CONNECTIONS` at once — is
answered with one status line and closed, and reported to ``on_refused`` (the supervisor writes
it to the child's run log and the reject log).

A target in :attr:`EgressProxy.models` (the child's model endpoint, when the supervisor runs a
model gateway for it) is not dialled: after the ``200`` the tunnel's bytes go to that handler
(``orchestrator.spend._gateway``), which relays, keys and meters each request itself.
"""

import contextlib
import errno
import os
import socket
import stat
import struct
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Final

import attrs
import psutil
import trio

MAX_HEAD_BYTES: Final = 8192
HEAD_TIMEOUT: Final = 10.0
CONNECT_TIMEOUT: Final = 15.0
MAX_CONNECTIONS: Final = 32
_CHUNK: Final = 65536

Dial = Callable[[str, int], Awaitable[trio.abc.Stream]]
#: Serves a tunnel to a model endpoint: the client's stream and the bytes after its CONNECT.
ModelHandler = Callable[[trio.abc.Stream, bytes], Awaitable[None]]


class EgressError(Exception):
    """An allowlist entry or a proxy socket that cannot be used; the message says which."""


def parse_target(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as ``(host lower-cased, port)``; else ValueError."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{text!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if not 0 < port < 65536 or not host or any(c in host for c in "/@[] \t\r\n"):
        raise ValueError(f"{text!r} is not host:port")
    return host.lower(), port


def format_target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def allowlist(entries: Iterable[str]) -> frozenset[tuple[str, int]]:
    """Parse every ``host:port`` entry; the first bad one is an :class:`EgressError`."""
    pairs = set()
    for entry in entries:
        try:
            pairs.add(parse_target(entry))
        except ValueError as exc:
            raise EgressError(f"egress allowlist: {exc} (write host:port)") from None
    return frozenset(pairs)


class _Refused(Exception):
    def __init__(self, status: str, reason: str, target: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.target = target


async def _read_head(stream: trio.abc.Stream) -> tuple[bytes, bytes]:
    """The request head up to the blank line, and any bytes the client sent after it."""
    buffer = bytearray()
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            return bytes(buffer[:end]), bytes(buffer[end + 4 :])
        if len(buffer) > MAX_HEAD_BYTES:
            raise _Refused("431 Request Header Fields Too Large", "request head too large")
        data = await stream.receive_some(MAX_HEAD_BYTES + 1 - len(buffer) + 4)
        if not data:
            raise _Refused("400 Bad Request", "connection closed before a full request head")
        buffer += data


def _target_of(head: bytes) -> str:
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _Refused("400 Bad Request", f"malformed request line {line[:120]!r}")
    method, target = parts[0], parts[1].decode("ascii", "replace")
    if method != b"CONNECT":
        raise _Refused("405 Method Not Allowed", f"method {method[:20]!r} is not CONNECT", target)
    return target


@attrs.define(eq=False)
class EgressProxy:
    """One child's CONNECT proxy on a Unix socket (see the module docstring)."""

    path: Path
    allowed: frozenset[tuple[str, int]]
    on_refused: Callable[[str, str], None]
    dial: Dial = trio.open_tcp_stream
    head_timeout: float = HEAD_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    #: The launched process: only it and its descendants may use the proxy (see :meth:`admit`).
    owner_pid: int | None = None
    #: Allowed targets served by a handler (the model gateway) instead of a dialled stream.
    models: Mapping[tuple[str, int], ModelHandler] = attrs.Factory(dict)
    _active: int = 0
    _admitted: trio.Event = attrs.Factory(trio.Event)

    def admit(self, pid: int) -> None:
        """Serve the process tree of *pid* (the launched child); until then connections wait."""
        self.owner_pid = pid
        self._admitted.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen at ``path`` (0600, in a 0700 dir of ours) until cancelled, then unlink it."""
        listener = await self._listen()
        try:
            async with listener, trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    stream = await listener.accept()
                    nursery.start_soon(self._serve_one, stream)
        finally:
            with contextlib.suppress(OSError):
                self.path.unlink()

    async def _listen(self) -> trio.SocketListener:
        directory = self.path.parent
        st = directory.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise EgressError(f"egress proxy {self.path}: {directory} must be a 0700 dir of ours")
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(self.path.lstat().st_mode):
                raise EgressError(f"egress proxy {self.path}: a non-socket is in the way")
            self.path.unlink()
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.bind(os.fspath(self.path))
            os.chmod(self.path, 0o600)
            sock.listen(self.max_connections)
        except OSError as exc:
            sock.close()
            cause = "path too long" if exc.errno == errno.EINVAL else exc.strerror
            raise EgressError(f"egress proxy {self.path}: cannot listen: {cause}") from None
        return trio.SocketListener(sock)

    async def _serve_one(self, client: trio.abc.Stream) -> None:
        async with client:
            if self._active >= self.max_connections:
                await self._refuse(client, _Refused("503 Service Unavailable", "too many"))
                return
            self._active += 1
            try:
                pid = _peer_pid(client)
                if not await self._in_tree(pid):
                    reason = f"peer pid {pid} is not in this child's process tree"
                    await self._refuse(client, _Refused("403 Forbidden", reason))
                    return
                await self._tunnel(client)
            finally:
                self._active -= 1

    async def _in_tree(self, pid: int | None) -> bool:
        """Whether *pid* is the launched process or a descendant: a sibling that can see this
        socket (a leaked path, a shared directory) gets nothing through it."""
        with trio.move_on_after(self.head_timeout):
            await self._admitted.wait()
        if self.owner_pid is None:
            return False
        if pid is None or pid == self.owner_pid:
            return pid is not None or sys.platform != "linux"
        return _descends(pid, self.owner_pid)

    async def _tunnel(self, client: trio.abc.Stream) -> None:
        try:
            upstream, rest = await self._open(client)
        except _Refused as refusal:
            await self._refuse(client, refusal)
            return
        except trio.BrokenResourceError:
            return
        if not isinstance(upstream, trio.abc.Stream):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await upstream(client, rest)
            return
        async with upstream:
            try:
                await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    await upstream.send_all(rest)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, client, upstream)
                    nursery.start_soon(_pump, upstream, client)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    async def _open(self, client: trio.abc.Stream) -> tuple[trio.abc.Stream | ModelHandler, bytes]:
        """Read and check the CONNECT, dial its target (or take its model handler): the
        upstream and the bytes after the head; :class:`_Refused` says why not."""
        with trio.move_on_after(self.head_timeout) as timer:
            head, rest = await _read_head(client)
        if timer.cancelled_caught:
            raise _Refused("408 Request Timeout", "no request head in time")
        target = _target_of(head)
        try:
            pair = parse_target(target)
        except ValueError:
            raise _Refused("400 Bad Request", "target is not host:port", target) from None
        if pair not in self.allowed:
            raise _Refused("403 Forbidden", "not in the egress allowlist", target)
        handler = self.models.get(pair)
        if handler is not None:
            return handler, rest
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                return await self.dial(*pair), rest
        except (OSError, trio.TooSlowError) as exc:
            raise _Refused("502 Bad Gateway", f"connect failed: {exc}", target) from None

    async def _refuse(self, client: trio.abc.Stream, refusal: _Refused) -> None:
        self.on_refused(refusal.target[:300], refusal.reason)
        response = f"HTTP/1.1 {refusal.status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            with trio.move_on_after(1):
                await client.send_all(response.encode())


def _peer_pid(client: trio.abc.Stream) -> int | None:
    """The connecting process's pid (``SO_PEERCRED``, Linux; in our pid namespace)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None or not isinstance(client, trio.SocketStream):
        return None
    creds = client.socket.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    return int(pid) or None


async def _pump(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
    """Copy until *source* ends, then half-close *sink* (so the other direction may finish)."""
    try:
        while data := await source.receive_some(_CHUNK):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        if isinstance(sink, trio.abc.HalfCloseableStream):
            await sink.send_eof()
        else:
            await sink.aclose()


#: How far up a connecting process's ancestry the launched one is looked for.
_MAX_DEPTH = 64


def _descends(pid: int, ancestor: int) -> bool:
    """Whether *ancestor* is among *pid*'s parents: walked up one parent at a time and stopped
    there (the launched process is a level or two up; its own ancestry, to pid 1, is not read)."""
    try:
        for _ in range(_MAX_DEPTH):
            pid = psutil.Process(pid).ppid()
            if pid == ancestor:
                return True
            if pid <= 1:
                return False
    except psutil.Error:
        return False
    return False
