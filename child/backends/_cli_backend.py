"""The half every agent-CLI backend (Pi, Claude Code, Codex) shares around its protocol.

- :class:`CliProcess`: the running CLI — JSONL in and out, its stderr tail for errors, and a kill
  that takes its whole process tree (tool processes and our MCP server included).
- :class:`StallWatch`: our own stall watchdog. None of the CLIs reliably times out a model stream
  that stops mid-way, so a backend arms it while it waits on the model and stops the turn when
  no output arrived for ``seconds``.
- :class:`CliTurn`: how one turn is ending (text, the first error, aborted); a tool whose
  sandbox could not start fails it (:func:`sandbox_failure`).
- :class:`CliBackend`: the turn skeleton — start the CLI once, then per turn serve the tool
  relay, pump the CLI's records, guard against stalls, and stop the turn on ``abort``. A backend
  supplies ``_start``, ``_pump``, ``_begin`` and ``_stop_turn``.
"""

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import psutil
import trio

import ipc
from child.backends._base import RESTARTED, Host, TurnResult
from child.backends._cli_env import CliError, PrivateDirs
from child.backends._jsonl import RecordReader, encode
from child.backends._mcp import ToolRelay

log = logging.getLogger("child")

KILL_GRACE: Final = 2.0
STDERR_TAIL: Final = 8192
_SANDBOX_FAILURE: Final = re.compile(r"^\s*(?:bwrap|sandbox-exec): .+$", re.MULTILINE)


