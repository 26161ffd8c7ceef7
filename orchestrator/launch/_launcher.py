"""Launchers start ``python -m child`` somewhere and watch it.

:class:`ProcessLauncher` (the default) runs the child as a process in its own session: a
fork of the preloaded fork server (:mod:`orchestrator.launch._forkserver`) when the command is the
plain, unsandboxed child and the server works, else a direct subprocess. Either way the child
inherits its connection and loadout as descriptors (:attr:`LaunchSpec.inherit`).
``subprocess.Popen`` is called on the trio thread itself: trio's own ``open_process`` forks
from a worker thread, and ``PR_SET_PDEATHSIG`` (bubblewrap's ``--die-with-parent``) fires when
*that thread* exits — trio retires idle threads after 10 s, which would kill a sandboxed child
at 10.0 s. Exit is awaited on a pidfd where the platform has one, else by polling.
"""

import functools
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs
import trio

from orchestrator.launch._forkserver import ForkServer, ForkServerError
from orchestrator.launch._kill import MARKER_ENV, kill_tree

log = logging.getLogger("orchestrator")


def exit_failure(code: int, *, sandboxed: bool) -> tuple[str, str]:
    """The failure kind and one-line error for a child that exited by itself with *code*."""
    if code > 128 and sandboxed:
        # bwrap is the direct child: it reports a child killed by signal N as 128 + N.
        code = 128 - code
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return "killed", f"child killed by {name}"
    return "exited", f"child exited with code {code}"


OutputSink = Callable[[str, bytes], None]


@attrs.frozen(kw_only=True)
class Shipment:
    """A workspace that travels to the child's node as a git bundle (``ray``): checked out at
    *work_tree* there (read-only for a reading child), and bundled back at stop when *back*.
    *tree*: the snapshot's Git tree id, by which a node keeps a reader's tree."""

    bundle: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    work_tree: str
    read_only: bool = False
    back: bool = False
    tree: str = ""


@attrs.frozen(kw_only=True)
class LaunchSpec:
    """What to start and how."""

    key: str
    name: str
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    #: The child's connection (its socket pair end) and sealed loadout, which *argv* names
    #: (``--fd N --loadout-fd M``): the child inherits them at those numbers. Only a launcher
    #: that starts the child as its own descendant can take them (``process``).
    inherit: tuple[int, int] | None = None
    #: *argv* is exactly the plain child command for *inherit* (no sandbox wrapper): a
    #: launcher may then start the child from a preloaded fork server instead. For the ray
    #: launcher: its node host may fork the child (it carries no credential).
    plain: bool = False
    #: *argv* is the child under bwrap, and this is that sandbox's view (bwrap's mount
    #: operations and directory): a launcher may fork the child from the sandboxed fork
    #: server instead, which builds the same view for it.
    view: Mapping[str, object] | None = None
    #: A child that dials back over mutual TLS: the directory (on its node) for its key and
    #: certificates, which its launcher fills before the child starts (``ray``).
    tls: str = ""
    #: The workspace ships to the child's node (a remote launcher only).
    ship: Shipment | None = None
    #: A remote child's door (``tls://HOST:PORT``): its node host carries its channel there
    #: over the host's link, and it dials nothing itself (``ray`` with node hosts).
    door: str = ""


@runtime_checkable
class ShipsBack(Protocol):
    """A launched child whose workspace travelled (:class:`Shipment` with ``back``): after
    terminate, *returned* is the node's bundle of its changes, or *lost* says why there is none."""

    ships_back: bool
    returned: bytes | None
    lost: str


class Launched(Protocol):
    """A started child as its launcher sees it."""

    pid: int
    exited: trio.Event
    returncode: int | None

    async def wait(self) -> int: ...

    async def terminate(self, grace: float) -> None: ...

    async def drain(self, timeout: float) -> None: ...  # noqa: ASYNC109 - a bounded drain

    def describe(self) -> str: ...


class Launcher(Protocol):
    name: str

    async def launch(
        self, spec: LaunchSpec, sink: OutputSink, nursery: trio.Nursery
    ) -> Launched: ...


@attrs.define(eq=False)
class LaunchedProcess:
    """A child process of ours or of the fork server; its stdout/stderr feed *sink*."""

    pid: int
    #: Waits for the process to end and returns its exit status (negative: a signal).
    reap: Callable[[], Awaitable[int]]
    #: The run's marker (``MARKER_ENV``), so the kill also finds descendants that left the tree.
    marker: str | None = None
    forked: bool = False
    exited: trio.Event = attrs.Factory(trio.Event)
    returncode: int | None = None
    _readers_done: trio.Event = attrs.Factory(trio.Event)
    _reader_scope: trio.CancelScope = attrs.Factory(trio.CancelScope)

    async def _watch(self) -> None:
        try:
            self.returncode = await self.reap()
        finally:
            self.exited.set()

    async def wait(self) -> int:
        await self.exited.wait()
        assert self.returncode is not None  # noqa: S101 - set before exited
        return self.returncode

    async def terminate(self, grace: float) -> None:
        await kill_tree(self.pid, exited=self.exited, grace=grace, marker=self.marker)

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109 - a bounded drain
        """Give stdio *timeout* seconds to reach EOF, then stop reading.

        A grandchild that inherited the pipes must not keep ``stop`` waiting.
        """
        with trio.move_on_after(timeout):
            await self._readers_done.wait()
        self._reader_scope.cancel()

    def describe(self) -> str:
        return f"process pid {self.pid}" + (" (forked)" if self.forked else "")


