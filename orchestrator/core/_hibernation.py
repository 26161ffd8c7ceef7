"""Hibernation: an idle child whose backend can resume gives its process up and keeps the rest.

With ``subagents.hibernate_after_s`` set, a top-level child that has been idle that long (0:
at once) and could be revived (:func:`orchestrator.core._revive.why_not`) is stopped without
finalizing: its process ends (asked to shut down first, so a CLI backend writes its session
out), but its record, key, name, worktree, ownership locks, budget account and context stay,
and ``peek`` shows it ``hibernated``. It holds no live slot (``max_subagents``); live and
hibernated children together are bounded by ``subagents.max_retained``.

A prompt (``resume``, a vote's ballot prompt) to a hibernated child is queued and wakes it in
the background; ``ask`` waits for it to be back; a steer rides on a queued prompt. A wake is
revive's launch (:func:`~orchestrator.core._revive.launch_again`): the same loadout, marked
restarted, resumed from its transcript or session. When the live cap is full, the longest
idle child that could hibernate does so at once to make room; otherwise the wake waits for a
slot. Stopping or discarding a hibernated child finalizes it as a stop would.
"""

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs
import trio

import ipc
from orchestrator._errors import FleetError, Refused, UsageError
from orchestrator._records import TERMINAL, ChildRecord, State
from orchestrator.core._isolation import settle_worktree
from orchestrator.core._remote import REMOTE_SURFACES
from orchestrator.core._revive import REVIVABLE, Revival, launch_again, why_not

if TYPE_CHECKING:
    from orchestrator.core._host import SpawnHost
    from orchestrator.core._run import ChildRun, Question
    from orchestrator.core._spawning import Spawning
    from orchestrator.governance._ownership import LockTable

    class Host(SpawnHost[ChildRun], Protocol):
        """The supervisor, as hibernation sees it."""

        @property
        def questions(self) -> dict[str, Question]: ...
        @property
        def locks(self) -> LockTable: ...
        @property
        def spawning(self) -> Spawning: ...
        def run_for(self, ref: str) -> ChildRun: ...


__all__ = ["Hibernation"]


#: How often idle children are looked at, and a full cap is looked at again (seconds).
POLL: Final = 0.05
#: How long after a failed check a child's backend is looked at again (a CLI may write its
#: session file a moment after its turn ended).
RECHECK: Final = 1.0


@attrs.define(eq=False)
class _Sleeper:
    """A hibernated child: its last run (for its log) and how it wakes."""

    run: "ChildRun"
    revival: Revival


