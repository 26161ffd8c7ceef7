"""The ``shell`` tool: background shells a child starts, reads, lists and kills across turns.

``start {command, watch?}`` runs ``/bin/sh -c`` in its own process group (see
:mod:`._shellproc`: it dies with the child, however the child ends) and answers with an id
(``s1``, ``s2``, …). Its output is kept ANSI-stripped, the last :data:`MAX_LINES` lines.
``read {id, lines?}`` shows the newest lines, ``list`` every shell kept, ``kill {id}`` SIGTERMs
the group and SIGKILLs it after 3 s. When the leader exits by itself, whatever it left in the
group is stopped the same way. At most :data:`MAX_RUNNING` run at once (one more ``start`` is
refused) and the :data:`MAX_KEPT` most recent are kept (the oldest finished one is forgotten).

A ``watch`` regex is checked on every new output line; the first match fires it, once: the
tool context's ``notify`` hears one line, which the agent loop shows the model at its next
step, or, when no turn runs, asks the supervisor to wake the child.

A tool call never waits on a shell but ``kill`` (at most the grace and a moment); the output
pump and the exit watch run as trio system tasks, as a shell outlives the call that started it.
The toolset's owner must ``await aclose()`` at exit: every shell is stopped, and in a child
process whatever a shell hid from its group (``setsid``, a double fork, an emptied environment)
was re-parented to the child, which ends it too.
"""

from __future__ import annotations

import codecs
import collections
import logging
import re
from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs
import trio

from ._base import (
    BaseTool,
    ToolContext,
    ToolError,
    ToolResult,
    clip_line,
    clip_tail,
    optional_int,
    optional_str,
    require_str,
)
from ._shellproc import (
    KILL_GRACE,
    Guardian,
    adopt_orphans,
    end_adopted,
    spawn,
    stop_group,
    wait_exit,
)

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Mapping

log = logging.getLogger("child")

MAX_RUNNING: Final = 8
MAX_KEPT: Final = 20
#: Output lines kept per shell.
MAX_LINES: Final = 2000
#: A stored line (and an unterminated one) is cut at this many characters.
MAX_LINE_CHARS: Final = 1000
MAX_WATCH_CHARS: Final = 200
DEFAULT_READ_LINES: Final = 100
#: Seconds the output pipe may stay open after the group is gone (a process that left it).
DRAIN_GRACE: Final = 2.0
_COMMAND_PREVIEW: Final = 80

# CSI, OSC (BEL or ST ended), DCS/SOS/PM/APC strings, two-byte escapes, then other controls.
_ANSI: Final = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -/]*[0-~]"
    r"|[\x00-\x08\x0b-\x1f\x7f]"
)


def strip_ansi(line: str) -> str:
    """*line* as a terminal would leave it: escapes gone, only the text after the last ``\\r``."""
    line = line.removesuffix("\r")
    return _ANSI.sub("", line.rsplit("\r", 1)[-1])


