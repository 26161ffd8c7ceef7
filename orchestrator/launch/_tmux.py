"""The tmux launcher: each child runs in a tmux window whose pane runs the child itself.

By default the windows live on a PRIVATE tmux server (``tmux -S <runtime dir>/tmux.sock``, the
session's 0700 directory in the per-user runtime root that no sandbox of any fleet shows, no
user configuration loaded), in one tmux session per fleet
session (``fleet-<session>``), one window per child named ``<key>-<name>``. ``tmux:current`` puts
the windows into the user's current session instead (``$TMUX``). Only windows we created are ever
closed: never a session, never a server. The private server exits by itself when its last
window closes.

Nothing secret crosses tmux. The pane runs ``python -I -m child <loadout>`` from an argv list
(tmux execs it directly: no shell, no typed line), the token stays in the 0600 loadout (which the
child unlinks once read; the supervisor admits its hello only from the pane's process tree), and
the only variable we add to a pane's environment is ``FLEET_CHILD=1``. The private server is started
with the child environment the supervisor computed, minus ``FLEET_CHILD`` (so a shell the user
opens there is not mistaken for a child).

The pane's process is not our child — the tmux server forked it — so its exit is awaited on a
pidfd (Linux) or by polling, and its exit status is read back from tmux: every window of ours has
``remain-on-exit`` set in the same command queue that created it (no race with an early death),
so a dead pane keeps its status and its last screen. On a terminal state the last screen
(``capture-pane -p -S -N``, at most 8 KiB) goes to the run's output sink — where the run log
redacts it and keeps it in memory, writing it to the log file only for a failed run — and the
window is closed, unless the launcher keeps failed windows and the pane died on its own with a
non-zero status. Its stdout and stderr are never piped anywhere.

tmux commands are run as argv lists through ``trio.run_process``: a command is short-lived, and
the panes themselves are forked by the tmux server, so the worker-thread ``PR_SET_PDEATHSIG`` trap
(DESIGN §10) cannot reach them.
"""

import contextlib
import re
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from orchestrator._errors import OperationFailed, UsageError
from orchestrator.launch._foreign import ForeignProcess, kill_foreign
from orchestrator.launch._launcher import LaunchSpec, OutputSink

COMMAND_TIMEOUT: Final = 5.0
SCREEN_LINES: Final = 200
SCREEN_CAP: Final = 8192
WINDOW_SIZE: Final = ("120", "40")
_PANE_FORMAT: Final = "#{pane_id} #{window_id} #{pane_pid}"
_STATUS_FORMAT: Final = "#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}"
_NAME_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_.-]+")
# tmux reaps a pane's process from its event loop, a moment after the pidfd fires.
_STATUS_POLLS: Final = 40
# What a pane's exit status reads as when neither the zombie nor tmux could tell it.
UNKNOWN_STATUS: Final = 255


class TmuxError(OperationFailed):
    """A tmux command failed; ``argv`` and ``stderr`` are the evidence."""

    def __init__(self, message: str, *, argv: Sequence[str], stderr: str = "") -> None:
        super().__init__(message)
        self.argv = tuple(argv)
        self.stderr = stderr


def window_name(key: str, name: str) -> str:
    """``<key>-<name>``, with anything tmux could read as syntax replaced by ``-``."""
    return _NAME_UNSAFE.sub("-", f"{key}-{name}").strip("-") or key


