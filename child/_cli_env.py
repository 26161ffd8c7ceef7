"""What every agent-CLI backend (Pi, Claude Code, Codex) needs before and around its protocol.

- :class:`PrivateDirs`: a private ``HOME``, ``TMPDIR`` and config directory per child, under the
  loadout's ``scratch`` directory (or a temp directory), removed on close. The CLIs write
  settings, caches and session files there, never into the user's real home.
- :func:`cli_environment`: the CLI's environment, built from scratch — the locale, ``PATH`` and a
  few harmless variables, plus only the secrets whose *names* the agent definition lists. Proxy
  variables are never passed (the CLIs must talk to their endpoint directly).
- :func:`probe_version`: ``<binary> --version``; a missing or too-old CLI is one-line
  :class:`CliError` that says what to install.
- :class:`CliProcess`: the running CLI — JSONL in and out, its stderr tail for errors, and
  a kill that takes its whole process tree (tool processes included).
- :class:`StallWatch`: our own stall watchdog. None of the CLIs reliably times out a model stream
  that stops mid-way, so a backend arms this while it waits on the model and aborts the turn when
  no output arrived for ``seconds``.
"""

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import psutil
import trio

from child._backend import TurnResult
from child._jsonl import RecordReader, encode

log = logging.getLogger("child")

#: Seconds without any CLI output, while the model is being waited on, before a turn is failed.
DEFAULT_STALL_SECONDS: Final = 180.0
STALL_ENV: Final = "FLEET_STALL_TIMEOUT"
KILL_GRACE: Final = 2.0
PROBE_TIMEOUT: Final = 30.0
STDERR_TAIL: Final = 8192
#: Variables copied from our environment: enough to run node and a shell, nothing secret.
_BASE_NAMES: Final = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL")
_PROXY_NAMES: Final = frozenset({"http_proxy", "https_proxy", "all_proxy", "no_proxy", "ftp_proxy"})
_VERSION: Final = re.compile(r"(\d+)\.(\d+)\.(\d+)")


class CliError(Exception):
    """An agent CLI cannot be used; the message is one line with the fix."""

    def __init__(self, message: str, *, backend: str, binary: str) -> None:
        super().__init__(message)
        self.backend = backend
        self.binary = binary


@attrs.frozen(order=True)
class Version:
    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> "Version | None":
        match = _VERSION.search(text)
        return cls(*map(int, match.groups())) if match else None

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def stall_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """The stall timeout: ``$FLEET_STALL_TIMEOUT`` seconds when valid, else the default."""
    raw = environ.get(STALL_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_STALL_SECONDS
    return value if 0 < value < float("inf") else DEFAULT_STALL_SECONDS


def binary_for(backend: str, default: str, environ: Mapping[str, str] = os.environ) -> str:
    """The CLI to run: ``$FLEET_<BACKEND>_BIN`` (a path or a name on PATH), else *default*."""
    return environ.get(f"FLEET_{backend.upper()}_BIN") or default


@attrs.define(eq=False)
class PrivateDirs:
    """``root/{home,tmp,config}``, mode 0700, owned by one child's backend."""

    root: Path

    @classmethod
    def create(cls, scratch: str, label: str) -> "PrivateDirs":
        """Under *scratch* when the loadout names one (the sandbox keeps it writable)."""
        parent = scratch if scratch and Path(scratch).is_dir() else None
        root = Path(tempfile.mkdtemp(prefix=f"fleet-{label}-", dir=parent))
        for name in ("home", "tmp", "config"):
            (root / name).mkdir(mode=0o700)
        return cls(root=root)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def config(self) -> Path:
        """Not below ``tmp``: Codex's sandboxed tools break when its home is inside TMPDIR."""
        return self.root / "config"

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def cli_environment(
    dirs: PrivateDirs,
    *,
    secrets: Sequence[str],
    extra: Mapping[str, str],
    source: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """The CLI's whole environment (see the module docstring); *extra* wins over the rest."""
    env = {name: source[name] for name in _BASE_NAMES if name in source}
    for name in secrets:
        if name.lower() in _PROXY_NAMES:
            log.warning("not passing %s to the agent CLI: proxy variables are stripped", name)
        elif name in source:
            env[name] = source[name]
    env |= {
        "HOME": str(dirs.home),
        "TMPDIR": str(dirs.tmp),
        "XDG_CONFIG_HOME": str(dirs.config),
        "XDG_CACHE_HOME": str(dirs.root / "tmp" / "cache"),
        "TERM": "dumb",
        "NO_COLOR": "1",
        "FLEET_CHILD": "1",
    }
    env |= extra
    return {k: v for k, v in env.items() if k.lower() not in _PROXY_NAMES}


async def probe_version(
    backend: str,
    binary: str,
    *,
    minimum: Version,
    package: str,
    env: Mapping[str, str],
) -> Version:
    """Run ``binary --version``; refuse a missing, broken or too-old CLI with one line."""
    found = shutil.which(binary, path=env.get("PATH"))
    hint = f"install {package}@{minimum} or newer, or point FLEET_{backend.upper()}_BIN at it"
    if found is None:
        raise CliError(
            f"backend {backend}: {binary} is not on PATH ({hint})", backend=backend, binary=binary
        )
    try:
        with trio.fail_after(PROBE_TIMEOUT):
            done = await trio.run_process(
                [found, "--version"],
                env=dict(env),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    except (OSError, trio.TooSlowError) as exc:
        cause = "timed out" if isinstance(exc, trio.TooSlowError) else str(exc)
        raise CliError(
            f"backend {backend}: {found} --version failed: {cause} ({hint})",
            backend=backend,
            binary=found,
        ) from None
    output = (done.stdout + done.stderr).decode(errors="replace")
    version = Version.parse(output)
    if done.returncode != 0 or version is None:
        first = (output.strip().splitlines() or ["no output"])[0][:120]
        raise CliError(
            f"backend {backend}: {found} --version exited {done.returncode}: {first} ({hint})",
            backend=backend,
            binary=found,
        )
    if version < minimum:
        raise CliError(
            f"backend {backend}: {found} is version {version}, older than {minimum} ({hint})",
            backend=backend,
            binary=found,
        )
    return version


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
            if self.process.returncode is None:
                self.process.kill()
            _signal_all(tree, signal.SIGKILL)
            await self.process.wait()
            await self.close_stdin()
            if self.process.stdout is not None:
                await trio.aclose_forcefully(self.process.stdout)
        return self.process.returncode if self.process.returncode is not None else -1


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