@attrs.define(eq=False)
class Shell:
    """One background shell and the newest lines of its output."""

    id: str
    command: str
    process: subprocess.Popen[bytes]
    watch: re.Pattern[str] | None
    notify: Callable[[str], None] | None
    started: float = attrs.field(factory=trio.current_time)
    lines: collections.deque[str] = attrs.field(factory=lambda: collections.deque(maxlen=MAX_LINES))
    total: int = 0
    partial: str = ""
    fired: bool = False
    returncode: int | None = None
    killed: str = ""
    #: Set once the group is gone and the output drained.
    finished: trio.Event = attrs.Factory(trio.Event)
    _decoder: codecs.IncrementalDecoder = attrs.field(
        factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    def feed(self, chunk: bytes) -> None:
        text = self.partial + self._decoder.decode(chunk, final=not chunk)
        *complete, self.partial = text.split("\n")
        if len(self.partial) > MAX_LINE_CHARS:  # a line that never ends is kept in pieces
            complete.append(self.partial)
            self.partial = ""
        if not chunk and self.partial:
            complete.append(self.partial)
            self.partial = ""
        for raw in complete:
            self._line(clip_line(strip_ansi(raw), MAX_LINE_CHARS))

    def _line(self, line: str) -> None:
        self.lines.append(line)
        self.total += 1
        if self.watch is None or self.fired or not self.watch.search(line):
            return
        self.fired = True
        if self.notify is not None:
            self.notify(
                f"background shell {self.id} ({self.preview}): watch /{self.watch.pattern}/ "
                f"matched: {clip_line(line, 300)} (read it with shell read {self.id})"
            )

    @property
    def preview(self) -> str:
        return clip_line(" ".join(self.command.split()), _COMMAND_PREVIEW)

    def status(self) -> str:
        if self.returncode is None:
            return f"running {trio.current_time() - self.started:.0f} s, pid {self.process.pid}"
        how = f"killed ({self.killed})" if self.killed else f"exited {self.returncode}"
        return how if self.finished.is_set() else f"{how}, stopping its group"

    def summary(self) -> str:
        watch = ""
        if self.watch is not None:
            watch = f" · watch /{self.watch.pattern}/ {'fired' if self.fired else 'armed'}"
        return f"{self.id} [{self.status()}] {self.total} lines{watch} · {self.preview}"


_ACTIONS: Final = ("start", "read", "list", "kill")


class ShellTool(BaseTool):
    name = "shell"
    description = (
        "Background shells that keep running across tool calls and turns (a dev server, a "
        "watcher, a long build). action=start {command, watch?} runs /bin/sh -c in the "
        "workspace and returns an id; watch is a regex: the first output line matching it "
        "wakes you with a note (once). action=read {id, lines?} shows the newest output "
        f"(ANSI stripped, last {MAX_LINES} lines kept); action=list; action=kill {{id}} "
        f"(SIGTERM, SIGKILL after {KILL_GRACE:g} s). At most {MAX_RUNNING} run at once. Use "
        "bash for commands that finish."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(_ACTIONS)},
            "command": {"type": "string", "description": "start: the shell command."},
            "watch": {"type": "string", "description": "start: a regex to be woken by."},
            "id": {"type": "string", "description": "read, kill: the shell id (s1)."},
            "lines": {"type": "integer", "description": "read: how many newest lines."},
        },
        "required": ["action"],
        "additionalProperties": False,
    }

    def __init__(self) -> None:
        self.shells: dict[str, Shell] = {}
        self._count = 0
        self._guardian = Guardian()
        self._closed = False
        #: This child process adopts what its shells orphan (:func:`adopt_orphans`).
        self._adopting = False

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        action = require_str(args, "action", tool="shell")
        if action == "start":
            return self._start(ctx, args)
        if action == "list":
            text = "\n".join(s.summary() for s in self.shells.values())
            return ToolResult(text=text or "no background shells")
        if action == "read":
            return self._read(args)
        if action == "kill":
            shell = self._find(args)
            with trio.CancelScope(shield=True):  # a cancelled call never leaves it half-killed
                return await self._kill(shell)
        raise ToolError(f"shell: action {action!r} is not one of {', '.join(_ACTIONS)}")

    def _find(self, args: Mapping[str, Any]) -> Shell:
        key = require_str(args, "id", tool="shell")
        shell = self.shells.get(key)
        if shell is None:
            known = ", ".join(self.shells) or "none"
            raise ToolError(f"shell: no shell {key!r} (kept: {known}); see shell list")
        return shell

    def _start(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        command = require_str(args, "command", tool="shell")
        watch = _compile_watch(optional_str(args, "watch", tool="shell"))
        if self._closed:
            raise ToolError("shell: the child is shutting down; no new shells")
        running = [s.id for s in self.shells.values() if not s.finished.is_set()]
        if len(running) >= MAX_RUNNING:
            raise ToolError(
                f"shell: {MAX_RUNNING} shells are already running ({', '.join(running)}); "
                "kill one first"
            )
        while len(self.shells) >= MAX_KEPT:
            oldest = next(s for s in self.shells.values() if s.finished.is_set())
            del self.shells[oldest.id]
        self._adopting = self._adopting or adopt_orphans()
        process, output = spawn(command, ctx.workspace)
        self._guardian.add(process.pid)
        self._count += 1
        shell = Shell(
            id=f"s{self._count}", command=command, process=process, watch=watch, notify=ctx.notify
        )
        self.shells[shell.id] = shell
        trio.lowlevel.spawn_system_task(self._supervise, shell, output, name=f"shell {shell.id}")
        armed = f"; watch /{watch.pattern}/ armed" if watch is not None else ""
        return ToolResult(text=f"started {shell.id} (pid {process.pid}){armed}")

    def _read(self, args: Mapping[str, Any]) -> ToolResult:
        shell = self._find(args)
        count = optional_int(args, "lines", tool="shell", minimum=1) or DEFAULT_READ_LINES
        shown = list(shell.lines)[-count:]
        if shell.partial:
            shown.append(strip_ansi(shell.partial))
        older = shell.total - len(shown) + bool(shell.partial)
        header = f"[{shell.id} {shell.status()}; {shell.total} lines"
        header += f", showing the last {len(shown)}]" if older > 0 else "]"
        body = clip_tail("\n".join(shown))
        return ToolResult(text=f"{header}\n{body}" if body else header)

    async def _kill(self, shell: Shell) -> ToolResult:
        if shell.finished.is_set():
            return ToolResult(text=f"{shell.id} already {shell.status()}")
        shell.killed = "SIGTERM"
        if await stop_group(shell.process):
            shell.killed = f"SIGKILL after {KILL_GRACE:g} s"
        with trio.move_on_after(DRAIN_GRACE + 1):
            await shell.finished.wait()
        return ToolResult(text=f"{shell.id} {shell.status()}")

    async def _supervise(self, shell: Shell, output: trio.lowlevel.FdStream) -> None:
        """Pump *shell*'s output until its group is gone, then mark it finished."""
        try:
            async with trio.open_nursery() as nursery:

                async def pump() -> None:
                    async with output:
                        while chunk := await output.receive_some(65536):
                            shell.feed(chunk)
                    shell.feed(b"")

                nursery.start_soon(pump)
                shell.returncode = await wait_exit(shell.process)
                with trio.CancelScope(shield=True):
                    await stop_group(shell.process)  # what the leader left behind
                nursery.cancel_scope.deadline = trio.current_time() + DRAIN_GRACE
        except Exception:
            log.exception("background shell %s", shell.id)
        finally:
            self._guardian.forget(shell.process.pid)
            shell.finished.set()

    async def aclose(self) -> None:
        """Stop every shell (in parallel, each within its grace) and release the guardian.

        The caller bounds it (the runtime gives the backend 5 s): whatever is still running
        when it is cut short dies with the process (PDEATHSIG, and the guardian's pipe closing).
        """
        self._closed = True
        async with trio.open_nursery() as nursery:
            for shell in self.shells.values():
                if not shell.finished.is_set():
                    nursery.start_soon(self._kill, shell)
        if self._adopting:  # what hid from the groups (setsid, double fork, no environment)
            guardian = self._guardian.pid
            end_adopted(keep=() if guardian is None else (guardian,))
        await self._guardian.aclose()


def _compile_watch(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    if len(pattern) > MAX_WATCH_CHARS:
        raise ToolError(f"shell: watch is {len(pattern)} characters; keep it <= {MAX_WATCH_CHARS}")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"shell: watch {pattern!r} is not a valid regex: {exc}") from None
