"""Starting the session's supervisor from a CLI verb, or finding the one that runs.

A verb pings the control socket; when nothing answers it starts ``fleet serve --foreground``
in the background (its own session, its output in the daemon log) and waits for the ping to
answer. The daemon itself is :mod:`orchestrator.control._daemon`.
"""

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from orchestrator._config import Config
from orchestrator._errors import Unreachable
from orchestrator.control._client import call, read_token

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


def _ping(config: Config) -> dict[str, Any] | None:
    paths = config.paths
    if not paths.control_socket.exists():
        return None
    try:
        token = read_token(paths.control_token)
        return call(paths.control_socket, token, "ping", {}, timeout=5.0)
    except Unreachable:
        return None


def ensure_daemon(config: Config) -> str:
    """Start the session's supervisor unless one answers; return the control token."""
    if _ping(config) is not None:
        return read_token(config.paths.control_token)
    import ipc  # noqa: PLC0415 - only a start pays for it

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
        answer = _ping(config)
        if answer is not None:
            # This command started the supervisor: it shows what the start found, once.
            for warning in answer.get("warnings", []):
                print(f"fleet: warning: {warning}", file=sys.stderr)
            return read_token(paths.control_token)
        if process.poll() is not None and _ping(config) is None:
            # It may have lost the start race to another daemon that is still binding.
            time.sleep(0.1)
            if _ping(config) is not None:
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
