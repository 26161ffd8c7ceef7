"""The cmux launcher: each child runs in a cmux terminal surface (cmux is macOS-only).

cmux is driven over its Unix socket (``$CMUX_SOCKET_PATH``, default ``/tmp/cmux.sock``): one
JSON line ``{"id", "method", "params"}`` per connection, answered by ``{"id", "ok", "result"}`` or
``{"id", "ok": false, "error": {"code", "message"}}``. Every command has a 1 s deadline. A launch
pings, splits a new surface off the caller's (``$CMUX_SURFACE_ID`` when set), and types the child's
command line into it — ``FLEET_CHILD=1 <python> -I -m child <loadout>`` followed by an exit-status
marker. That line holds no secret: the token stays in the 0600 loadout, and text sent to a
surface lands in its scrollback.

Every failure is a :class:`CmuxError` whose ``failure`` is one of four classes, shown to the
parent once with the run's diagnostics::

    binary-missing            the cmux CLI is not on PATH: cmux is not installed here
    socket-unreachable        nothing answers at the socket, or it does not speak cmux's protocol
    auth-rejected             cmux refused us: "ERROR: Access denied — only processes started
                              inside cmux can connect", the same refusal seen as a broken pipe or a
                              close before any answer, or a password-mode auth error
    surface-creation-failed   the split failed or timed out, or the child never started in it

The child is found by its exact argv among this user's processes and watched like a tmux pane's
(:class:`ForeignProcess`). On a terminal state its surface's text goes to the output sink and
the surface is closed (kept, when asked, for a child that failed on its own).
"""

import contextlib
import itertools
import json
import re
import shlex
import shutil
import signal
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, NoReturn

import attrs
import psutil
import trio

import sandbox
from orchestrator._errors import OperationFailed
from orchestrator.launch._foreign import ForeignProcess, kill_foreign
from orchestrator.launch._launcher import LaunchSpec, OutputSink
from orchestrator.launch._tmux import SCREEN_CAP

CmuxFailure = Literal[
    "binary-missing", "socket-unreachable", "auth-rejected", "surface-creation-failed"
]

COMMAND_TIMEOUT: Final = 1.0
START_TIMEOUT: Final = 10.0
DEFAULT_SOCKET: Final = "/tmp/cmux.sock"  # noqa: S108 - cmux's documented default
MAX_LINE: Final = 1 << 20
_AUTH_CODES: Final = frozenset({"auth_required", "auth_failed", "unauthorized", "forbidden"})
_EXIT_MARK: Final = "[fleet: child exited "
_EXIT_RE: Final = re.compile(re.escape(_EXIT_MARK) + r"(\d+)\]")
_PID_MARK: Final = "[fleet: child pid "
_PID_RE: Final = re.compile(re.escape(_PID_MARK) + r"(\d+)\]")
_HINTS: Final[Mapping[str, str]] = {
    "binary-missing": "install cmux, or spawn with --surface tmux",
    "socket-unreachable": "start cmux, or point CMUX_SOCKET_PATH at its socket",
    "auth-rejected": (
        "run the fleet supervisor from a cmux terminal, or allow automation in cmux's socket "
        "settings"
    ),
    "surface-creation-failed": "look at the cmux window, or spawn with --surface tmux",
}


class CmuxError(OperationFailed):
    """A classified cmux failure; ``failure``, ``socket``, ``method``, ``detail`` are evidence."""

    def __init__(self, failure: CmuxFailure, detail: str, *, socket: str, method: str = "") -> None:
        super().__init__(f"cmux {failure}: {detail} ({_HINTS[failure]})")
        self.failure: CmuxFailure = failure
        self.detail = detail
        self.socket = socket
        self.method = method


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


