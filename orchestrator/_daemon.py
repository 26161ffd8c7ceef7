"""``fleet serve``: one supervisor per session behind a control socket, started on demand.

The daemon holds an exclusive ``flock`` on ``supervisor.lock`` for its whole life, so two
commands racing to start one cannot both bind: the loser exits and the winner serves. The
control token is a fresh random secret in a 0600 file, never on argv.
"""

import contextlib
import fcntl
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

import ipc
from orchestrator._config import Config
from orchestrator._control import ControlServer, call_async, read_token
from orchestrator._errors import Refused, Unreachable
from orchestrator._supervisor import open_supervisor

START_TIMEOUT = 20.0


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
        token = secrets.token_hex(32)
        ipc.write_private(paths.control_token, token.encode())
        listener = ipc.Listener(paths.control_socket)
        try:
            async with open_supervisor(config) as sup:
                server = ControlServer(sup=sup, token=token)
                async with trio.open_nursery() as nursery:
                    await nursery.start(listener.serve, server.handle_connection)
                    nursery.start_soon(_on_signals, server.shutdown)
                    task_status.started()
                    await server.shutdown.wait()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await listener.aclose()
            with contextlib.suppress(OSError):
                paths.control_token.unlink()


async def _on_signals(shutdown: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _ in signals:
            shutdown.set()
            return


def _daemon_env(config: Config) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "FLEET_HOME": str(config.home),
            "FLEET_SESSION": config.session,
            "FLEET_MAX_SUBAGENTS": str(config.max_subagents),
            "FLEET_LANE": str(config.lane),
        }
    )
    if config.model:
        env["FLEET_MODEL"] = config.model
    if config.allow_unsandboxed:
        env["FLEET_ALLOW_UNSANDBOXED"] = "1"
    return env


async def _ping(config: Config) -> dict[str, Any] | None:
    paths = config.paths
    if not paths.control_socket.exists():
        return None
    try:
        token = read_token(paths.control_token)
        return await call_async(paths.control_socket, token, "ping", {}, timeout=5.0)
    except Unreachable:
        return None


def ensure_daemon(config: Config) -> str:
    """Start the session's supervisor unless one answers; return the control token."""
    if trio.run(_ping, config) is not None:
        return read_token(config.paths.control_token)
    paths = config.paths
    ipc.ensure_private_dir(config.home)
    ipc.ensure_private_dir(config.home / "sessions")
    ipc.ensure_private_dir(paths.root)
    log_fd = os.open(
        paths.daemon_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600
    )
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "serve", "--foreground"],
            cwd=config.workspace,
            env=_daemon_env(config),
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(log_fd)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if trio.run(_ping, config) is not None:
            return read_token(paths.control_token)
        if process.poll() is not None and trio.run(_ping, config) is None:
            # It may have lost the start race to another daemon that is still binding.
            time.sleep(0.1)
            if trio.run(_ping, config) is not None:
                return read_token(paths.control_token)
            tail = _tail(paths.daemon_log)
            raise Unreachable(f"supervisor exited with code {process.returncode}: {tail}")
        time.sleep(0.05)
    raise Unreachable(
        f"supervisor did not start within {START_TIMEOUT:g} s (see {paths.daemon_log})"
    )


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"
