"""Starting the session's supervisor from a CLI verb, or finding the one that runs.

A verb pings the control socket; when nothing answers it starts ``fleet serve --foreground``
in the background (its own session, its output in the daemon log) and waits for the ping to
answer. The daemon itself is :mod:`orchestrator.control._daemon`.
"""

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import trio

import ipc
from orchestrator._config import Config, drifted, start_digests
from orchestrator._errors import Unreachable
from orchestrator.control._client import call_async, read_token

START_TIMEOUT: Final = 20.0


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
    if config.agent_dirs:
        env["FLEET_AGENT_DIRS"] = ",".join(config.agent_dirs)
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


_warned: set[str] = set()


def warn_if_drifted(config: Config, answer: Mapping[str, Any], token: str) -> None:
    """One stderr line when the running supervisor started with other settings than this
    command's: it keeps its own for every child it spawns until it is restarted."""
    names = [
        name
        for name in drifted(start_digests(config, os.environ, token), answer.get("settings", {}))
        if name not in _warned
    ]
    if not names:
        return
    _warned.update(names)
    pid = answer.get("pid", "?")
    print(
        f"fleet: warning: the running supervisor (pid {pid}) started with another "
        f"{', '.join(names)} than this command's and keeps its own for every child it spawns "
        "(restart it: fleet serve --stop stops it and its children; the next command starts "
        "one with yours)",
        file=sys.stderr,
    )


def ensure_daemon(config: Config) -> str:
    """Start the session's supervisor unless one answers; return the control token.

    A supervisor that answers but started with other settings than this command's is
    reported in one line (:func:`warn_if_drifted`)."""
    answer = trio.run(_ping, config)
    if answer is not None:
        token = read_token(config.paths.control_token)
        warn_if_drifted(config, answer, token)
        return token
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
        answer = trio.run(_ping, config)
        if answer is not None:
            # This command started the supervisor: it shows what the start found, once.
            for warning in answer.get("warnings", []):
                print(f"fleet: warning: {warning}", file=sys.stderr)
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
