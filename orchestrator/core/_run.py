"""One child's life, as the supervisor runs it: launch, hello, turns, the parent's commands, and
one terminal state.

A :class:`ChildRun` owns its process, its IPC channel, its watchdog and its run log. The parent's
commands to a running child (steer, pause, ask) are refused in one line when the child's state
does not allow them. Every way a child can end — stop, watchdog, crash, disconnect, handshake
timeout, supervisor close — goes through :meth:`ChildRun.finish`, which runs exactly once: it
kills the tree, drains stdio, releases the slot, the lane and the locks, settles the worktree,
records the failure and retires the record.
"""

import contextlib
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs
import trio

import ipc
from orchestrator._errors import OperationFailed, UsageError
from orchestrator._records import TERMINAL, ChildRecord, State
from orchestrator._sync import wait_first
from orchestrator.core._capacity import LaneSlot
from orchestrator.core._context import LATE_WRITERS, LATER_FETCH_S, fetch_context, keep_sent
from orchestrator.core._isolation import settle_worktree
from orchestrator.core._loops import intervene
from orchestrator.core._requests import ChildRequests, Question, Turn
from orchestrator.core._terms import RemoteTerms
from orchestrator.governance._checked import CheckedResult, Verdict
from orchestrator.governance._checkproc import validate_safely
from orchestrator.governance._diagnostics import FailureKind, RunLog
from orchestrator.governance._loopgate import Trip
from orchestrator.governance._watchdog import BudgetPolicy, Watchdog
from orchestrator.launch._launcher import Launched, exit_failure
from orchestrator.launch._ray_launched import LaunchedRay
from orchestrator.spend._fallback import current_model, fallback

if TYPE_CHECKING:
    from orchestrator.core._host import RunHost

__all__ = ["ChildRun", "Question", "Turn"]


