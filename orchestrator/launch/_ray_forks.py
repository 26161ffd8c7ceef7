"""A node host's fork servers: a remote child as a fork of a preloaded interpreter on its node.

A node host (:mod:`._ray_host`) keeps the same :class:`ForkServer` a supervisor keeps for its
local children (``python -I -m child._forkserver``, :mod:`._forkserver`), one plain and one
sandboxed at most, each started on the first child that can use it. A child whose node plan
(:mod:`._nodeplan`) runs it as ``python -I -m child LOADOUT`` is then a fork of the server that
inherits its loadout as a sealed memfd (``--loadout-fd M``: the file in its node directory is
gone before it runs) and its connection, one end of a socket pair whose other end the host
relays over its link to the door (:mod:`._node_link`; a child of an actor of its own dials
the door itself instead); a sandboxed child is a fork of the sandboxed
server that builds, before any code of its own runs, the very view its bwrap command line would
have given it (``child/_enclose.py``). A child whose environment carries a credential is never
forked (the request would leave it in the server's memory, and so in every later fork's), nor is
a child whose command is anything else.

Both servers are started from the host's one trio thread, which lives as long as the host:
each gets ``PR_SET_PDEATHSIG`` against it (a sandboxed one's bwrap has ``--die-with-parent``),
and each fork against its server (a sandboxed fork is the init of a pid namespace inside the
server's, which dies with it), so a host that dies takes the servers and every forked child with
it. The server's environment is the few variables an interpreter needs, never the host's: a
fork inherits the server's memory, and with it that environment block.

If a server cannot start, or dies, its children start the ordinary way (``Popen``) from then
on, as the local launcher falls back.
"""

import functools
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

import sandbox
from orchestrator.launch._forkserver import UNKNOWN_STATUS, ForkServer, ForkServerError
from orchestrator.launch._node_loop import NodeLoop
from orchestrator.launch._nodeplan import node_roots

__all__ = ["ForkedChild", "NodeForks"]

log = logging.getLogger("orchestrator")

#: What a node's fork server keeps of its host's environment (an interpreter needs no more).
_SERVER_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE")
#: Shown in the server's command line (and so in every fork's).
LABEL = "fleet-node-host"


class ForkedChild:
    """A child forked by its node's server, held as the host holds a ``Popen``: its pid (in
    the host's pid namespace), its output (stdout and stderr, one pipe) and, once the server
    has reaped it, its exit status (negative for a signal; a sandboxed child's is its
    namespace init's: 128 + N when a signal N ended the child, as bwrap reports it)."""

    def __init__(self, pid: int, stdout: Any) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._ended = threading.Event()
        #: Set with :attr:`returncode`, on the host's loop (its exit stream awaits it there).
        self.reaped = trio.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0.0)
        assert self.returncode is not None  # noqa: S101 - set before the event
        return self.returncode

    async def _reap(self, forks: ForkServer, pidfd: int) -> None:
        status = UNKNOWN_STATUS
        try:
            try:
                await trio.lowlevel.wait_readable(pidfd)  # readable once the process ended
            finally:
                os.close(pidfd)
            status = await forks.exit_status(self.pid)
        finally:
            self.returncode = status
            self._ended.set()
            self.reaped.set()


class NodeForks:
    """The fork servers of one node host (see the module docstring); blocking calls, made
    from the host's actor threads, run on the host's one trio thread (*loop*)."""

    def __init__(self, loop: NodeLoop) -> None:
        self._lock = threading.Lock()
        #: The host's one trio thread: the servers' readers and reapers run there.
        self._loop = loop
        #: By sandboxed or not: the server, or ``None`` where none can be made here.
        self._servers: dict[bool, ForkServer | None] = {}

    def spawn(
        self,
        *,
        python: str,
        loadout: int,
        cwd: str,
        env: Mapping[str, str],
        name: str,
        view: Mapping[str, Any] | None = None,
        hidden: Callable[[], Sequence[str]] = tuple,
        connection: int = -1,
    ) -> ForkedChild | None:
        """``python -I -m child --loadout-fd M`` as a fork of this node's server, inheriting
        *loadout* (a sealed memfd; the caller closes its own copy) as M: the sandboxed server,
        building *view*, when *view* is given (*hidden*: what that server's own view hides,
        asked only when the server is started). With *connection* (its end of a socket pair
        whose other end its host relays over the node's link, :mod:`._node_link`), the child
        inherits that too and dials nothing (``--fd N --loadout-fd M``, as a local child).
        ``None``: no server works here, and the caller starts the child itself."""
        server = self._server(python, view is not None, hidden)
        if server is None:
            return None
        try:
            spawn = functools.partial(
                self._spawn,
                server,
                loadout=loadout,
                connection=connection,
                cwd=cwd,
                env=dict(env),
                name=name,
                view=view,
            )
            return self._loop.run(spawn)
        except ForkServerError as exc:
            log.info("%s: starting a fresh interpreter instead: %s", name, exc)
            return None

    def _server(
        self, python: str, sandboxed: bool, hidden: Callable[[], Sequence[str]]
    ) -> ForkServer | None:
        with self._lock:
            if sandboxed in self._servers:
                known = self._servers[sandboxed]
                return None if known is None or known.failure is not None else known
            wrapper: tuple[str, ...] = ()
            if sandboxed:
                # Its view keeps the node's roots of node directories (every child's,
                # writable: scratch and a worker's checkout are bound from there); each fork
                # hides them again but for its own paths.
                made = sandbox.wrap_fork_server(
                    hidden=[Path(h) for h in hidden()],
                    writable=[Path(root) for root in node_roots()],
                    readable=[],
                )
                if made is None:
                    self._servers[sandboxed] = None
                    return None
                wrapper = made
            server = self._loop.run_sync(self._make, python, wrapper)
            self._servers[sandboxed] = server
            return server

    def _make(self, python: str, wrapper: tuple[str, ...]) -> ForkServer:
        kept = {name: os.environ[name] for name in _SERVER_ENV if name in os.environ}
        server = ForkServer(
            python=python,
            label=LABEL,
            env=kept,
            nursery=self._loop.nursery,
            wrapper=wrapper,
            die_with_parent=True,
        )
        server.start()  # on this thread, which lives as long as the host (PR_SET_PDEATHSIG)
        return server

    async def _spawn(
        self,
        server: ForkServer,
        *,
        loadout: int,
        connection: int,
        cwd: str,
        env: dict[str, str],
        name: str,
        view: Mapping[str, Any] | None,
    ) -> ForkedChild:
        read_end, write_end = os.pipe()
        try:
            pid, pidfd = await server.spawn(
                cwd=cwd,
                env=env,
                name=name,
                stdio=(write_end, write_end),
                inherit=(loadout,) if connection < 0 else (connection, loadout),
                view=view,
                dial=connection < 0,
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        child = ForkedChild(pid, os.fdopen(read_end, "rb"))
        self._loop.nursery.start_soon(child._reap, server, pidfd)
        return child
