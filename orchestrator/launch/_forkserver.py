"""The supervisor's side of the fork server (``child/_forkserver.py`` is the other side).

One server per supervisor, started on first use or up front (:meth:`ForkServer.start`), on
the trio thread like every process we start (DESIGN.md §10). It preloads the child's imports
once; each unsandboxed ``process`` child is then a fork of it, which saves the ~200 ms of CPU a
fresh interpreter spends importing trio and our packages.

The server is the forked child's parent, so it reaps it and reports the exit status; we hold
the child's pidfd (opened by the server before it could reap) to learn the moment it ends and
to signal exactly that process. If the server cannot start, or dies, :attr:`ForkServer.failure`
says why and the launcher starts children the ordinary way again.

A *sandboxed* server (``wrapper`` set: its own bwrap command line, from
:func:`sandbox.wrap_fork_server`) forks sandboxed children: each request carries the child's
bwrap mount operations, and the fork builds that view in namespaces of its own before any of
the child's code runs (``child/_enclose.py``). Its pids are those of its own pid namespace: the
pid we report is the host's, read from the pidfd.
"""

import array
import contextlib
import ctypes
import fcntl
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import psutil
import trio

from orchestrator.launch._kill import alive

log = logging.getLogger("orchestrator")

READY_TIMEOUT: Final = 30.0
REPLY_TIMEOUT: Final = 10.0
#: The server's end of its socket is the lowest free descriptor from here.
_SERVER_FD_FLOOR: Final = 10
#: How long to wait for an exit status once the pidfd said the child ended.
STATUS_TIMEOUT: Final = 5.0
#: The status reported when the server is gone and nobody can tell the real one.
UNKNOWN_STATUS: Final = 255
MAX_MESSAGE: Final = 1 << 20
#: How long a server that closed its socket may take to have an exit status to report.
_EXIT_NOTE_S: Final = 1.0
_FD_BYTES: Final = array.array("i").itemsize
_PR_SET_PDEATHSIG: Final = 1
#: How long a closed server's processes may take to be gone (or zombies) once killed.
_GONE_S: Final = 5.0


class ForkServerError(Exception):
    """The fork server could not start a child (the launcher falls back to ``Popen``)."""


@attrs.define(eq=False)
class _Reply:
    done: trio.Event = attrs.Factory(trio.Event)
    message: dict[str, Any] | None = None
    fds: list[int] = attrs.Factory(list)