@attrs.define(eq=False)
class ChildRun:
    """The supervisor's side of one child."""

    host: "RunHost[ChildRun]"
    record: ChildRecord
    token: str
    #: The loadout file of a pane's child; ``""`` for a child that inherits it (:attr:`card`).
    loadout: str
    log: RunLog
    budgets: BudgetPolicy
    declared: tuple[str, ...] = ()
    watchdog: Watchdog = attrs.field(init=False)
    requests: ChildRequests = attrs.field(init=False)
    #: The loadout itself, as the child gets it.
    card: ipc.Loadout | None = None
    launched: Launched | None = None
    #: Set once :attr:`launched` is known (a pane's hello is checked against its pid).
    started: trio.Event = attrs.Factory(trio.Event)
    channel: ipc.Channel | None = None
    connected: trio.Event = attrs.Factory(trio.Event)
    done: trio.Event = attrs.Factory(trio.Event)
    finishing: bool = False
    pausing: bool = False
    stopping: bool = False
    turn: Turn | None = None
    side_turn: Turn | None = None
    _prompts: list[str] = attrs.Factory(list)
    _prompt_ready: trio.Event = attrs.Factory(trio.Event)
    _nursery: trio.Nursery | None = None
    _slot: LaneSlot = attrs.field(init=False)
    _queued_scope: trio.CancelScope | None = None
    _turn_lock: trio.Lock = attrs.Factory(trio.Lock)
    #: One fetch of a remote child's context at a time (:meth:`_keep_context`).
    _context_lock: trio.Lock = attrs.Factory(trio.Lock)
    _early_steers: list[str] = attrs.Factory(list)
    _turns: int = 0
    _timed_out: bool = False
    #: A remote child's lease and certificate (:mod:`._terms`); None for a local child.
    terms: RemoteTerms | None = None
    #: What its backend said a revive resumes it from (a wake uses it).
    resume_id: str = ""
    #: Its result's JSON Schema and the one correction (docs/governance.md "Checked results").
    checked: CheckedResult | None = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.watchdog = Watchdog(self.budgets, on_timeout=self.on_timeout)
        self.checked = None if self.record.schema is None else CheckedResult(self.record.schema)
        self.requests = ChildRequests(run=self)
        self._slot = LaneSlot(self.host.lane)

    @property
    def key(self) -> str:
        return self.record.key

    # -- the supervisor's services, bound to this run (its requests call these) --------------

    async def nested_spawn(self, body: ipc.Spawn) -> ipc.Message:
        return await self.host.nested_spawn(self, body)

    def take_ownership(self, paths: Sequence[str]) -> ipc.Message:
        return self.host.take_ownership(self, paths)

    async def discuss(self, body: ipc.Discuss) -> ipc.Message:
        return await self.host.discuss_for(self, body)

    def new_question(self, text: str) -> Question:
        return self.host.new_question(self.key, text)

    def drop_question(self, qid: str) -> None:
        self.host.drop_question(qid)

    def notify_question(self, question: Question) -> None:
        self.host.notify(self.record, question=question)

    def on_usage(self, usage: ipc.Usage) -> None:
        self.host.spend.on_usage(self, usage)
        spent = self.host.spend.spent(self.key)
        if spent is not None:
            self.host.journal.spent(self.key, spent)  # survives a supervisor restart

    def gateway_refused(self, what: str, why: str) -> None:
        """A model request the gateway refused (a cap) or could not relay: the run log."""
        self.log.write(f"fleet: model gateway refused {what[:200]!r}: {why}")

    def provider_wait(self, line: str) -> None:
        """A model request waits on its provider's cooldown: ``peek`` says so."""
        self.record.touch(line)

    def flag_usage(self, line: str) -> None:
        """A usage report the ledger refused or clamped: the run log and the reject log."""
        self.log.write(f"fleet: usage report flagged: {line}")
        self.host.reject("usage", self.key, {"flag": line})

    def session_spent(self) -> bool:
        return self.host.spend.turn_refused(self.key)

    def resumable(self, resume_id: str) -> None:
        """The backend reported what a revive resumes it from: journaled at once."""
        self.resume_id = resume_id
        self.host.journal.resumable(self.key, self.record.backend, resume_id)

    def on_loop(self, trip: Trip, *, steer: bool) -> None:
        """The loop gate tripped: steer, or stop past its budget (:mod:`._loops`)."""
        if self._nursery is not None and not self.finishing:
            act = functools.partial(intervene, self, self.requests.loops, trip, steer=steer)
            self._nursery.start_soon(act)

    def dropped_settled(self, body: ipc.Settled, reason: str) -> None:
        """A ``settled`` frame no turn takes (late, or for a turn already ended): logged,
        counted in the channel's drops and in the reject log."""
        self.log.write(f"ignored a late settled frame for turn {body.turn}")
        if self.channel is not None:
            self.channel.drops["late-settled"] += 1
        self.host.reject(
            "dropped-frame", self.key, {"settled": body.turn, "side": body.side, "reason": reason}
        )

    # -- life -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Launch the child and serve it until its terminal state."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                if self.record.mode == "worktree" and self.key not in self.host.worktrees.snapshots:
                    made = await self.host.worktrees.create(self.key)
                    self.host.journal.worktree(self.key, made.as_json())
                self.launched = await self.host.launch(self, nursery)
            except Exception as exc:
                task_status.started()
                # A surface may classify its own failure (cmux: binary-missing, ...).
                kind = getattr(exc, "failure", "launch")
                await self.finish(State.FAILED, kind=kind, error=str(exc))
                return
            self.started.set()
            self.record.pid = self.launched.pid
            self.log.write(f"launched {self.launched.describe()}")
            nursery.start_soon(self._watch_exit)
            nursery.start_soon(self._handshake_deadline)
            nursery.start_soon(self.watchdog.run)
            nursery.start_soon(self._turn_worker)
            task_status.started()
            await self.done.wait()
            nursery.cancel_scope.cancel()

    async def _handshake_deadline(self) -> None:
        with trio.move_on_after(self.host.config.hello_timeout):
            await self.connected.wait()
            return
        await self.finish(
            State.FAILED,
            kind="handshake-timeout",
            error=f"no authenticated hello within {self.host.config.hello_timeout:g} s",
        )

    async def _watch_exit(self) -> None:
        assert self.launched is not None  # noqa: S101 - started after launch
        code = await self.launched.wait()
        if self.finishing:
            return
        if self.stopping and code == 0:
            # It obeyed our shutdown before stop() resumed: a clean stop, not a failure.
            await self.finish(State.STOPPED, kind="", error="")
            return
        kind, error = exit_failure(code, sandboxed=bool(self.record.sandboxed))
        await self.finish(State.FAILED, kind=kind, error=error)

    def on_timeout(self, kind: str) -> None:
        """Watchdog callback: the budget *kind* ran out."""
        if self._nursery is not None and not self.finishing:
            # From now on the active turn's result is rejected, even if it arrives before the
            # ending below has begun.
            self._timed_out = True
            budget = (
                self.watchdog.policy.idle_ms
                if kind == "idle"
                else self.watchdog.policy.max_total_ms
            )
            self._nursery.start_soon(
                self.finish, State.FAILED, kind, f"{kind} budget of {budget} ms ran out"
            )

    def _immediate(self, body: ipc.Message) -> ipc.Message | None:
        """Answers the channel's reader gives without a task: the lock table never awaits."""
        if isinstance(body, ipc.Ownership):
            return self.take_ownership(body.paths)
        if isinstance(body, ipc.Renew):
            if self.terms is None:
                return ipc.Reply(ok=False, error="this child holds no lease")
            return self.terms.renew(body)
        if isinstance(body, ipc.Event):
            return self.requests.check_tool(body)  # the loop gate, for a builtin agent
        return None

    async def attach(self, channel: ipc.Channel, hello: ipc.Envelope) -> None:
        """Bind an authenticated connection to this run and serve it until it ends."""
        if self.connected.is_set() or self.finishing:
            await channel.aclose("duplicate or late hello")
            return
        self.channel = channel
        if self.terms is not None:
            self.terms.heard()  # the hello's own lease
            if self._nursery is not None:
                self._nursery.start_soon(self.terms.watch_certificate, self._certificate_expired)
        await channel.reply(hello.corr, ipc.Reply(ok=True, data={"key": self.key}))
        self.connected.set()
        self.record.touch("connected")
        if self.record.state is State.STARTING and not self._prompts:
            self.record.state = State.IDLE
        try:
            await channel.serve(
                self.requests.handle, self.requests.on_event, immediate=self._immediate
            )
        finally:
            if channel.drops:
                drops = {"drops": dict(channel.drops), "flagged": channel.flagged}
                self.host.reject("dropped-frame", self.key, drops)
            if channel.flagged and not self.finishing:
                await self.finish(
                    State.FAILED,
                    kind="protocol",
                    error=f"connection closed after invalid frames ({dict(channel.drops)})",
                )
            elif not self.finishing:
                # The child dropped its connection: it is exiting or broken; give the
                # process a moment to exit so the failure is classified by its exit code.
                with trio.move_on_after(self.host.config.drain_timeout):
                    await self.done.wait()
                if not self.finishing:
                    await self.finish(
                        State.FAILED, kind="protocol", error="child closed its connection"
                    )

    # -- the parent's commands: each refused in one line when the state does not allow it ---

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

    # -- turns ------------------------------------------------------------------------------

    def queue_prompt(self, text: str) -> None:
        if self.record.state in TERMINAL or self.finishing:
            raise UsageError(f"{self.key} is {self.record.state}; it cannot take a prompt")
        self._prompts.append(text)
        self._prompt_ready.set()
        if self.record.state in {State.IDLE, State.PAUSED}:
            self.record.state = State.WORKING
            self.record.queued = True
            self.record.touch("queued")

    async def _turn_worker(self) -> None:
        await self.connected.wait()
        while True:
            while not self._prompts:
                self._prompt_ready = trio.Event()
                await self._prompt_ready.wait()
            text = self._prompts.pop(0)
            await self._run_turn(text)

    async def _run_turn(self, text: str) -> None:
        record = self.record
        record.state = State.WORKING
        record.queued = True
        record.touch(
            "queued for a lane slot" if self.host.lane.queued or self._slot.lane_full() else None
        )
        # A pause while queued cancels this wait and drops the prompt.
        with trio.CancelScope() as queued:
            self._queued_scope = queued
            await self._slot.take()
        if queued.cancel_called:
            self._queued_scope = None
            self._slot.give_back()  # paused after the slot was granted: give it back
            return
        async with self._turn_lock:
            self._queued_scope = None
            if _cancel_called(queued):  # (re-read after the await: mypy keeps it narrowed)
                # Paused while waiting for the lock (an ask's side turn takes it next): the
                # prompt is dropped, or it would start the turn the pause meant to stop.
                self._slot.give_back()
                return
            await self._run_prompt(text)

    def _new_turn(self) -> Turn:
        self._turns += 1
        turn = Turn(number=self._turns, side=False)
        self.turn = turn
        self.record.turn = turn.number
        return turn

    async def _run_prompt(self, text: str) -> None:
        record = self.record
        record.queued = False
        turn = self._new_turn()
        self.requests.loops.new_prompt()
        self.requests.evidence.new_turn()
        try:
            self.watchdog.start_active()
            record.touch("working")
            if not await self._prompt(turn, text, current_model(record)):
                return
            # A quota/rate-limit/overload failure: once more, on the role's next model.
            retry = None if self.finishing else fallback(record, self.card, turn.result)
            if retry is not None:
                self.log.write(
                    f"turn {turn.number} failed on quota; retrying on {record.models[-1]}"
                )
                # Journaled now, before the retry can settle: a supervisor killed after the
                # settle note must revive the child on the fallback, not the limited model.
                self.host.journal.changed(record)
                record.touch(f"retrying on {record.models[-1]}")
                turn = self._new_turn()
                if not await self._prompt(turn, text, retry):
                    return
        finally:
            self.watchdog.stop_active()
            self._slot.give_back()
            self.turn = None
        await self._check_result(turn)
        await self._observe(turn)
        await self._keep_context(turn.result.context if turn.result is not None else {})
        self._settled(turn)
        remote = isinstance(self.launched, LaunchedRay)
        if remote and self.record.backend in LATE_WRITERS and self._nursery is not None:
            self._nursery.start_soon(self._keep_context_later)
        self.host.spend.cross_check(self)  # what it reported against what the gateway metered

    async def _prompt(self, turn: Turn, text: str, model: int) -> bool:
        """Send *turn*'s prompt and wait for it to settle; ``False``: the child is going away."""
        try:
            await self._request(ipc.Prompt(text=text, turn=turn.number, model=model))
            for steer in self._early_steers:
                await self._request(ipc.Steer(text=steer))
        except OperationFailed as exc:
            if self.channel is not None and self.channel.closed:
                # The child is going away: its exit, not this request, classifies it.
                await self.done.wait()
                return False
            turn.result = ipc.Settled(turn=turn.number, text="", ok=False, error=str(exc))
            turn.settled.set()
        finally:
            self._early_steers.clear()
        await turn.settled.wait()
        return True

    async def _wait_connected(self) -> None:
        """Wait for the hello (or the end); refuse when the child ended first."""
        if not self.connected.is_set():
            await wait_first(self.connected, self.done)
        if self.finishing:
            raise OperationFailed(f"{self.key} ended before it connected: {self.record.error}")

    @contextlib.asynccontextmanager
    async def waiting_on_supervisor(self) -> AsyncIterator[None]:
        """The turn waits on the supervisor (a nested child): no lane slot, budgets paused.

        Holding the slot would deadlock a full lane (the nested child queues behind its own
        caller), and the wait is the parent's debt, like a pending question. The slot is taken
        back afterwards if the same turn is still running.
        """
        turn, held = self.turn, self._slot.held
        self._slot.give_back()
        self.watchdog.pause_for_question()
        try:
            yield
        finally:
            self.watchdog.resume_after_question()
        if held and not self.finishing:
            await self._slot.take()
            if self.finishing or self.turn is not turn:
                self._slot.give_back()

    def _settled(self, turn: Turn) -> None:
        result = turn.result
        record = self.record
        if result is None or self.finishing or self._timed_out:
            return
        self.host.cancel_questions(self.key)
        # Scrubbed before it is stored: a report may quote a sibling's token or the control
        # token, and the record feeds peek, wait, handoffs and the registry snapshot.
        scrub = self.log.secrets.scrub
        report, error = scrub(result.text), scrub(result.error)
        if report:
            record.report = report
        # The last turn's error, or none: a later good turn clears an earlier failure's.
        record.error = "" if result.ok else error
        if self.checked is not None and result.ok and not (result.aborted or self.pausing):
            verdict = self.checked.judge(report)
            record.result = verdict.value
            if not verdict.valid:
                self._reject_result(verdict)
                return
        notify = not (result.aborted and (self.pausing or self.stopping))
        if self.pausing or result.aborted:
            record.state = State.PAUSED
            record.touch("paused")
        elif self._prompts:
            record.state = State.WORKING
        else:
            record.state = State.IDLE
            record.touch("idle" if result.ok else f"turn failed: {error}")
            self.requests.turn_ended_idle()
        self.pausing = False
        if notify:
            self.host.notify(record, report=report, error=error)

    async def _observe(self, turn: Turn) -> None:
        """What the supervisor saw of *turn*, kept on the record for its settle note."""
        if turn.result is None or self.finishing:
            return
        files = await self.host.worktrees.observe(self.key)
        record = self.record
        self.record.observed = self.requests.evidence.observed(
            report=turn.result.text, tokens=record.tokens, cost_usd=record.cost_usd, files=files
        )

    async def _keep_context(self, sent: Mapping[str, Any] | None = None) -> None:
        """A remote child's resume context, kept on our side before its turn settles
        (:mod:`._context`): a revive needs it when the node is gone. *sent*: what the child
        sent with its ``Settled`` (its loadout asked); without it, fetched from its node."""
        launched = self.launched
        if self.finishing or not isinstance(launched, LaunchedRay):
            return
        resume = self.resume_id or (self.card.resume if self.card is not None else "")
        place = self.host.config.paths.scratch / self.key
        backend, ended = self.record.backend, lambda: self.finishing
        async with self._context_lock:
            if sent:
                await keep_sent(place, sent, backend, resume, log=self.log, ended=ended)
            else:
                await fetch_context(place, launched, backend, resume, log=self.log, ended=ended)

    async def _keep_context_later(self) -> None:
        """An agent CLI writes its session when it sees fit (Claude Code was seen writing a
        turn a moment after it settled): fetched again a little later, a next turn begun or
        not (its prompt may then be in the copy, as in a local child's own store)."""
        for delay in LATER_FETCH_S:
            await trio.sleep(delay)
            if self.finishing:
                return
            await self._keep_context()

    async def _check_result(self, turn: Turn) -> None:
        """A checked child's result validated before the settle judges it (in a killable
        process when its schema has patterns: a backtracking one must not stall the loop)."""
        result = turn.result
        if self.checked is not None and result is not None and result.ok and not result.aborted:
            report = self.log.secrets.scrub(result.text)
            self.checked.remember(report, await validate_safely(report, self.checked.schema))

    def _reject_result(self, verdict: Verdict) -> None:
        """A checked child's result failed its schema: one corrective turn first, else the end."""
        if verdict.steer:
            self._prompts.insert(0, verdict.steer)
            self._prompt_ready.set()
            self.log.write(f"result rejected; corrective steer: {verdict.steer}")
            self.record.touch("result invalid: asked once to correct it")
        elif self._nursery is not None:
            self._nursery.start_soon(self.finish, State.FAILED, "invalid-result", verdict.error)

    async def _request(self, message: ipc.Message) -> ipc.Message:
        if self.channel is None:
            raise OperationFailed(f"{self.key} is not connected yet")
        try:
            return await self.channel.request(message)
        except ipc.RequestError as exc:
            raise OperationFailed(f"{self.key}: {exc}") from None

    # -- the end: every way a child ends goes through finish, once ------------------------

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


def _cancel_called(scope: trio.CancelScope) -> bool:
    return scope.cancel_called