@attrs.define(eq=False)
class CmuxClient:
    """One request per connection, as the cmux CLI does; see the module docstring."""

    socket: str
    timeout: float = COMMAND_TIMEOUT
    _ids: "itertools.count[int]" = attrs.Factory(lambda: itertools.count(1))

    async def call(
        self, method: str, params: Mapping[str, Any], *, on_error: CmuxFailure
    ) -> dict[str, Any]:
        """The ``result`` of *method*; errors are classified, *on_error* for cmux's own refusals."""
        request_id = str(next(self._ids))
        line = json.dumps({"id": request_id, "method": method, "params": dict(params)})
        try:
            with trio.fail_after(self.timeout):
                stream = await trio.open_unix_socket(self.socket)
        except trio.TooSlowError:
            self._fail("socket-unreachable", f"connecting to {self.socket} timed out", method)
        except OSError as exc:
            self._fail(
                "socket-unreachable", f"connect {self.socket}: {exc.strerror or exc}", method
            )
        broken = False
        try:
            with trio.fail_after(self.timeout):
                async with stream:
                    try:
                        await stream.send_all(line.encode() + b"\n")
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        # cmux refuses outsiders by writing one line and closing; our write can
                        # lose that race, but the line may still be there to read.
                        broken = True
                    reply = await _read_line(stream)
        except trio.TooSlowError:
            self._fail(on_error, f"{method} got no answer within {self.timeout:g} s", method)
        if not reply.strip():
            how = "(broken pipe)" if broken else "without answering"
            self._fail(
                "auth-rejected",
                f"cmux closed the connection during {method} {how}: it admits only processes "
                "started inside cmux",
                method,
            )
        return self._result(method, request_id, reply, on_error)

    def _result(
        self, method: str, request_id: str, reply: bytes, on_error: CmuxFailure
    ) -> dict[str, Any]:
        text = reply.decode(errors="replace").strip()
        if text.startswith("ERROR"):
            self._fail("auth-rejected", _one_line(text), method)
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or "ok" not in answer:
            self._fail(
                "socket-unreachable",
                f"the socket answered {method} with {_one_line(text, 80)!r}, not cmux's protocol",
                method,
            )
        if answer.get("id") != request_id:
            self._fail("socket-unreachable", f"{method} was answered for another request", method)
        if not answer["ok"]:
            error = answer.get("error")
            error = error if isinstance(error, dict) else {"message": str(error)}
            code = str(error.get("code", ""))
            message = _one_line(f"{code}: {error.get('message', '')}".strip(": "))
            self._fail("auth-rejected" if code in _AUTH_CODES else on_error, message, method)
        result = answer.get("result")
        return result if isinstance(result, dict) else {}

    def _fail(self, failure: CmuxFailure, detail: str, method: str) -> NoReturn:
        raise CmuxError(failure, detail, socket=self.socket, method=method)


async def _read_line(stream: trio.SocketStream) -> bytes:
    buffer = bytearray()
    while b"\n" not in buffer:
        try:
            chunk = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            break  # a reset: whatever arrived before it is the answer
        if not chunk:
            break
        buffer += chunk
        if len(buffer) > MAX_LINE:
            break
    return bytes(buffer.split(b"\n", 1)[0])


def command_line(argv: Sequence[str]) -> str:
    """The line typed into the surface.

    A tiny ``sh`` prints its own pid and then execs the child, so the pid on the screen is the
    child's and its argv is exactly *argv*; the shell then prints the exit status.
    """
    announce = shlex.quote(f'echo "{_PID_MARK}$$]"; exec "$@"')
    child = shlex.join(argv)
    return f'FLEET_CHILD=1 sh -c {announce} fleet-child {child}; echo "{_EXIT_MARK}$?]"'


def _marker(pattern: re.Pattern[str], screen: str) -> int | None:
    found = pattern.findall(screen)
    return int(found[-1]) if found else None


def exit_status(screen: str) -> int | None:
    """The child's exit status from the marker on *screen* (128+N means signal N)."""
    status = _marker(_EXIT_RE, screen)
    if status is None:
        return None
    return -(status - 128) if status > 128 else status


def child_pid(screen: str) -> int | None:
    """The child's pid, as announced on *screen*."""
    return _marker(_PID_RE, screen)


@attrs.define(eq=False)
class CmuxSurface:
    """A child running in a cmux surface, as its launcher sees it."""

    client: CmuxClient
    surface_id: str
    pid: int
    sink: OutputSink
    keep_failed: bool
    exited: trio.Event = attrs.Factory(trio.Event)
    returncode: int | None = None
    closed: bool = False
    _process: ForeignProcess = attrs.field(init=False)
    _finished: bool = False

    def __attrs_post_init__(self) -> None:
        self._process = ForeignProcess(self.pid)

    async def watch(self) -> None:
        try:
            await self._process.wait()
            self.returncode = await self._exit_status()
        finally:
            if self.returncode is None:
                self.returncode = -signal.SIGHUP
            self.exited.set()

    async def _exit_status(self) -> int:
        # The shell prints the marker a moment after the child exits.
        for _ in range(10):
            try:
                screen = await self.read_screen()
            except CmuxError:
                self.closed = True  # the surface is gone: closing it hung the child up
                return -signal.SIGHUP
            status = exit_status(screen)
            if status is not None:
                return status
            await trio.sleep(0.1)
        self.sink("pane", b"[fleet] the child's exit status did not appear in its cmux surface\n")
        return 1

    async def read_screen(self) -> str:
        return await self.read(self.client, self.surface_id)

    @staticmethod
    async def read(client: CmuxClient, surface_id: str) -> str:
        """The text a surface shows."""
        result = await client.call(
            "surface.read_text", {"surface_id": surface_id}, on_error="socket-unreachable"
        )
        return str(result.get("text", ""))

    async def wait(self) -> int:
        await self.exited.wait()
        assert self.returncode is not None  # noqa: S101 - set before exited
        return self.returncode

    async def terminate(self, grace: float) -> None:
        """Keep the surface's text, kill the child's tree, close the surface."""
        if self._finished:
            return
        self._finished = True
        died_alone = self.exited.is_set()
        try:
            screen = await self.read_screen()
        except CmuxError as exc:
            screen = f"[fleet] cmux surface {self.surface_id} could not be read: {exc.detail}"
        self.sink("pane", (screen.rstrip() + "\n").encode()[-SCREEN_CAP:])
        if not self.exited.is_set():
            await kill_foreign(self.pid, exited=self.exited, grace=grace)
        if self.closed or (died_alone and self.returncode != 0 and self.keep_failed):
            return
        with contextlib.suppress(CmuxError):
            await close_surface(self.client, self.surface_id)
        self.closed = True

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109 - the Launched protocol
        """Nothing to drain: a surface's output is never piped to us."""
        await trio.lowlevel.checkpoint()

    def describe(self) -> str:
        return f"cmux surface {self.surface_id} pid {self.pid} on {self.client.socket}"


