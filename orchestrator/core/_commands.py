"""The parent's commands to a running child, for :class:`~orchestrator.core._run.ChildRun` (a
mixin): ``steer`` the working turn, ``pause`` it, ``ask`` a side question and go back to the
task. Each is one line of refusal when the child's state does not allow it.
"""

from typing import TYPE_CHECKING, Any

import trio

import ipc
from orchestrator._errors import OperationFailed, UsageError
from orchestrator._records import TERMINAL, ChildRecord, State
from orchestrator.core._requests import Turn
from orchestrator.governance._watchdog import Watchdog

if TYPE_CHECKING:
    from orchestrator.core._host import RunHost

__all__ = ["ParentCommands"]


class ParentCommands:
    """The parent's commands; the attributes are :class:`ChildRun`'s own."""

    host: "RunHost[Any]"
    record: ChildRecord
    watchdog: Watchdog
    turn: Turn | None
    side_turn: Turn | None
    pausing: bool
    _prompts: list[str]
    _early_steers: list[str]
    _queued_scope: trio.CancelScope | None
    _turn_lock: trio.Lock
    _turns: int

    @property
    def key(self) -> str:
        return self.record.key

    def queue_prompt(self, text: str) -> None:
        raise NotImplementedError  # ChildRun's

    async def _wait_connected(self) -> None:
        raise NotImplementedError  # ChildRun's

    async def _request(self, message: ipc.Message) -> ipc.Message:
        raise NotImplementedError  # ChildRun's

    async def steer(self, text: str) -> None:
        """Redirect the working turn; a turn still queued gets the steer as soon as it starts."""
        if self.turn is None and (self._prompts or self.record.queued):
            self._early_steers.append(text)
            self.record.touch("steer queued")
            return
        if self.record.state not in {State.WORKING, State.WAITING} or self.turn is None:
            raise UsageError(
                f"steer: {self.key} is {self.record.state}, not working (use resume for idle "
                "or paused children)"
            )
        await self._request(ipc.Steer(text=text))
        self.record.touch("steered")

    async def pause(self) -> bool:
        """Clear queued prompts and abort; ``False`` when not settled within the pause timeout."""
        self._prompts.clear()
        self._early_steers.clear()
        if self._queued_scope is not None:
            self._queued_scope.cancel()
        turn = self.turn
        if turn is None:
            # Still starting, idle, or queued for a lane slot: nothing to abort. A child paused
            # before its hello stays paused after it (its task was the prompt just dropped).
            if self.record.state in {State.STARTING, State.IDLE, State.WORKING}:
                self.record.state = State.PAUSED
                self.record.queued = False
                self.record.touch("paused")
            return True
        self.pausing = True
        await self._request(ipc.Abort())
        with trio.move_on_after(self.host.config.pause_timeout):
            await turn.settled.wait()
            # _settled runs in the turn task right after the event; let it.
            await trio.lowlevel.checkpoint()
            return True
        return False

    async def ask(self, text: str) -> str:
        """A side question: pause if working, ask, then restore the prior state and task."""
        await self._wait_connected()
        prior = self.record.state
        if prior in TERMINAL:
            raise UsageError(f"ask: {self.key} is {prior}")
        resume = prior in {State.WORKING, State.WAITING} or self.record.queued
        if resume and not await self.pause():
            raise OperationFailed(f"ask: {self.key} did not settle within the pause timeout")
        async with self._turn_lock:
            self._turns += 1
            side = Turn(number=self._turns, side=True)
            self.side_turn = side
            self.record.touch("answering a side question")
            self.watchdog.start_active()
            try:
                await self._request(ipc.Ask(text=text, turn=side.number))
                await side.settled.wait()
            finally:
                self.watchdog.stop_active()
                self.side_turn = None
        result = side.result
        answer = "" if result is None else (result.text or result.error)
        if resume:
            self.queue_prompt(
                "Continue the task you were working on before the side question: "
                f"{self.record.task}"
            )
        else:
            self.record.state = prior
            self.record.touch(str(prior))
        return answer