@attrs.define(eq=False)
class CliProcess:
    """A running agent CLI speaking JSONL on its stdin/stdout.

    It stays in our process group, so the supervisor's kill of the child's group takes it too
    even if this child dies first. Its stderr goes to a file in the private directory (a pipe
    nobody reads between turns could fill and block it); :meth:`stderr_line` reads the tail.
    """

    backend: str
    process: trio.Process
    stderr_path: Path
    reader: RecordReader
    _send_lock: trio.Lock = attrs.Factory(trio.Lock)

    @classmethod
    async def start(
        cls,
        backend: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        stderr_path: Path,
        stdin: bool = True,
    ) -> "CliProcess":
        try:
            with stderr_path.open("ab") as stderr:
                process = await trio.lowlevel.open_process(
                    list(argv),
                    env=dict(env),
                    cwd=cwd,
                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                )
        except OSError as exc:
            raise CliError(
                f"backend {backend}: cannot start {argv[0]}: {exc.strerror} (check the path)",
                backend=backend,
                binary=argv[0],
            ) from None
        assert process.stdout is not None  # noqa: S101 - started with a stdout pipe
        return cls(
            backend=backend,
            process=process,
            stderr_path=stderr_path,
            reader=RecordReader(process.stdout),
        )

    async def send(self, message: dict[str, Any]) -> None:
        """Write one JSONL record (``BrokenResourceError`` once the CLI has gone)."""
        stdin = self.process.stdin
        if stdin is None:
            raise trio.ClosedResourceError(f"{self.backend}: the CLI has no stdin")
        async with self._send_lock:
            await stdin.send_all(encode(message))

    async def close_stdin(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.process.stdin.aclose()

    def stderr_line(self) -> str:
        """The last non-empty stderr line, clipped: evidence for a one-line error."""
        try:
            with self.stderr_path.open("rb") as handle:
                handle.seek(max(0, handle.seek(0, os.SEEK_END) - STDERR_TAIL))
                tail = handle.read()
        except OSError:
            return ""
        lines = [line.strip() for line in tail.decode(errors="replace").splitlines()]
        lines = [line for line in lines if line]
        return lines[-1][:200] if lines else ""

    async def terminate(self, grace: float = KILL_GRACE) -> int:
        """SIGTERM the CLI and every descendant (snapshotted first), then SIGKILL survivors."""
        with trio.CancelScope(shield=True):
            try:
                tree = psutil.Process(self.process.pid).children(recursive=True)
            except psutil.Error:
                tree = []
            if self.process.returncode is None:
                self.process.send_signal(signal.SIGTERM)
            _signal_all(tree, signal.SIGTERM)
            with trio.move_on_after(grace):
                await self.process.wait()
                await _gone(tree)
            if self.process.returncode is None:
                self.process.kill()
            _signal_all(_alive(tree), signal.SIGKILL)
            await self.process.wait()
            with trio.move_on_after(1.0):  # the kernel finishes the kills; orphans go to init
                await _gone(tree)
            await self.close_stdin()
            if self.process.stdout is not None:
                await trio.aclose_forcefully(self.process.stdout)
        return self.process.returncode if self.process.returncode is not None else -1


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of *processes* still running (a zombie has finished)."""
    running = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
    return running


async def _gone(processes: list[psutil.Process]) -> None:
    while _alive(processes):  # noqa: ASYNC110 - no event exists for a non-child's exit
        await trio.sleep(0.02)


def _signal_all(processes: list[psutil.Process], sig: int) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)


@attrs.define(eq=False)
class StallWatch:
    """Fires when armed and nothing was heard for ``seconds``.

    A backend arms it while it waits on the model, touches it on every record, and disarms it
    while a tool runs (a long build is not a stalled stream; the supervisor's idle budget covers
    that).
    """

    seconds: float
    armed: bool = False
    _last: float = 0.0
    _rearmed: trio.Event = attrs.Factory(trio.Event)

    def arm(self) -> None:
        self.armed = True
        self._last = trio.current_time()
        self._rearmed.set()

    def disarm(self) -> None:
        self.armed = False

    def touch(self) -> None:
        self._last = trio.current_time()

    async def wait_stalled(self) -> None:
        """Return once armed with no :meth:`touch` for ``seconds``."""
        while True:
            if not self.armed:
                self._rearmed = trio.Event()
                await self._rearmed.wait()
                continue
            deadline = self._last + self.seconds
            if trio.current_time() >= deadline:
                return
            await trio.sleep_until(deadline)


_PREVIEW: Final = 80


def side_question(text: str) -> str:
    """A parent's "by the way" question, as the prompt an agent CLI gets."""
    return f"By the way (a side question; answer it briefly and do not resume your task): {text}"


def preview(value: object) -> str:
    """A tool call's arguments as one short line for ``peek``."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    text = " ".join(text.split())
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


def output_text(value: object) -> str:
    """Every string in a tool result (a string, or the lists and dicts a CLI nests it in)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "\n".join(output_text(v) for v in value.values())
    if isinstance(value, list):
        return "\n".join(output_text(v) for v in value)
    return ""


def sandbox_failure(output: object) -> str:
    """The line of a failed tool's output saying a sandbox could not start in ours, or ``""``.

    Seen when a CLI nests its own sandbox in fleet's (``bwrap: setting up uid map: Operation
    not permitted``): the command never ran, so a report built on it would be fiction."""
    match = _SANDBOX_FAILURE.search(output_text(output))
    return match.group(0).strip()[:200] if match else ""


@attrs.define(eq=False)
class CliTurn:
    """How one turn of a CLI backend is ending; the first failure recorded is the one kept."""

    done: trio.Event = attrs.Factory(trio.Event)
    text: str = ""
    error: str = ""
    aborted: bool = False
    abort_requested: bool = False

    def fail(self, error: str) -> None:
        """Record why the turn failed; it still settles only through :meth:`finish`, so the
        CLI is quiet before the next turn starts."""
        if not self.error:
            self.error = error

    def tool_failed(self, backend: str, tool: str, output: object) -> None:
        """A tool call ended in error: the turn fails when the tool could not run at all."""
        line = sandbox_failure(output)
        if line:
            self.fail(f"{backend}: {tool} could not run inside fleet's sandbox: {line}")

    def finish(self, *, aborted: bool = False) -> None:
        self.aborted = self.aborted or aborted
        self.done.set()

    def stopping(self) -> bool:
        """Whether an abort was asked for (a call, so a check after an await is not narrowed)."""
        return self.abort_requested

    def result(self) -> TurnResult:
        if self.error:
            return TurnResult(text=self.text, ok=False, error=self.error)
        if self.aborted or self.abort_requested:
            return TurnResult(text=self.text, aborted=True)
        return TurnResult(text=self.text)


@attrs.define(eq=False)
class CliBackend:
    """The shared turn skeleton of the agent-CLI backends (one CLI process for the child's life).

    Subclasses implement :meth:`_start` (start the CLI once; later calls return it),
    :meth:`_pump` (read and dispatch records until EOF, then fail the turn), :meth:`_begin`
    (send the turn's prompt) and :meth:`_stop_turn` (abort or interrupt; kill if it hangs).
    """

    loadout: ipc.Loadout
    host: Host
    binary: str
    stall: float
    name: str = "cli"
    _dirs: PrivateDirs | None = None
    _cli: CliProcess | None = None
    _relay: ToolRelay | None = None
    _turn: CliTurn | None = None
    _nursery: trio.Nursery | None = None
    _watch: StallWatch = attrs.field(init=False)
    #: Whether the private directories outlive the child (a resumable CLI's session store).
    keep_dirs: bool = False
    #: A revived child's first prompt says so once (``restarted`` in its loadout).
    _restarted: bool = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._watch = StallWatch(self.stall)
        self._restarted = self.loadout.restarted

    async def _start(self) -> CliProcess:
        raise NotImplementedError

    async def _pump(self, cli: CliProcess, scope: trio.CancelScope) -> None:
        raise NotImplementedError

    async def _begin(self, turn: CliTurn, message: str) -> None:
        raise NotImplementedError

    async def _stop_turn(self) -> None:
        raise NotImplementedError

    def _after_turn(self) -> None:
        """Tidy up once a turn settled (Codex kills the commands an interrupt left running)."""

    def _gone(self) -> CliError:
        code = self._cli.process.returncode if self._cli is not None else None
        return CliError(
            f"backend {self.name}: the {self.name} process exited ({code}) and its context is "
            "gone (stop this child and spawn a new one)",
            backend=self.name,
            binary=self.binary,
        )

    async def run_turn(self, text: str, *, side: bool = False) -> TurnResult:
        if self._restarted:
            text, self._restarted = f"{RESTARTED}\n{text}", False
        turn = self._turn = CliTurn()
        booting = self._cli is None
        if booting:
            # The version probe and the CLI's boot take seconds (Pi: ~6 s): say so in peek.
            self.host.emit(ipc.Event(activity="status", text=f"starting {self.name}"))
        try:
            cli = await self._start()
        except CliError as exc:
            self._turn = None
            return TurnResult(text="", ok=False, error=str(exc))
        if booting:
            self.host.emit(ipc.Event(activity="status", text="started"))
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._relay is not None:
                    await nursery.start(self._relay.serve)
                nursery.start_soon(self._pump, cli, nursery.cancel_scope)
                nursery.start_soon(self._guard, turn)
                if not turn.abort_requested:
                    await self._begin(turn, side_question(text) if side else text)
                    await turn.done.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._watch.disarm()
            self._nursery = None
            self._turn = None
            self._after_turn()
        return turn.result()

    async def _guard(self, turn: CliTurn) -> None:
        await self._watch.wait_stalled()
        turn.fail(
            f"{self.name}: no output for {self.stall:g} s while waiting on the model (stalled "
            "stream); the turn was stopped (check the endpoint, or raise FLEET_STALL_TIMEOUT)"
        )
        turn.abort_requested = True
        await self._stop_turn()

    async def abort(self) -> None:
        turn = self._turn
        if turn is None:
            return
        turn.abort_requested = True
        if self._nursery is not None:
            self._nursery.start_soon(self._stop_turn)

    async def aclose(self) -> None:
        if self._cli is not None:
            # Nothing to save (no session persistence): SIGTERM the tree, MCP server included.
            await self._cli.terminate()
        if self._dirs is not None and not (self.loadout.resume or self.keep_dirs):
            self._dirs.remove()  # a resumable CLI's session store stays for a revive
