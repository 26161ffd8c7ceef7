"""The ``bash`` tool: one shell command per call, bounded in time and output.

The command runs as ``/bin/sh -c`` in its own session, so its process group is exactly what the
call started. Whatever ends the call — normal exit, timeout, or cancellation of the tool call —
the group is then stopped with the kill ladder (SIGTERM, up to ``KILL_GRACE`` seconds, SIGKILL),
inside a shielded, bounded cleanup: a background ``&`` process never outlives its call and
never holds the output pipe open past ``DRAIN_GRACE``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import psutil
import trio

from ._base import (
    MAX_OUTPUT_BYTES,
    BaseTool,
    ToolContext,
    ToolError,
    ToolResult,
    clip_tail,
    require_str,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Seconds between SIGTERM and SIGKILL for the command's process group.
KILL_GRACE = 2.0
#: Seconds the output pipe may stay open after the shell exited (a grandchild holding it).
DRAIN_GRACE = 2.0
#: The longest timeout a model may ask for, in seconds.
MAX_TIMEOUT = 3600.0
_POLL = 0.05


@attrs.define(eq=False)
class _Output:
    """The newest bytes of the command's output plus how many older ones were dropped."""

    data: bytearray = attrs.field(factory=bytearray)
    dropped: int = 0

    def add(self, chunk: bytes | bytearray) -> None:
        self.data += chunk
        # Keep twice the cap so the final cut is made on a line boundary by ``clip_tail``.
        excess = len(self.data) - 2 * MAX_OUTPUT_BYTES
        if excess > 0:
            del self.data[:excess]
            self.dropped += excess


class BashTool(BaseTool):
    name = "bash"
    description = (
        "Run a shell command (/bin/sh -c) in the workspace; stdout and stderr are combined and "
        "the last 50 KB / 2000 lines are shown with the exit code. It is killed after timeout "
        "seconds (default 120), and processes it leaves in the background are killed when it "
        "ends. Stdin is empty."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The shell command."},
            "timeout": {"type": "number", "description": "Seconds before it is killed."},
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        command = require_str(args, "command", tool="bash")
        timeout = args.get("timeout", ctx.bash_timeout)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ToolError(f"bash: argument 'timeout' must be a number of seconds ({timeout!r})")
        if not 0 < timeout <= MAX_TIMEOUT:
            raise ToolError(f"bash: timeout {timeout} is out of range; pass 0 < timeout <= 3600")
        output = _Output()
        returncode, timed_out = await _run_command(
            command, ctx=ctx, deadline=trio.current_time() + timeout, output=output
        )
        text = clip_tail(output.data.decode(errors="replace"), omitted_bytes=output.dropped)
        if text and not text.endswith("\n"):
            text += "\n"
        if timed_out:
            status = f"[timed out after {timeout:g} s; the command's process group was killed]"
        else:
            status = f"[exit code {returncode}]"
        return ToolResult(text=text + status, is_error=timed_out or returncode != 0)


async def _run_command(
    command: str, *, ctx: ToolContext, deadline: float, output: _Output
) -> tuple[int, bool]:
    """Run ``command``; return ``(returncode, timed_out)``. Cancellation kills the group."""
    process = await trio.lowlevel.open_process(
        ["/bin/sh", "-c", command],
        cwd=ctx.workspace,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert process.stdout is not None  # noqa: S101 - stdout=PIPE above
    stdout = process.stdout
    try:
        async with trio.open_nursery() as nursery:

            async def pump() -> None:
                async with stdout:
                    while chunk := await stdout.receive_some(65536):
                        output.add(chunk)

            nursery.start_soon(pump)
            with trio.CancelScope(deadline=deadline) as waiting:
                await process.wait()
            if waiting.cancelled_caught:
                nursery.cancel_scope.cancel()
            else:
                # A background grandchild may keep the pipe open; read what is there, then go.
                nursery.cancel_scope.deadline = trio.current_time() + DRAIN_GRACE
    finally:
        with trio.CancelScope(shield=True):
            await _stop_group(process)
    return process.returncode if process.returncode is not None else -1, waiting.cancelled_caught


async def _stop_group(process: trio.Process) -> None:
    """SIGTERM the process group, wait up to ``KILL_GRACE``, SIGKILL what is left, reap.

    Call it shielded. Processes that left the group (``setsid``) but were still descendants when
    it started are snapshotted first and get the same treatment. On return nothing of the
    command is running (zombies aside, which only their parent can reap).
    """
    pgid = process.pid  # the session leader's pid is the group id (start_new_session=True)
    # Only while the shell is unreaped is its pid surely still ours to look under.
    strays = _descendants(process.pid) if process.returncode is None else []
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if not _running(process, pgid, strays):
            break
        _signal_all(pgid, strays, signum)
        with trio.move_on_after(KILL_GRACE):
            # Nothing signals "the whole group is gone", so this polls.
            while _running(process, pgid, strays):  # noqa: ASYNC110
                await trio.sleep(_POLL)
    # Reap the shell through trio (not psutil) so its exit code stays right; the bound keeps a
    # process stuck in the kernel from hanging the agent.
    with trio.move_on_after(KILL_GRACE):
        await process.wait()


def _running(process: trio.Process, pgid: int, strays: list[psutil.Process]) -> bool:
    return process.poll() is None or _group_alive(pgid) or _any_alive(strays)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_all(pgid: int, strays: list[psutil.Process], signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
    for stray in strays:
        # psutil checks the pid still belongs to the same process (create time) before signalling.
        with contextlib.suppress(psutil.Error):
            stray.send_signal(signum)


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is in group ``pgid`` (zombies cannot be killed further)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for pid in psutil.pids():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def _any_alive(processes: list[psutil.Process]) -> bool:
    alive = False
    for process in processes:
        with contextlib.suppress(psutil.Error):
            alive = alive or process.status() != psutil.STATUS_ZOMBIE
    return alive