async def close_surface(client: CmuxClient, surface_id: str) -> None:
    await client.call("surface.close", {"surface_id": surface_id}, on_error="socket-unreachable")


@attrs.define(eq=False)
class CmuxLauncher:
    """Start each child in a new cmux surface; see the module docstring."""

    socket: str
    binary: str = "cmux"
    caller_surface: str = ""
    keep_failed: bool = False
    start_timeout: float = START_TIMEOUT
    name: str = "cmux"

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str], *, keep_failed: bool = False
    ) -> "CmuxLauncher":
        return cls(
            socket=environ.get("CMUX_SOCKET_PATH") or DEFAULT_SOCKET,
            caller_surface=environ.get("CMUX_SURFACE_ID", ""),
            keep_failed=keep_failed,
        )

    async def launch(
        self, spec: LaunchSpec, sink: OutputSink, nursery: trio.Nursery
    ) -> CmuxSurface:
        if shutil.which(self.binary) is None:
            raise CmuxError("binary-missing", f"{self.binary!r} is not on PATH", socket=self.socket)
        client = CmuxClient(self.socket)
        await client.call("system.ping", {}, on_error="socket-unreachable")
        params = {"direction": "right"}
        if self.caller_surface:
            params["surface_id"] = self.caller_surface
        result = await client.call("surface.split", params, on_error="surface-creation-failed")
        surface_id = result.get("surface_id")
        if not isinstance(surface_id, str) or not surface_id:
            raise CmuxError(
                "surface-creation-failed",
                f"surface.split answered without a surface_id ({_one_line(json.dumps(result))})",
                socket=self.socket,
                method="surface.split",
            )
        try:
            pid = await self._start(client, surface_id, spec)
        except BaseException:
            # Keep what the surface shows (a shell error, say) as evidence, then close it.
            with trio.CancelScope(shield=True), contextlib.suppress(CmuxError):
                screen = await CmuxSurface.read(client, surface_id)
                sink("pane", (screen.rstrip() + "\n").encode()[-SCREEN_CAP:])
                await close_surface(client, surface_id)
            raise
        surface = CmuxSurface(
            client=client, surface_id=surface_id, pid=pid, sink=sink, keep_failed=self.keep_failed
        )
        nursery.start_soon(surface.watch)
        return surface

    async def _start(self, client: CmuxClient, surface_id: str, spec: LaunchSpec) -> int:
        await client.call(
            "surface.send_text",
            {"surface_id": surface_id, "text": command_line(spec.argv) + "\n"},
            on_error="surface-creation-failed",
        )
        with trio.move_on_after(self.start_timeout):
            while True:
                pid = child_pid(await CmuxSurface.read(client, surface_id))
                if pid is not None and _checked(pid, spec.argv, surface_id, self.socket):
                    return pid
                await trio.sleep(0.05)
        raise CmuxError(
            "surface-creation-failed",
            f"the child did not start in surface {surface_id} within {self.start_timeout:g} s",
            socket=self.socket,
            method="surface.send_text",
        )


def _checked(pid: int, argv: Sequence[str], surface_id: str, socket: str) -> int | None:
    """*pid* once it runs the child; ``None`` while it is still the announcing ``sh``."""
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return pid  # it has already exited; the screen will say how
    # A zombie's command line reads as empty; a sandboxed child's shell execs bwrap.
    if not cmdline or cmdline in (list(argv), list(sandbox.exec_argv(argv))):
        return pid
    if "fleet-child" in cmdline:
        return None  # announced, not yet exec'd
    raise CmuxError(
        "surface-creation-failed",
        f"pid {pid} announced in surface {surface_id} runs {shlex.join(cmdline)!r}, not the child",
        socket=socket,
        method="surface.read_text",
    )
