"""Admission: which connection may speak for a child, and the count of those refused.

A local child's connection is its own from birth: the supervisor makes one socket pair per
child, keeps one end and hands the child the other with its sealed loadout
(:func:`inherited_pair`), so there is no socket path to race and no token file to read; the
hello on our end may name that child only (:func:`accept_own`). A pane's child (tmux, cmux)
cannot inherit descriptors from us, so it connects to the session's listener; its hello is
admitted only from the launched process or one of its descendants, by the peer's
``SO_PEERCRED`` pid (:func:`descends_from`) — translated into our pid namespace by the kernel,
so a child inside bubblewrap's pid namespace is still found under the pane's process.

Every refused hello is counted by reason (:class:`Refusals`) and, when the reject log is on,
logged there; the peer is never told why.
"""

import contextlib
import os
import socket
import struct
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
import psutil
import trio

import ipc
from orchestrator._config import Config
from orchestrator._sync import wait_first

if TYPE_CHECKING:
    from orchestrator.core._run import ChildRun

#: How far up the parent chain a descendant may be (bwrap, its init, a shell, the child).
MAX_DEPTH: Final = 64
_LOCAL_PEERPID: Final = 0x002  # macOS <sys/un.h>


def peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end of a connected Unix socket, if known.

    For a listener's connection it is the process that connected; for a socket pair the
    process that made the pair.
    """
    with contextlib.suppress(OSError):
        so_peercred = getattr(socket, "SO_PEERCRED", None)
        if so_peercred is not None:
            creds = sock.getsockopt(socket.SOL_SOCKET, so_peercred, struct.calcsize("3i"))
            pid = struct.unpack("3i", creds)[0]
            return int(pid) if pid > 0 else None
        if sys.platform == "darwin":
            raw = sock.getsockopt(0, _LOCAL_PEERPID, struct.calcsize("i"))
            return int(struct.unpack("i", raw)[0])
    return None


def descends_from(pid: int, root: int) -> bool:
    """Whether *pid* is *root* or one of its descendants (walking the parent chain)."""
    current = pid
    for _ in range(MAX_DEPTH):
        if current == root:
            return True
        if current <= 1:
            return False
        try:
            current = psutil.Process(current).ppid()
        except psutil.Error:
            return False
    return False


def inherited_pair() -> tuple[socket.socket, socket.socket]:
    """A connected Unix stream pair: (ours, the child's). Neither end is inheritable; the
    launcher passes the child's end to exactly one child."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


async def accept_own(
    sock: socket.socket,
    owner: str,
    token: Callable[[], str | None],
    *,
    timeout: float,  # noqa: ASYNC109 - the handshake deadline of the protocol
    request_timeout: float,
) -> tuple[ipc.Channel, ipc.Envelope]:
    """The authenticated hello on our end of *owner*'s socket pair.

    Only *owner* may be named on it, with the token *token* returns (``None``: no longer
    admissible). Raises :class:`ipc.HandshakeError` as :func:`ipc.accept_hello` does.
    """
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))

    def lookup(named: str) -> str | None:
        return token() if named == owner else None

    return await ipc.accept_hello(stream, lookup, timeout=timeout, request_timeout=request_timeout)


@attrs.define(eq=False)
class Refusals:
    """Refused hellos, counted by reason, and logged through *log* (the reject log)."""

    log: Callable[[str, Mapping[str, Any]], None]
    counts: dict[str, int] = attrs.Factory(dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def refuse(self, reason: str, owner: str, **evidence: Any) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.log(owner, {"reason": reason, **evidence})


def unlink_quietly(path: str) -> None:
    """Remove a loadout file that may already be gone (the child unlinks it first)."""
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)


@attrs.define(eq=False)
class ListenerDoor:
    """The session listener's door: a pane's child, once, from the launched process only."""

    runs: Mapping[str, "ChildRun"]
    config: Config
    refusals: Refusals

    def token_for(self, owner: str) -> str | None:
        """The token a hello on the listener must carry for *owner*: only a pane's child's,
        only until it connects (a token is good for one pending launch)."""
        run = self.runs.get(owner)
        if run is None or run.finishing or run.connected.is_set() or not run.loadout:
            # A child that inherits its connection never uses the listener: no hello there
            # may speak for it, whatever token it carries.
            return None
        return run.token

    async def handle_connection(self, stream: trio.SocketStream) -> None:
        """A connection to the listener: a pane's child, once, from the launched process."""
        try:
            channel, hello = await ipc.accept_hello(
                stream,
                self.token_for,
                timeout=self.config.hello_timeout,
                request_timeout=self.config.request_timeout,
            )
        except ipc.HandshakeError as exc:
            self.refusals.refuse(exc.reason, "", via="listener")
            return
        run = self.runs.get(channel.owner)
        if run is None:
            self.refusals.refuse("owner", channel.owner, via="listener")
            await channel.aclose("unknown owner")
            return
        pid = peer_pid(stream.socket)  # type: ignore[arg-type]  # a trio socket has getsockopt
        if not await self._launched_by(run, pid):
            self.refusals.refuse("peer-pid", run.key, via="listener", pid=pid)
            await channel.aclose("not the launched process")
            return
        unlink_quietly(run.loadout)  # the child unlinks it first; a sandboxed one may not
        await run.attach(channel, hello)

    async def _launched_by(self, run: "ChildRun", pid: int | None) -> bool:
        """Whether *pid* is *run*'s launched process or one of its descendants."""
        if pid is None:
            return False
        # The hello can beat the launcher's answer (cmux reads the pid off the screen).
        with trio.move_on_after(self.config.hello_timeout):
            await wait_first(run.started, run.done)
        if run.launched is None:
            return False
        return await trio.to_thread.run_sync(descends_from, pid, run.launched.pid)
