"""``fleet web``: start the session's web view, or reuse the one that runs, and print a login URL.

The server is Hypercorn's trio worker on ``127.0.0.1`` and a port the kernel picks, in its own
process (``fleet web --foreground``, started in the background like ``fleet serve``). It writes
``web.json`` (0600, in the session's runtime directory beside the control token: pid, port and
the key that signs login tokens), so a later ``fleet web`` finds it and mints a new one-time
login URL without talking to it. ``fleet web --stop`` ends it (SIGTERM: a graceful shutdown,
then cancel).
"""

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import trio

from orchestrator._config import Config
from orchestrator._errors import OperationFailed, Unreachable
from orchestrator.control._daemon_client import ensure_daemon, lock_holder
from orchestrator.web._guard import mint_login

TYPE_CHECKING = False
if TYPE_CHECKING:
    from orchestrator.web._app import WebApp

START_TIMEOUT: Final = 20.0
STOP_TIMEOUT: Final = 10.0
#: Seconds an open stream gets to finish when the server stops.
GRACE: Final = 2.0
#: The server ends once its session has had no supervisor this long (seconds); how often it looks.
ORPHAN_EXIT: Final = 60.0
ORPHAN_CHECK: Final = 5.0


def state_path(config: Config) -> Path:
    """``web.json``: beside the control token, in the session's runtime directory, which no
    sandbox sees (it holds the key that signs login tokens)."""
    return config.paths.runtime / "web.json"


def login_url(port: int, key: bytes) -> str:
    return f"http://127.0.0.1:{port}/login?token={mint_login(key)}"


def _write_state(path: Path, state: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(state, handle)
    temporary.replace(path)


def read_state(config: Config) -> dict[str, Any] | None:
    """The running server's pid, port and key, or ``None`` when none answers."""
    path = state_path(config)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd) as handle:
        st = os.fstat(handle.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None  # not a private file of ours: never trust its key
        try:
            state = json.load(handle)
        except ValueError:
            return None
    if not isinstance(state, dict) or not _answers(state.get("pid"), state.get("port")):
        return None
    return state


def _answers(pid: object, port: object) -> bool:
    if not isinstance(pid, int) or not isinstance(port, int):
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        return True
    return False


async def serve_app(
    app: "WebApp", stopped: trio.Event, *, task_status: "trio.TaskStatus[int]"
) -> None:
    """Serve *app* on 127.0.0.1 until *stopped* is set; ``started`` with the port."""
    from hypercorn.config import Config as HypercornConfig  # noqa: PLC0415 - heavy
    from hypercorn.trio import serve as hypercorn_serve  # noqa: PLC0415

    hyper = HypercornConfig()
    hyper.bind = ["127.0.0.1:0"]
    hyper.graceful_timeout = GRACE
    hyper.accesslog = None
    hyper.errorlog = "-"
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status=trio.TASK_STATUS_IGNORED: hypercorn_serve(
                app.asgi(),  # type: ignore[arg-type]
                hyper,
                shutdown_trigger=stopped.wait,
                task_status=task_status,
            )
        )
        app.guard.port = int(str(binds[0]).rsplit(":", 1)[1])
        task_status.started(app.guard.port)


async def serve(config: Config, announce: Callable[[str], None]) -> None:
    """Serve the web view until SIGTERM or SIGINT, or until the session has had no supervisor
    for :data:`ORPHAN_EXIT` s; *announce* gets the first login URL."""
    from orchestrator.web._app import WebApp  # noqa: PLC0415
    from orchestrator.web._guard import Guard  # noqa: PLC0415
    from orchestrator.web._ops import Client  # noqa: PLC0415

    paths = config.paths
    key = secrets.token_bytes(32)
    app = WebApp(
        guard=Guard(key=key, port=0),  # refuses every Host until the port is known
        client=Client(socket=paths.control_socket, token_path=paths.control_token),
        session_name=config.session,
    )
    stopped = trio.Event()
    state = state_path(config)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_app, app, stopped)
            _write_state(state, {"pid": os.getpid(), "port": port, "key": key.hex()})
            announce(login_url(port, key))
            quit_ = trio.Event()
            try:
                async with trio.open_nursery() as watchers:
                    watchers.start_soon(_on_signal, signals, quit_)
                    watchers.start_soon(_while_supervised, paths.lock, quit_)
                    await quit_.wait()
                    watchers.cancel_scope.cancel()
            finally:
                with contextlib.suppress(OSError, ValueError):
                    if json.loads(state.read_text()).get("pid") == os.getpid():
                        state.unlink()
                stopped.set()
                nursery.cancel_scope.deadline = trio.current_time() + GRACE + 1


async def _on_signal(signals: AsyncIterator[int], quit_: trio.Event) -> None:
    async for _ in signals:
        quit_.set()
        return


async def _while_supervised(lock: Path, quit_: trio.Event) -> None:
    """Set *quit_* once no supervisor has held the session for :data:`ORPHAN_EXIT` s.

    It looks at the session lock, not the control socket: a request would keep an idle
    supervisor from its own idle exit.
    """
    gone_since: float | None = None
    while True:
        await trio.sleep(ORPHAN_CHECK)
        if await trio.to_thread.run_sync(lock_holder, lock) is not None:
            gone_since = None
            continue
        now = trio.current_time()
        gone_since = now if gone_since is None else gone_since
        if now - gone_since >= ORPHAN_EXIT:
            quit_.set()
            return


def run_foreground(config: Config, announce: Callable[[str], None]) -> None:
    """``fleet web --foreground``: the supervisor first (the page is its client), then serve."""
    ensure_daemon(config)
    trio.run(serve, config, announce)


def start_or_reuse(config: Config) -> dict[str, Any]:
    """The session's web view (started when none answers): ``{url, port, pid, started}``.

    The supervisor is started first when none runs: the page is a control client of it.
    """
    ensure_daemon(config)
    state = read_state(config)
    started = state is None
    if state is None:
        state = _start(config)
    port, key = int(state["port"]), bytes.fromhex(str(state["key"]))
    return {"url": login_url(port, key), "port": port, "pid": state["pid"], "started": started}


def _start(config: Config) -> dict[str, Any]:
    paths = config.paths
    log_fd = os.open(
        paths.root / "web.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600
    )
    env = {**os.environ, "FLEET_HOME": str(config.home), "FLEET_SESSION": config.session}
    try:
        process = subprocess.Popen(
            [sys.executable, "-P", "-m", "orchestrator", "web", "--foreground", "--quiet"],
            cwd=config.workspace,
            env=env,
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
        state = read_state(config)
        if state is not None and state.get("pid") == process.pid:
            return state
        if process.poll() is not None:
            raise Unreachable(
                f"the web server exited with code {process.returncode} "
                f"(see {paths.root / 'web.log'})"
            )
        time.sleep(0.05)
    process.terminate()
    raise Unreachable(f"the web server did not start within {START_TIMEOUT:g} s")


def stop(config: Config) -> bool:
    """End the session's web server; whether one ran."""
    state = read_state(config)
    if state is None:
        return False
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return True
        time.sleep(0.05)
    raise OperationFailed(f"the web server (pid {pid}) did not stop within {STOP_TIMEOUT:g} s")
