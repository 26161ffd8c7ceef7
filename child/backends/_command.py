"""Backend ``command``: any argv; the task on stdin; the final text is its stdout.

Each turn runs the command once in its own process group. There is no steering (``peek``
says so); abort kills the group. Output is bounded.
"""

import contextlib
import os
import signal
import subprocess

import attrs
import trio

import ipc
from child.backends._base import Host, TurnResult

MAX_OUTPUT = 256 * 1024
KILL_GRACE = 2.0


def _kill_group(process: trio.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


@attrs.define(eq=False)
class CommandBackend:
    """Runs ``argv`` per turn."""

    argv: list[str]
    workspace: str
    host: Host
    env: dict[str, str] = attrs.Factory(dict)
    name: str = "command"
    _scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _abort_pending: bool = attrs.field(default=False, init=False)

    @classmethod
    def from_loadout(cls, loadout: ipc.Loadout, host: Host) -> "CommandBackend":
        if not loadout.command:
            raise ValueError("backend command: the loadout names no command (set command: [...])")
        return cls(argv=list(loadout.command), workspace=loadout.workspace, host=host)

    async def run_turn(self, text: str, *, side: bool = False) -> TurnResult:
        if side:
            return TurnResult(
                text="", ok=False, error="command backend cannot answer side questions"
            )
        if self._abort_pending:  # the abort arrived before the turn began
            self._abort_pending = False
            return TurnResult(text="", aborted=True)
        self.host.emit(ipc.Event(activity="tool_start", tool="command", text=" ".join(self.argv)))
        env = {**os.environ, **self.env, "FLEET_CHILD": "1"}
        process = await trio.lowlevel.open_process(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.workspace,
            env=env,
            start_new_session=True,
        )
        out = bytearray()
        err = bytearray()

        async def collect(stream: trio.abc.ReceiveStream | None, into: bytearray) -> None:
            if stream is None:
                return
            async for chunk in stream:
                if len(into) < MAX_OUTPUT:
                    into += chunk[: MAX_OUTPUT - len(into)]

        aborted = False
        with trio.CancelScope() as scope:
            self._scope = scope
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(collect, process.stdout, out)
                    nursery.start_soon(collect, process.stderr, err)
                    if process.stdin is not None:
                        with contextlib.suppress(trio.BrokenResourceError):
                            await process.stdin.send_all(text.encode())
                        await process.stdin.aclose()
                    await process.wait()
            finally:
                self._scope = None
                if process.returncode is None:
                    _kill_group(process, signal.SIGTERM)
                    with trio.CancelScope(shield=True), trio.move_on_after(KILL_GRACE):
                        await process.wait()
                    _kill_group(process, signal.SIGKILL)
                    with trio.CancelScope(shield=True):
                        await process.wait()
        if scope.cancelled_caught:
            aborted = True
        self.host.emit(
            ipc.Event(activity="tool_end", tool="command", text=f"exit {process.returncode}")
        )
        stdout = out.decode(errors="replace")
        if aborted:
            return TurnResult(text=stdout, aborted=True)
        if process.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
            return TurnResult(
                text=stdout,
                ok=False,
                error=f"command exited with {process.returncode}: {tail[0][:200]}",
            )
        return TurnResult(text=stdout)

    async def steer(self, text: str) -> None:
        # Said in the activity line too, so `peek` shows why the steer changed nothing.
        self.host.emit(
            ipc.Event(activity="message", text="steer ignored: a command cannot be steered")
        )
        raise ValueError("the command backend cannot be steered")

    async def abort(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
        else:
            self._abort_pending = True

    async def aclose(self) -> None:
        return None
