"""Starting the session's supervisor from a CLI verb, or finding the one that runs.

A verb pings the control socket; when nothing answers it starts ``fleet serve --foreground``
in the background (its own session, its output in the daemon log) and waits for the ping to
answer. The daemon itself is :mod:`orchestrator.control._daemon`.
"""

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from orchestrator._config import Config, SessionPaths
from orchestrator._digests import drift_warning, drifted, start_digests
from orchestrator._errors import Unreachable
from orchestrator.control._client import call, read_token

START_TIMEOUT: Final = 20.0
#: Set by a parent's fleet (``fleet mcp``, the Pi extension) for the supervisor it starts on
#: demand (which inherits it): the seconds that supervisor outlives its last request once it
#: holds nothing (``_daemon.idle_exit_after``). Not a start setting: a parent's supervisor
#: serves the user's commands like any other.
PARENT_EXIT_VARIABLE: Final = "FLEET_PARENT_EXIT_S"
PARENT_EXIT_S: Final = 10.0
#: How long a verb waits for the session's previous supervisor to finish stopping (it stops
#: and reaps its children, copies worktrees back, before it lets go of the session lock).
STOP_TIMEOUT: Final = 90.0


def lock_holder(path: Path) -> str | None:
    """The pid written in the session lock while a supervisor holds it (alive, or still
    stopping its children), else ``None``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 32).decode(errors="replace").strip() or "?"
        return None
    finally:
        os.close(fd)  # and with it our shared lock, at once


#: What a daemon that lost the session lock says (``_daemon.session_lock``).
LOST_LOCK: Final = "another supervisor already runs"


def wait_released(path: Path, timeout: float = STOP_TIMEOUT) -> str | None:
    """Wait until no supervisor holds the session lock; the holder's pid if one still does."""
    deadline = time.monotonic() + timeout
    while (holder := lock_holder(path)) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return holder


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
    print(drift_warning(names, answer.get("pid", "?")), file=sys.stderr)


def ensure_daemon(config: Config) -> str:
    """Start the session's supervisor unless one answers; return the control token.

    A supervisor that answers but started with other settings than this command's is
    reported in one line (:func:`warn_if_drifted`). One that holds the session but does not
    answer is starting (another command's) or stopping (its children first): this waits for
    it to answer or to end, up to :data:`STOP_TIMEOUT`, and then starts a fresh one.
    """
    answer = _ping(config)
    if answer is not None:
        token = read_token(config.paths.control_token)
        warn_if_drifted(config, answer, token)
        return token
    paths = config.paths
    deadline = time.monotonic() + STOP_TIMEOUT
    while True:
        holder = lock_holder(paths.lock)
        if holder is None:
            started = _start(config)
            if started is not None:
                return started
        else:
            answer = _ping(config)
            if answer is not None:
                found = read_token(paths.control_token)
                warn_if_drifted(config, answer, found)
                return found
            _check_same_runtime(paths, holder)
        if time.monotonic() >= deadline:
            if holder is None:
                raise Unreachable(f"no supervisor started (see {paths.daemon_log})")
            raise Unreachable(
                f"the session's supervisor (pid {holder}) neither answers nor ends within "
                f"{STOP_TIMEOUT:g} s (see {paths.daemon_log}; end it with kill {holder})"
            )
        time.sleep(0.1)


def _check_same_runtime(paths: SessionPaths, holder: str) -> None:
    """Raise :class:`Unreachable` when the session's supervisor serves from another runtime
    directory than this command looks in (it was started with another ``XDG_RUNTIME_DIR``)."""
    try:
        served = paths.runtime_note.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return  # starting, or stopped: the caller waits
    if served and served != str(paths.runtime):
        raise Unreachable(
            f"the session's supervisor (pid {holder}) serves its control socket in {served}, "
            f"not in {paths.runtime}: run fleet with the XDG_RUNTIME_DIR it was started with"
        )


def _start(config: Config) -> str | None:
    """Start a supervisor and wait for it to answer: its token, or ``None`` when it lost the
    session to another supervisor (one starting or stopping) and the caller should wait."""
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
            [sys.executable, "-P", "-m", "orchestrator", "serve", "--foreground"],
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
        if process.poll() is not None:
            tail = _tail(paths.daemon_log)
            if LOST_LOCK in tail:
                return None  # another supervisor holds the session: wait for it
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