@attrs.frozen(kw_only=True)
class TmuxServer:
    """How to reach one tmux server: its socket, and the config file when we start it."""

    socket: str
    private: bool

    def argv(self, *args: str) -> list[str]:
        # A private server loads no user configuration: its behaviour must not depend on it.
        config = ["-f", "/dev/null"] if self.private else []
        return ["tmux", "-S", self.socket, *config, *args]

    async def run(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        """Run one tmux command; its stdout, or :class:`TmuxError` with tmux's own words."""
        argv = self.argv(*args)
        try:
            with trio.fail_after(COMMAND_TIMEOUT):
                result = await trio.run_process(
                    argv,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    env=None if env is None else dict(env),
                )
        except FileNotFoundError:
            raise TmuxError(
                "tmux: the tmux binary is not on PATH (install tmux, or use --surface process)",
                argv=argv,
            ) from None
        except trio.TooSlowError:
            raise TmuxError(
                f"tmux {args[0]}: no answer from the server at {self.socket} within "
                f"{COMMAND_TIMEOUT:g} s (is it wedged? close it and retry)",
                argv=argv,
            ) from None
        stderr = result.stderr.decode(errors="replace").strip()
        if result.returncode != 0:
            cause = stderr.splitlines()[-1] if stderr else f"exit code {result.returncode}"
            raise TmuxError(f"tmux {args[0]} on {self.socket}: {cause}", argv=argv, stderr=stderr)
        return result.stdout.decode(errors="replace")


@attrs.define(eq=False)
class TmuxPane:
    """A child running in a tmux pane, as its launcher sees it."""

    server: TmuxServer
    pane_id: str
    window_id: str
    window: str
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
            # tmux 3.3 sometimes loses a pane's exit status (the pty's EOF wins the race with
            # SIGCHLD), so read it from the zombie first, and ask tmux only when that is gone.
            status = self._process.zombie_status()
            self.returncode = status if status is not None else await self._exit_status()
        finally:
            if self.returncode is None:
                self.returncode = -signal.SIGHUP
            self.exited.set()

    async def _exit_status(self) -> int:
        for _ in range(_STATUS_POLLS):
            try:
                out = await self.server.run(
                    "display-message", "-p", "-t", self.pane_id, _STATUS_FORMAT
                )
            except TmuxError:
                # The pane is gone (kill-pane, a closed window, the server killed): tmux hung
                # its process up.
                self.closed = True
                return -signal.SIGHUP
            dead, status, sig = ([*out.strip().split("|"), "", "", ""])[:3]
            # A pane reads as dead once its pty closes, before tmux has reaped its process.
            if dead == "1" and (sig or status):
                return -int(sig) if sig else int(status)
            await trio.sleep(0.025)
        self.sink("pane", f"[fleet] tmux lost the exit status of pane {self.pane_id}\n".encode())
        return UNKNOWN_STATUS

    async def wait(self) -> int:
        await self.exited.wait()
        assert self.returncode is not None  # noqa: S101 - set before exited
        return self.returncode

    async def terminate(self, grace: float) -> None:
        """Capture the last screen, kill the pane's process tree, close the window."""
        if self._finished:
            return
        self._finished = True
        died_alone = self.exited.is_set()
        await self._capture()
        if not self.exited.is_set():
            await kill_foreign(self.pid, exited=self.exited, grace=grace)
        failed_alone = died_alone and self.returncode != 0
        if self.closed or (failed_alone and self.keep_failed):
            return
        with contextlib.suppress(TmuxError):
            await self.server.run("kill-window", "-t", self.window_id)
        self.closed = True

    async def _capture(self) -> None:
        try:
            screen = await self.server.run(
                "capture-pane", "-p", "-J", "-t", self.pane_id, "-S", f"-{SCREEN_LINES}"
            )
        except TmuxError:
            self.closed = True
            screen = f"[fleet] tmux pane {self.pane_id} was closed; there is no screen to capture"
        lines = [line.rstrip() for line in screen.rstrip().splitlines()]
        # An idle screen is mostly empty rows: keep one blank line for each run of them.
        kept = [line for i, line in enumerate(lines) if line or (i and lines[i - 1])]
        data = ("\n".join(kept) + "\n").encode()
        self.sink("pane", data[-SCREEN_CAP:])

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109 - the Launched protocol
        """Nothing to drain: a pane's output is never piped to us."""
        await trio.lowlevel.checkpoint()

    def describe(self) -> str:
        return (
            f"tmux pane {self.pane_id} (window {self.window_id} {self.window}) pid {self.pid} "
            f"on {self.server.socket}"
        )

    def attach_target(self) -> dict[str, Any]:
        """What ``fleet attach`` needs to reach this pane's window."""
        return {"socket": self.server.socket, "target": self.window_id, "window": self.window}


def _snapshot(env: Mapping[str, str]) -> dict[str, str]:
    return dict(env)


@attrs.define(eq=False)
class TmuxLauncher:
    """Start each child in its own window; see the module docstring."""

    server: TmuxServer
    session: str
    base_env: Mapping[str, str] = attrs.field(converter=_snapshot, repr=False)
    keep_failed: bool = False
    name: str = "tmux"
    _lock: trio.Lock = attrs.Factory(trio.Lock)

    @classmethod
    def private(
        cls,
        socket: Path,
        session: str,
        *,
        base_env: Mapping[str, str],
        keep_failed: bool = False,
    ) -> "TmuxLauncher":
        """Windows on our own server at *socket* (the session's ``SessionPaths.tmux_socket``,
        in the per-user runtime root no sandbox shows), tmux session ``fleet-<id>``.

        *base_env* is the supervisor's own environment; see :meth:`window_env`.
        """
        server = TmuxServer(socket=str(socket), private=True)
        return cls(
            server=server, session=f"fleet-{session}", base_env=base_env, keep_failed=keep_failed
        )

    @classmethod
    def current(cls, environ: Mapping[str, str], *, keep_failed: bool = False) -> "TmuxLauncher":
        """Windows in the session named by ``$TMUX`` (``socket,server-pid,session-id``)."""
        value = environ.get("TMUX", "")
        socket, _, rest = value.partition(",")
        session_id = rest.rpartition(",")[2]
        if not socket or not session_id.isdigit():
            raise UsageError(
                "spawn: --surface tmux:current needs $TMUX, and the supervisor was not started "
                "inside tmux (run fleet serve from a tmux pane, or use --surface tmux)"
            )
        server = TmuxServer(socket=socket, private=False)
        return cls(
            server=server, session=f"${session_id}", base_env=environ, keep_failed=keep_failed
        )

    def window_env(self, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
        """Split a child's *env* into what the server holds and what goes on the window's argv.

        Variables the child shares with the supervisor's own environment may be the user's
        secrets (API keys): they reach the pane through the server's environment, never through
        argv. Only what the supervisor itself added or changed — ``FLEET_CHILD``, the scratch
        ``TMPDIR`` and the like, never a secret — is passed with ``-e``; in the user's session,
        variables the supervisor withholds from children (proxies, ``FLEET_SESSION``) are blanked.
        """
        inherited = {k: v for k, v in env.items() if self.base_env.get(k) == v}
        flags = [f"{k}={v}" for k, v in env.items() if self.base_env.get(k) != v]
        if not self.server.private:
            # TMUX and TMUX_PANE are the pane's own: tmux sets them last.
            flags += [f"{k}=" for k in self.base_env if k not in env and not k.startswith("TMUX")]
        return inherited, [arg for flag in flags for arg in ("-e", flag)]

    def session_target(self) -> str:
        """The tmux session as a target: ``=fleet-<id>`` (exact match) or ``$N``."""
        return f"={self.session}" if self.server.private else self.session

    async def launch(self, spec: LaunchSpec, sink: OutputSink, nursery: trio.Nursery) -> TmuxPane:
        name = window_name(spec.key, spec.name)
        async with self._lock:  # session creation and index choice must not interleave
            out = await self._create(name, spec)
        try:
            pane_id, window_id, pid = out.split()
            pane = TmuxPane(
                server=self.server,
                pane_id=pane_id,
                window_id=window_id,
                window=name,
                pid=int(pid),
                sink=sink,
                keep_failed=self.keep_failed,
            )
        except ValueError:
            raise TmuxError(
                f"tmux new-window: unexpected answer {out.strip()!r} (is this tmux 3.2 or later?)",
                argv=(),
            ) from None
        nursery.start_soon(pane.watch)
        return pane

    async def _create(self, name: str, spec: LaunchSpec) -> str:
        target = self.session_target()
        env, flags = self.window_env(spec.env)
        window = ["-n", name, "-c", spec.cwd, *flags, "-P", "-F", _PANE_FORMAT]
        if self.server.private and not await self._has_session():
            # new-session's -e sets the *session's* environment: the first child's own
            # variables (its run marker above all) must not reach later windows, a person's
            # included, so they are unset again once its pane has started with them.
            unset = [
                arg
                for flag in flags[1::2]
                for arg in (";", "set-environment", "-t", target, "-u", flag.split("=", 1)[0])
            ]
            return await self.server.run(
                "new-session", "-d", "-s", self.session, "-x", WINDOW_SIZE[0], "-y", WINDOW_SIZE[1],
                *window, "--", *spec.argv,
                ";", "set-option", "-w", "-t", f"{target}:", "remain-on-exit", "on",
                *unset,
                env=env,
            )  # fmt: skip
        last: TmuxError | None = None
        for _ in range(3):
            listing = await self.server.run("list-windows", "-t", target, "-F", "#{window_index}")
            index = max((int(i) for i in listing.split()), default=0) + 1
            try:
                return await self.server.run(
                    "new-window", "-d", "-t", f"{target}:{index}", *window, "--", *spec.argv,
                    ";", "set-option", "-w", "-t", f"{target}:{index}", "remain-on-exit", "on",
                )  # fmt: skip
            except TmuxError as exc:
                if "in use" not in exc.stderr:
                    raise
                last = exc  # someone else took the index between our two commands
        assert last is not None  # noqa: S101 - the loop ran and each pass failed
        raise last

    async def _has_session(self) -> bool:
        try:
            await self.server.run("has-session", "-t", self.session_target())
        except TmuxError:
            return False
        return True

    async def attach_target(self) -> dict[str, Any]:
        """``fleet attach`` with no agent: the fleet's own tmux session (private server only)."""
        if not await self._has_session():
            raise UsageError(
                "attach: no fleet tmux session is running (spawn a child with --surface tmux)"
            )
        return {"socket": self.server.socket, "target": self.session_target(), "window": ""}
