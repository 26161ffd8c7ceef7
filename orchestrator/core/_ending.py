"""A child's end, for :class:`~orchestrator.core._run.ChildRun` (a mixin, so the run's one
module stays readable): ``stop``, ``stop_incomplete``, and ``finish`` — every way a child can end
goes through :meth:`Ending.finish`, which runs exactly once: it kills the tree, drains stdio,
releases the slot, the lane and the locks, settles the worktree, records the failure and retires
the record.
"""

import contextlib
from typing import TYPE_CHECKING, Any, cast

import trio

import ipc
from orchestrator._records import ChildRecord, State
from orchestrator.core._capacity import LaneSlot
from orchestrator.core._isolation import settle_worktree
from orchestrator.core._requests import Turn
from orchestrator.core._terms import RemoteTerms
from orchestrator.governance._diagnostics import FailureKind, RunLog
from orchestrator.launch._launcher import Launched

if TYPE_CHECKING:
    from orchestrator.core._host import RunHost

__all__ = ["Ending"]


class Ending:
    """The end of a run; the attributes are :class:`ChildRun`'s own."""

    host: "RunHost[Any]"
    record: ChildRecord
    log: RunLog
    channel: ipc.Channel | None
    launched: Launched | None
    done: trio.Event
    finishing: bool
    stopping: bool
    turn: Turn | None
    side_turn: Turn | None
    terms: RemoteTerms | None
    _prompts: list[str]
    _nursery: trio.Nursery | None
    _slot: LaneSlot

    @property
    def key(self) -> str:
        return self.record.key

    async def stop(self) -> dict[str, Any]:
        """Final: abort if needed, close the child, reap it, release everything."""
        if not self.finishing:
            self.stopping = True
            self._prompts.clear()
            if self.channel is not None and not self.channel.closed:
                if self.turn is not None or self.side_turn is not None:
                    with trio.move_on_after(self.host.config.pause_timeout):
                        await self._quiet_request(ipc.Abort())
                        turn = self.turn or self.side_turn
                        if turn is not None:
                            await turn.settled.wait()
                with trio.move_on_after(1.0):
                    await self._quiet_request(ipc.Shutdown())
            await self.finish(State.STOPPED, kind="", error="")
        await self.done.wait()
        return self.record.handoff()

    def _certificate_expired(self) -> None:
        """The channel's certificate ran out unrenewed: the child is cut off."""
        if self._nursery is not None and not self.finishing:
            error = "its certificate expired without renewal; the channel was closed"
            self._nursery.start_soon(self.finish, State.FAILED, "protocol", error)

    async def stop_incomplete(self, reason: str) -> None:
        """Stop the child before it finished: the turn is aborted, copy-back runs as for any
        stop, and the handoff's ``incomplete`` says *reason* (one line)."""
        if self.finishing or self.stopping:
            return
        self.record.incomplete = reason
        self.record.touch(f"incomplete: {reason}")
        self.log.write(f"fleet: stopped incomplete: {reason}")
        await self.stop()  # its note is sent as it ends (finish), before a waiter can see it

    async def _quiet_request(self, message: ipc.Message) -> None:
        if self.channel is not None:
            with contextlib.suppress(ipc.RequestError):
                await self.channel.request(message)

    async def finish(self, state: State, kind: FailureKind | str, error: str) -> None:
        """Reach the terminal *state* exactly once; later callers wait for the first."""
        if self.finishing:
            await self.done.wait()
            return
        self.finishing = True
        record = self.record
        with trio.CancelScope(shield=True):
            if self.channel is not None:
                self.channel.close("stopped" if state is State.STOPPED else kind)
            for turn in (self.turn, self.side_turn):
                if turn is not None and not turn.settled.is_set():
                    turn.settled.set()
            if self.launched is not None:
                await self.launched.terminate(self.host.config.kill_grace)
                await self.launched.drain(self.host.config.drain_timeout)
            self.host.cancel_questions(self.key)
            self._slot.give_back()
            if record.mode == "worktree":
                await settle_worktree(
                    self.host.worktrees,
                    record,
                    self.log,
                    copy_back=state is State.STOPPED,
                    launched=self.launched,
                )
            record.state = state
            record.queued = False
            if state is State.FAILED:
                error = self.log.secrets.scrub(error)
                record.error = error
                record.failure = self.log.fail(cast("FailureKind", kind), error).as_json()
                record.touch(f"failed: {kind}")
            else:
                self.log.flush()
                record.touch("stopped")
            if self.terms is not None:
                await self.terms.outwait(bool(getattr(self.launched, "confirmed_exit", True)))
            await self.host.release(self)
            if state is State.FAILED:
                self.host.notify(record, report=record.report, error=error, failure=True)
            elif record.incomplete:
                error = f"incomplete: {record.incomplete}"
                self.host.notify(record, report=record.report, error=error)
            # Its backend's session store goes last: a thread hop before the failure note
            # would let a waiter see the child ended with no note of why.
            await self.host.drop_scratch(self.key)
        self.done.set()