@attrs.define(eq=False)
class Hibernation:
    """The supervisor's hibernated children, and the task that puts idle ones to sleep."""

    sup: "Host"
    after_s: float | None = None
    sleeping: dict[str, _Sleeper] = attrs.Factory(dict)
    #: Each live child's loadout fields, as spawned (what a wake launches it with).
    _fields: dict[str, dict[str, Any]] = attrs.Factory(dict)
    _idle_since: dict[str, float] = attrs.Factory(dict)
    _recheck_at: dict[str, float] = attrs.Factory(dict)
    #: Children an ``ask`` or a queued prompt is about to use: not put to sleep meanwhile.
    _holds: dict[str, int] = attrs.Factory(dict)
    _waking: dict[str, trio.Event] = attrs.Factory(dict)
    #: Children whose process is being shut down for hibernation.
    _falling: dict[str, trio.Event] = attrs.Factory(dict)
    _pending: dict[str, list[str]] = attrs.Factory(dict)
    _steers: dict[str, list[str]] = attrs.Factory(dict)
    #: Set when a child that hibernated ends for good (a voter's seat waits on it).
    _ended: dict[str, trio.Event] = attrs.Factory(dict)

    def start(self, nursery: trio.Nursery) -> None:
        if self.after_s is not None:
            nursery.start_soon(self._keep)

    def spawned(self, record: ChildRecord, fields: Mapping[str, Any]) -> None:
        """*record* launches with these loadout *fields* (a wake launches it with them too)."""
        self._fields[record.key] = dict(fields)

    def ended(self, key: str) -> trio.Event | None:
        """The event set when *key*, hibernated or waking, ends for good; ``None`` for any
        other child."""
        if not (self.asleep(key) or key in self._waking or key in self._pending):
            return None
        return self._ended.setdefault(key, trio.Event())

    def asleep(self, key: str) -> bool:
        """Whether *key* is hibernated, or going to be (its process is shutting down)."""
        return key in self.sleeping or key in self._falling

    # -- going to sleep ---------------------------------------------------------------------

    def _could_sleep(self, run: "ChildRun") -> bool:
        record = self.sup.registry.records.get(run.key)
        if record is None or record.state is not State.IDLE or record.queued:
            return False
        busy = run.turn is not None or run.side_turn is not None or run.finishing
        if busy or run.stopping or not run.connected.is_set() or run.key in self._holds:
            return False
        if record.parent is not None or run.key not in self._fields:
            return False  # a nested child's parent waits on its run
        if record.backend not in REVIVABLE or record.surface in REMOTE_SURFACES:
            return False
        if trio.current_time() < self._recheck_at.get(run.key, 0.0):
            return False
        records = self.sup.registry.records.values()
        asked = any(q.key == run.key for q in self.sup.questions.values())
        return not asked and not any(r.parent == run.key for r in records)

    def _revival(self, run: "ChildRun") -> Revival | None:
        """How *run*'s child wakes, or ``None`` when its backend cannot resume it."""
        record, sup = run.record, self.sup
        loadout = dict(self._fields[run.key])
        loadout["resume"] = run.resume_id or loadout.get("resume") or ""
        snapshot = sup.worktrees.snapshots.get(run.key)
        worktree = None if snapshot is None else snapshot.as_json()
        revival = Revival(
            key=record.key,
            name=record.name,
            agent=record.agent,
            mode=record.mode,
            task=record.task,
            backend=record.backend,
            surface=record.surface,
            workflow_mode=record.workflow_mode,
            depth=record.depth,
            loadout=loadout,
            worktree=worktree,
            locks=sup.locks.snapshot().get(run.key, ()),
            report=record.report,
            schema=record.schema,
            role=record.role,
            models=tuple(record.models),
        )
        return None if why_not(revival, sup.config.paths.scratch / run.key) else revival

    async def _keep(self) -> None:
        """Put each child idle for ``after_s`` to sleep, forever."""
        assert self.after_s is not None  # noqa: S101 - started only when it is set
        while True:
            now = trio.current_time()
            for run in list(self.sup.runs.values()):
                if not self._could_sleep(run):
                    self._idle_since.pop(run.key, None)
                    continue
                since = self._idle_since.setdefault(run.key, now)
                if now - since >= self.after_s:
                    await self.hibernate(run)
            await trio.sleep(POLL)

    async def hibernate(self, run: "ChildRun") -> bool:
        """Stop *run*'s process without finalizing; ``False`` when it cannot sleep now."""
        if not self._could_sleep(run):
            return False
        revival = self._revival(run)
        if revival is None:  # its session is not (yet) where a resume reads it
            self._recheck_at[run.key] = trio.current_time() + RECHECK
            return False
        sup, record = self.sup, run.record
        run.finishing = True  # every other ending leaves it alone from now on
        falling = self._falling[run.key] = trio.Event()
        with trio.CancelScope(shield=True):
            if run.channel is not None and not run.channel.closed:
                with trio.move_on_after(1.0), contextlib.suppress(ipc.RequestError):
                    await run.channel.request(ipc.Shutdown())
                run.channel.close("hibernated")
            if run.launched is not None:
                with trio.move_on_after(sup.config.kill_grace):
                    await run.launched.wait()  # a clean exit writes its session out
                await run.launched.terminate(sup.config.kill_grace)
                await run.launched.drain(sup.config.drain_timeout)
        self._idle_since.pop(run.key, None)
        sup.runs.pop(run.key, None)
        self.sleeping[run.key] = _Sleeper(run=run, revival=revival)
        sup.capacity.hibernate()
        record.pid = None
        if run.key not in self._pending:  # (a prompt that came meanwhile wakes it at once)
            record.state = State.HIBERNATED
            record.touch("hibernated")
        run.log.write("fleet: hibernated (its context is kept; a prompt or ask wakes it)")
        run.log.flush()
        sup.journal.hibernated(record)
        del self._falling[run.key]
        falling.set()
        run.done.set()  # its run's tasks end; its process is gone
        sup.notes.changed()
        return True

    # -- waking -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def awake(self, ref: str) -> AsyncIterator["ChildRun"]:
        """The run of the child *ref*, woken first if it sleeps; it stays awake meanwhile."""
        record = self.sup.registry.find(ref, include_retired=False)
        key = record.key
        self._holds[key] = self._holds.get(key, 0) + 1
        try:
            while key not in self.sup.runs or key in self._falling:
                if key in self._falling:
                    await self._falling[key].wait()
                elif key in self._waking:
                    await self._waking[key].wait()
                elif key in self.sleeping:
                    await self._wake(record)
                else:
                    break
            yield self.sup.run_for(key)
        finally:
            self._holds[key] -= 1
            if not self._holds[key]:
                del self._holds[key]

    async def _wake(self, record: ChildRecord) -> None:
        key, sup = record.key, self.sup
        sleeper = self.sleeping[key]
        reason = why_not(sleeper.revival, sup.config.paths.scratch / key)
        if reason:
            raise Refused(f"wake: {key}: {reason} (fleet stop {key} finalizes it)")
        done = self._waking[key] = trio.Event()
        try:
            await self._take_slot()
            del self.sleeping[key]
            record.state = State.STARTING
            record.touch("waking from hibernation")
            try:
                await launch_again(sup, sup.spawning, record, sleeper.revival)
            except BaseException:
                sup.runs.pop(key, None)
                self.sleeping[key] = sleeper
                sup.capacity.hibernate()
                record.state = State.HIBERNATED
                raise
            sup.journal.woke(record)
        finally:
            del self._waking[key]
            done.set()

    async def _take_slot(self) -> None:
        """A live slot for a waking child: free, made by putting the idlest child to sleep,
        or waited for."""
        while not self.sup.capacity.wake():
            idle = [run for run in self.sup.runs.values() if self._could_sleep(run)]
            idle.sort(key=lambda run: self._idle_since.get(run.key, trio.current_time()))
            for run in idle:
                if await self.hibernate(run):
                    break
            else:
                await trio.sleep(POLL)

    def prompt(self, record: ChildRecord, text: str) -> None:
        """Queue *text* for the hibernated *record* and wake it in the background."""
        pending = self._pending.setdefault(record.key, [])
        pending.append(text)
        record.state, record.queued = State.WORKING, True
        record.touch("waking from hibernation")
        if len(pending) == 1:
            self.sup.nursery.start_soon(self._deliver, record)

    def steer(self, record: ChildRecord, text: str) -> None:
        """A steer for a hibernated child rides on its queued prompt."""
        if record.key not in self._pending:
            raise UsageError(
                f"steer: {record.key} is hibernated, not working (fleet resume wakes it "
                "with a prompt)"
            )
        self._steers.setdefault(record.key, []).append(text)
        record.touch("steer queued")

    async def _deliver(self, record: ChildRecord) -> None:
        key = record.key
        try:
            async with self.awake(key) as run:
                for text in self._pending.pop(key, []):
                    run.queue_prompt(text)
                for text in self._steers.pop(key, []):
                    await run.steer(text)
        except FleetError as exc:
            self._pending.pop(key, None)
            self._steers.pop(key, None)
            if record.state in TERMINAL:
                return  # stopped before it woke: its handoff says so
            if key in self.sleeping:
                record.state, record.queued = State.HIBERNATED, False
            record.touch(f"wake failed: {exc}")
            self.sup.notify(record, error=str(exc))

    # -- the end ----------------------------------------------------------------------------

    async def finish(self, key: str) -> dict[str, Any]:
        """Finalize a hibernated child as a stop would: copy-back, locks, handoff (a child
        woken meanwhile is stopped)."""
        self._pending.pop(key, None)
        self._steers.pop(key, None)
        while key in self._waking:
            await self._waking[key].wait()
        if key not in self.sleeping:
            run = self.sup.runs.get(key)
            record = self.sup.registry.find(key)
            handoff: dict[str, Any] = record.handoff() if run is None else await run.stop()
            return handoff
        sleeper = self.sleeping.pop(key)
        self._fields.pop(key, None)
        run, record = sleeper.run, sleeper.run.record
        if record.mode == "worktree":
            await settle_worktree(self.sup.worktrees, record, run.log, copy_back=True)
        record.state, record.queued = State.STOPPED, False
        record.touch("stopped")
        self.sup.capacity.reclaim()  # the release below gives it back
        await self.sup.release(run)
        # Handed off: nothing can resume it now, so its backend's session store goes.
        await self.sup.drop_scratch(key)
        return record.handoff()

    def forget(self, key: str) -> None:
        """*key*'s run ended for good (its loadout fields are no longer needed)."""
        self._fields.pop(key, None)
        self._idle_since.pop(key, None)
        self._recheck_at.pop(key, None)
        ended = self._ended.pop(key, None)
        if ended is not None:
            ended.set()