async def _wait_exit(popen: subprocess.Popen[bytes]) -> int:
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd = pidfd_open(popen.pid)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                await trio.lowlevel.wait_readable(fd)
            finally:
                os.close(fd)
            return popen.wait()
    while popen.poll() is None:  # noqa: ASYNC110 - no pidfd on this platform
        await trio.sleep(0.05)
    return popen.returncode


async def _wait_forked(forks: ForkServer, pid: int, pidfd: int) -> int:
    try:
        await trio.lowlevel.wait_readable(pidfd)  # readable once the process has ended
    finally:
        os.close(pidfd)
    return await forks.exit_status(pid)


async def _pump(fd: int, stream: str, sink: OutputSink) -> None:
    async with trio.lowlevel.FdStream(fd) as pipe:
        while True:
            try:
                chunk = await pipe.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not chunk:
                return
            sink(stream, bytes(chunk))


@attrs.define(eq=False)
class ProcessLauncher:
    """Run the child as a process in a new session: forked from *forks* when it can be."""

    name: str = "process"
    forks: ForkServer | None = None
    #: The sandboxed fork server, for children whose spec has a sandbox :attr:`LaunchSpec.view`.
    boxed: ForkServer | None = None

    async def launch(
        self, spec: LaunchSpec, sink: OutputSink, nursery: trio.Nursery
    ) -> LaunchedProcess:
        launched: LaunchedProcess | None = None
        fds: list[int] = []
        if (
            self.forks is not None
            and spec.plain
            and spec.inherit is not None
            and spec.argv[0] == self.forks.python
        ):
            launched, fds = await self._fork(self.forks, spec)
        elif self.boxed is not None and spec.view is not None and spec.inherit is not None:
            launched, fds = await self._fork(self.boxed, spec)
        if launched is None:
            popen = spawn_popen(spec.argv, cwd=spec.cwd, env=spec.env, pass_fds=spec.inherit or ())
            reap = functools.partial(_wait_exit, popen)
            launched = LaunchedProcess(pid=popen.pid, reap=reap, marker=spec.env.get(MARKER_ENV))
            for pipe in (popen.stdout, popen.stderr):
                assert pipe is not None  # noqa: S101 - we asked for PIPE
                fds.append(os.dup(pipe.fileno()))
                pipe.close()
        nursery.start_soon(launched._watch)

        async def read_all() -> None:
            with launched._reader_scope:
                async with trio.open_nursery() as readers:
                    readers.start_soon(_pump, fds[0], "stdout", sink)
                    readers.start_soon(_pump, fds[1], "stderr", sink)
            launched._readers_done.set()

        nursery.start_soon(read_all)
        return launched

    async def _fork(
        self, forks: ForkServer, spec: LaunchSpec
    ) -> tuple[LaunchedProcess | None, list[int]]:
        """Start *spec* as a fork of the server; ``None`` when the server cannot."""
        assert spec.inherit is not None  # noqa: S101 - checked by the caller
        forks.start()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid, pidfd = await forks.spawn(
                cwd=spec.cwd,
                env=spec.env,
                name=f"fleet {spec.key}",
                stdio=(out_w, err_w),
                inherit=spec.inherit,
                view=spec.view if forks.sandboxed else None,
            )
        except BaseException as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            if not isinstance(exc, ForkServerError):
                raise
            log.info("%s: starting a fresh interpreter instead: %s", spec.key, exc)
            return None, []
        finally:
            for fd in (out_w, err_w):
                os.close(fd)
        reap = functools.partial(_wait_forked, forks, pid, pidfd)
        launched = LaunchedProcess(pid=pid, reap=reap, marker=spec.env.get(MARKER_ENV), forked=True)
        return launched, [out_r, err_r]


def spawn_popen(
    argv: Sequence[str], *, cwd: str, env: Mapping[str, str], pass_fds: Sequence[int] = ()
) -> subprocess.Popen[bytes]:
    """Start *argv* on the calling (trio) thread, in a new session, stdin from /dev/null.

    The child inherits no descriptor but its stdio and *pass_fds* (at the same numbers).
    """
    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
        pass_fds=tuple(pass_fds),
    )


def inherited_child_argv(python: str, connection: int, loadout: int) -> tuple[str, ...]:
    """``python -I -m child --fd N --loadout-fd M``: a child that inherits its connection
    and loadout as descriptors (see :func:`child_argv` for the interpreter path and ``-I``)."""
    return (
        *child_argv(python, "")[:-1],
        "--fd",
        str(connection),
        "--loadout-fd",
        str(loadout),
    )


def child_argv(python: str, loadout: str) -> tuple[str, ...]:
    """``python -I -m child <loadout>`` with an absolute interpreter path.

    The path is made absolute but not resolved: a virtualenv's ``python`` is a symlink, and
    resolving it would start the base interpreter without the venv's packages. ``-I`` keeps
    the workspace (the child's cwd) off ``sys.path``, so a repository with its own ``child``
    directory cannot shadow ours.
    """
    return (os.path.abspath(python or sys.executable), "-I", "-m", "child", loadout)