@attrs.define(eq=False)
class ForkServer:
    """A preloaded ``python -I -m child._forkserver`` that forks children on request."""

    python: str
    #: Shown in the server's (and so every forked child's) command line: the session directory.
    label: str
    env: Mapping[str, str]
    #: The supervisor's: the server's reader must outlive the run that happened to start it.
    nursery: trio.Nursery
    #: Where the server's own stderr goes (appended); ``None`` discards it.
    log_path: Path | None = None
    #: The sandbox command the server runs in (a sandboxed server); empty: a plain one.
    wrapper: tuple[str, ...] = ()
    #: The server gets ``PR_SET_PDEATHSIG`` = SIGKILL against the thread that starts it, and
    #: each fork against the server: when whoever started the server dies (a Ray node host),
    #: the server and every child it forked die with it (:mod:`._ray_forks`).
    die_with_parent: bool = False

    failure: str | None = attrs.field(default=None, init=False)
    pid: int | None = attrs.field(default=None, init=False)
    _popen: subprocess.Popen[bytes] | None = attrs.field(default=None, init=False)
    _sock: trio.socket.SocketType | None = attrs.field(default=None, init=False)
    _ready: trio.Event = attrs.field(factory=trio.Event, init=False)
    _ids: "itertools.count[int]" = attrs.field(factory=lambda: itertools.count(1), init=False)
    _replies: dict[int, _Reply] = attrs.field(factory=dict, init=False)
    #: One request on the socket at a time: trio lets one task wait to send on a socket, and
    #: a second spawn arriving while the socket's buffer is full failed (BusyResourceError).
    _sending: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _exits: dict[int, int | None] = attrs.field(factory=dict, init=False)
    _exit_events: dict[int, trio.Event] = attrs.field(factory=dict, init=False)
    #: A sandboxed server's children: host pid -> the pid in the server's namespace.
    _inner: dict[int, int] = attrs.field(factory=dict, init=False)

    @property
    def sandboxed(self) -> bool:
        return bool(self.wrapper)

    @property
    def started(self) -> bool:
        return self._popen is not None or self.failure is not None

    def start(self) -> None:
        """Start the server in the background (once); :meth:`ready` waits for it."""
        if self.started:
            return
        ours, pair_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Above the descriptors a sandbox wrapper uses itself (its seccomp shell opens fd 3):
        # the lowest free one from 10. Never a chosen number: dup2 onto one closes whatever
        # another thread holds there (a node host, many children's pipes and trio loops
        # open, lost its fork loop's wakeup socket that way and every later child failed).
        theirs = fcntl.fcntl(pair_end.fileno(), fcntl.F_DUPFD_CLOEXEC, _SERVER_FD_FLOOR)
        pair_end.close()
        argv = [self.python, "-I", "-m", "child._forkserver", str(theirs), self.label]
        if self.wrapper:
            argv = [*self.wrapper, *argv, "--sandboxed"]
        try:
            with _stderr_for(self.log_path) as stderr:
                self._popen = subprocess.Popen(
                    argv,
                    env=dict(self.env),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    pass_fds=(theirs,),
                    start_new_session=True,
                    preexec_fn=die_with_parent if self.die_with_parent else None,  # noqa: PLW1509 - prctl only
                )
        except OSError as exc:
            ours.close()
            self._fail(f"cannot start: {exc}")
            return
        finally:
            os.close(theirs)
        self.pid = self._popen.pid
        self._sock = trio.socket.from_stdlib_socket(ours)
        self.nursery.start_soon(self._read)

    async def ready(self) -> bool:
        """Wait until the server can fork (``True``) or has failed (``False``)."""
        await self._ready.wait()
        return self.failure is None

    async def spawn(
        self,
        *,
        cwd: str,
        env: Mapping[str, str],
        name: str,
        stdio: tuple[int, int],
        inherit: tuple[int, int] | tuple[int],
        view: Mapping[str, Any] | None = None,
        dial: bool = False,
    ) -> tuple[int, int]:
        """Fork a child; its (host) pid and a pidfd for it (the caller closes it).

        *stdio* are the child's stdout and stderr, *inherit* its connection (a socket pair
        end) and its sealed loadout; the server keeps no copy of any of them. *view* (a
        sandboxed server only): ``{"ops": bwrap mount operations, "cwd": dir}``. With *dial*,
        *inherit* is the sealed loadout alone: a child that dials its connection itself (a Ray
        node's, ``--loadout-fd M``).
        """
        if len(inherit) != (1 if dial else 2):
            raise ValueError("fork server: a child inherits its connection and loadout, or dials")
        if not await self.ready():
            raise ForkServerError(f"fork server unavailable: {self.failure}")
        assert self._sock is not None  # noqa: S101 - set when ready
        request_id = next(self._ids)
        reply = self._replies[request_id] = _Reply()
        message: dict[str, Any] = {"spawn": request_id, "cwd": cwd, "env": dict(env)}
        message["name"] = name
        if dial:
            message["dial"] = True
        if self.die_with_parent:
            message["die_with_server"] = True
        if view is not None:
            message["sandbox"] = dict(view)
        try:
            try:
                async with self._sending:
                    await self._sock.sendmsg(
                        [json.dumps(message).encode()],
                        [
                            (
                                socket.SOL_SOCKET,
                                socket.SCM_RIGHTS,
                                array.array("i", (*stdio, *inherit)),
                            )
                        ],
                    )
            except OSError as exc:
                self._fail(f"request failed: {exc}")
                raise ForkServerError(f"fork server unavailable: {self.failure}") from None
            with trio.move_on_after(REPLY_TIMEOUT):
                await reply.done.wait()
        finally:
            self._replies.pop(request_id, None)
        answer = reply.message
        if answer is None or "pid" not in answer or len(reply.fds) != 1:
            for fd in reply.fds:
                os.close(fd)
            why = (answer or {}).get("error") or self.failure or "no answer"
            raise ForkServerError(f"fork server could not start {name}: {why}")
        pid = int(answer["pid"])
        if self.sandboxed:
            try:
                inner, pid = pid, host_pid(reply.fds[0])
            except (OSError, ValueError, ForkServerError):
                os.close(reply.fds[0])
                raise ForkServerError(
                    f"fork server: {name} ended before it could be seen"
                ) from None
            self._inner[pid] = inner
        return pid, reply.fds[0]

    async def exit_status(self, pid: int) -> int:
        """The exit status of the forked *pid*, once it has ended (its pidfd said so)."""
        pid = self._inner.pop(pid, pid)
        event = self._exit_events.setdefault(pid, trio.Event())
        with trio.move_on_after(STATUS_TIMEOUT):
            await event.wait()
        self._exit_events.pop(pid, None)
        status = self._exits.pop(pid, None)
        if status is None:
            log.warning("exit status of forked child %d unknown: %s", pid, self.failure)
            return UNKNOWN_STATUS
        return status

    async def _read(self) -> None:
        assert self._sock is not None  # noqa: S101 - started
        try:
            with trio.fail_after(READY_TIMEOUT):
                message, fds = await self._receive()
            if message is None or "ready" not in message:
                note = await self._exit_note(closed=message is None)
                self._fail(f"did not start (said {message!r}){note}")
                return
            self._ready.set()
            while True:
                message, fds = await self._receive()
                if message is None:
                    self._fail(f"ended{await self._exit_note(closed=True)}")
                    return
                self._dispatch(message, fds)
        except trio.TooSlowError:
            self._fail(f"not ready within {READY_TIMEOUT:g} s")
        except trio.ClosedResourceError:
            self._fail("closed", quiet=True)  # aclose(): the supervisor is ending
        except (OSError, ValueError) as exc:
            self._fail(f"broke: {exc}")
        finally:
            self._ready.set()

    def _dispatch(self, message: dict[str, Any], fds: list[int]) -> None:
        if "spawned" in message:
            reply = self._replies.get(message["spawned"])
            if reply is None:  # its requester gave up: nobody will close these
                for fd in fds:
                    os.close(fd)
                return
            reply.message, reply.fds = message, fds
            reply.done.set()
        elif "exit" in message:
            pid = int(message["exit"])
            self._exits[pid] = int(message["status"])
            self._exit_events.setdefault(pid, trio.Event()).set()

    async def _receive(self) -> tuple[dict[str, Any] | None, list[int]]:
        assert self._sock is not None  # noqa: S101 - started
        data, ancillary, _flags, _address = await self._sock.recvmsg(
            MAX_MESSAGE, socket.CMSG_SPACE(4 * _FD_BYTES)
        )
        fds = array.array("i")
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % _FD_BYTES])
        if not data:
            for fd in fds:
                os.close(fd)
            return None, []
        return json.loads(data), list(fds)

    async def _exit_note(self, *, closed: bool) -> str:
        """`` (exit N)`` when the server has ended. Once it has *closed* its end of the socket,
        its exit status is waited for: the kernel gives it a moment after the process has
        closed its descriptors (:data:`_EXIT_NOTE_S` at most)."""
        if self._popen is None:
            return ""
        if closed:
            with trio.move_on_after(_EXIT_NOTE_S):
                while self._popen.poll() is None:  # noqa: ASYNC110 - no event for its exit here
                    await trio.sleep(0.01)
        code = self._popen.poll()
        return "" if code is None else f" (exit {code})"

    def _fail(self, why: str, *, quiet: bool = False) -> None:
        if self.failure is None:
            self.failure = why
            if not quiet:
                log.warning("fork server %s; children start as fresh interpreters", why)
        if self._popen is not None and self._popen.poll() is None:
            # Stuck or speaking nonsense; aclose() reaps it. Its forked children go on (they
            # are the fleet's); before it was ready it has none, and its whole tree goes.
            if self._ready.is_set():
                self._popen.kill()
            else:
                _kill_with_tree(self._popen)
        self._ready.set()
        for reply in self._replies.values():
            reply.done.set()
        for event in self._exit_events.values():
            event.set()

    async def aclose(self) -> None:
        """Stop the server: close our end (it exits on EOF), then reap it."""
        if self._sock is not None:
            self._sock.close()
        popen = self._popen
        if popen is None:
            return
        tree = _descendants(popen.pid)
        with trio.move_on_after(2.0):
            while popen.poll() is None:  # noqa: ASYNC110 - a short wait for a quick exit
                await trio.sleep(0.01)
        if popen.poll() is None:
            _kill_with_tree(popen)
            await trio.to_thread.run_sync(popen.wait)
        _kill(tree)
        # Gone when we return: a killed process lingers until the kernel has delivered the
        # signal (a sandboxed server's inner bwrap was still listed right after, under load).
        # A zombie counts as gone: the inner bwrap, orphaned when the outer one exits, is
        # reaped by init, which on some machines (a microVM's) does it only every second or two.
        with trio.move_on_after(_GONE_S):
            while alive(tree):  # noqa: ASYNC110 - no event exists for a non-child exit
                await trio.sleep(0.01)


def die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """``PR_SET_PDEATHSIG`` = SIGKILL: a ``preexec_fn`` (it fires when the starting *thread*
    exits, so start from a thread that lives as long as the parent should)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()  # psutil checks the pid still names the process it listed


def _kill_with_tree(popen: subprocess.Popen[bytes]) -> None:
    """SIGKILL the server and what it started. The tree is listed first: a sandboxed server's
    inner bwrap (the pid namespace's init, in a session of its own, deaf to SIGTERM) killed
    before it set its parent-death signal waits for its gone parent for ever; one was found
    left over after a test run."""
    tree = _descendants(popen.pid)
    popen.kill()
    _kill(tree)


def host_pid(pidfd: int) -> int:
    """The pid, in our pid namespace, of the process *pidfd* refers to."""
    with open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("Pid:"):
                pid = int(line.split()[1])
                if pid > 0:
                    return pid
    raise ForkServerError("fork server: the forked child's pid cannot be read from its pidfd")


@contextlib.contextmanager
def _stderr_for(path: Path | None) -> Any:
    if path is None:
        yield subprocess.DEVNULL
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        yield fd
    finally:
        os.close(fd)
