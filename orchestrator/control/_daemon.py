"""``fleet serve``: one supervisor per session behind a control socket, started on demand.

The daemon holds an exclusive ``flock`` on ``supervisor.lock`` for its whole life, so two
commands racing to start one cannot both bind: the loser exits and the winner serves. The
control token is a fresh random secret in a 0600 file, never on argv; it and the control
socket live in the session's runtime directory (:mod:`orchestrator._runtime`), out of every
sandbox's view.

The session journal (:mod:`orchestrator.control._durable`) is the daemon's only record of the
fleet: a daemon that starts reads what a previous one left from it alone
(:mod:`orchestrator.control._stale`) — it warns once (the first command prints the warning),
lists the lost children in ``peek``, keeps their logs and worktrees, continues the key
numbering after theirs, and adopts each kept worktree so ``fleet stop`` can copy it back. A
clean stop ends the journal with a ``shutdown`` record; a daemon that died has none.
"""

import contextlib
import fcntl
import logging
import math
import os
import secrets
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path

import trio

import ipc
from orchestrator._config import Config
from orchestrator._errors import Refused
from orchestrator._runtime import ensure_session_runtime, remove_session_runtime
from orchestrator.control._daemon_client import PARENT_EXIT_VARIABLE
from orchestrator.control._durable import Durability, close_durability, open_durability
from orchestrator.control._land import land_queued
from orchestrator.control._server import ControlServer
from orchestrator.core._supervisor import open_supervisor

log = logging.getLogger(__name__)


@contextlib.contextmanager
def session_lock(path: Path) -> Iterator[None]:
    """Hold the session's supervisor lock, or raise :class:`Refused`."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Refused(
                f"serve: another supervisor already runs for {path.parent.name}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


async def serve(
    config: Config, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run the supervisor and its control socket until ``shutdown`` or SIGTERM/SIGINT."""
    paths = config.paths
    ipc.ensure_private_dir(config.home)
    ipc.ensure_private_dir(config.home / "sessions")
    ipc.ensure_private_dir(paths.root)
    with session_lock(paths.lock):
        ensure_session_runtime(paths.runtime)
        ipc.write_private(paths.runtime_note, os.fsencode(paths.runtime))
        token = secrets.token_hex(32)
        ipc.write_private(paths.control_token, token.encode())
        listener = ipc.Listener(paths.control_socket)
        durability: Durability | None = None
        clean = False
        try:
            async with open_supervisor(config, locked=True) as sup:
                sup.secrets.add(token)
                server = ControlServer(sup=sup, token=token)
                async with trio.open_nursery() as nursery:
                    durability = open_durability(sup, nursery)
                    server.extra_ops.update(durability.ops())
                    await nursery.start(listener.serve, server.handle_connection)
                    nursery.start_soon(_on_signals, server.shutdown)
                    if config.integration_auto and config.integration_gate.strip():
                        nursery.start_soon(land_queued, sup)
                    idle_s = idle_exit_after(config.idle_exit_s, os.environ)
                    if idle_s > 0:
                        nursery.start_soon(exit_when_idle, server, idle_s)
                    task_status.started()
                    await server.shutdown.wait()
                    nursery.cancel_scope.cancel()
            clean = True  # every child is stopped, every handoff journaled
        finally:
            if durability is not None:
                close_durability(durability, clean=clean)
            with trio.CancelScope(shield=True):
                await listener.aclose()
            with contextlib.suppress(OSError):
                paths.control_token.unlink()
            remove_session_runtime(paths.runtime)
            with contextlib.suppress(OSError):
                paths.runtime_note.unlink()


def idle_exit_after(idle_exit_s: float, environ: Mapping[str, str]) -> float:
    """Seconds of holding nothing and serving nothing after which the supervisor exits (0:
    never). A supervisor started for a parent uses the parent's short grace: the parent polls
    it while it runs, so once the parent is gone and no child is left, nobody needs it; the
    next command starts one again. ``idle_exit_s`` 0 (never) stays never."""
    raw = environ.get(PARENT_EXIT_VARIABLE, "")
    if idle_exit_s <= 0 or not raw:
        return idle_exit_s
    try:
        grace = float(raw)
    except ValueError:
        return idle_exit_s
    if not math.isfinite(grace) or grace <= 0:
        return idle_exit_s
    return min(idle_exit_s, grace)


async def exit_when_idle(server: ControlServer, idle_s: float) -> None:
    """Shut down once the supervisor has held nothing and served nothing for *idle_s*.

    A supervisor with live or retained children (idle ones too), an unread note, an open
    question or an unresolved worktree stays; so does one that is serving a request.
    """
    sup = server.sup
    quiet_since = trio.current_time()
    while True:
        await trio.sleep(min(max(idle_s / 4, 0.05), 5.0))
        now = trio.current_time()
        if server.serving or not sup.holds_nothing():
            quiet_since = now
            continue
        since = max(quiet_since, server.last_request)
        if now - since >= idle_s:
            log.warning("no child and no request for %g s: the supervisor exits", idle_s)
            server.shutdown.set()
            return


async def _on_signals(shutdown: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _ in signals:
            shutdown.set()
            return
