"""Democracy rounds against a live fleet: seat the voters, collect every ballot, tally.

The rules are pure and live in :mod:`._ballots`; this module runs them. A round

1. checks the request (``validate_request``), the electorate and capacity, and refuses with one
   line before anything is launched;
2. spawns fresh read-only scouts for the unfilled seats and resumes the nominated idle or paused
   scouts, every voter getting ``voter_prompt`` with the round's fresh nonce;
3. collects one ballot per seat. The supervisor hands a voter's settle note to
   :meth:`Democracy.collect` instead of the parent's notes, so nothing is shown before every
   ballot is in. A voter whose turn or process fails is ``failed``; one that ends without a turn
   result (stopped or discarded by someone) is ``missing``; the rest go through ``parse_ballot``;
4. at the deadline cancels the voters still running, recording them ``failed`` (a nominated
   scout cancelled this way is retired: stopped);
5. discards the round's fresh scouts (so they neither hold capacity nor push the parent's retained
   reports out), then tallies: a ``winner`` only by strict majority of all invited seats,
   ``needs-user`` with the leading options otherwise, ``failed`` when no voter returned a ballot.

One round runs at a time. :meth:`Democracy.abort` — or cancelling :meth:`Democracy.vote` —
invalidates the running round: it ends ``failed`` with no ballots, and nominated voters still
voting are paused. A majority is a recommendation; a round implements nothing.
"""

import collections
import math
from collections.abc import Sequence
from typing import Any, Final, Literal

import attrs
import trio

from orchestrator._errors import FleetError, NotFound, UsageError
from orchestrator._records import ChildRecord, SpawnRequest, clip
from orchestrator._sync import wait_first
from orchestrator.coordination._ballots import (
    MAX_REASON,
    Ballot,
    RoundError,
    RoundRequest,
    new_nonce,
    parse_ballot,
    tally,
    validate_request,
    voter_prompt,
)
from orchestrator.coordination._electorate import (
    DEFAULT_VOTERS,
    MIN_VOTERS,
    REFUSED,
    VOTABLE,
    Electorate,
    check_capacity,
    nominees,
    seat_count,
)
from orchestrator.coordination._outcome import Leading, Outcome

__all__ = [
    "DEFAULT_DEADLINE",
    "DEFAULT_VOTERS",
    "KEPT_ROUNDS",
    "MIN_VOTERS",
    "VOTER_AGENT",
    "Democracy",
    "Electorate",
    "Leading",
    "Outcome",
    "Round",
]

DEFAULT_DEADLINE: Final = 600.0
KEPT_ROUNDS: Final = 8
VOTER_AGENT: Final = "scout"


@attrs.define(eq=False)
class _Seat:
    """One voter's place; a fresh seat's key is known once its spawn returns."""

    name: str
    fresh: bool
    key: str | None = None
    ballot: Ballot | None = None
    prompted: bool = False
    cancelled: bool = False
    done: trio.Event = attrs.Factory(trio.Event)

    def record(self, ballot: Ballot) -> None:
        if self.ballot is None:
            self.ballot = ballot
            self.done.set()


def _unheard(voter: str, status: Literal["missing", "failed"], reason: str) -> Ballot:
    return Ballot(
        voter=voter, status=status, option=None, rationale="", reason=clip(reason, MAX_REASON)
    )


@attrs.define(eq=False)
class Round:
    """One round: its seats, nonce, and (once ``finished`` is set) its :class:`Outcome`."""

    id: str
    nonce: str
    request: RoundRequest
    seats: list[_Seat]
    deadline: float
    outcome: Outcome | None = None
    finished: trio.Event = attrs.Factory(trio.Event)
    closed: bool = False
    aborted: bool = False
    scope: trio.CancelScope | None = None

    @property
    def voters(self) -> list[str]:
        return [seat.key or seat.name for seat in self.seats]

    def seat_for(self, record: ChildRecord) -> _Seat | None:
        for seat in self.seats:
            if seat.key == record.key or (seat.key is None and seat.name == record.name):
                return seat
        return None


@attrs.define(eq=False)
class Democracy:
    """The supervisor's round runner (``Supervisor.democracy``)."""

    fleet: Electorate
    current: Round | None = None
    rounds: collections.OrderedDict[str, Round] = attrs.Factory(collections.OrderedDict)
    _ids: int = 0

    async def vote(
        self,
        request: Any,
        *,
        agents: Sequence[str] = (),
        voters: int | None = None,
        deadline: float = DEFAULT_DEADLINE,
        model: str | None = None,
    ) -> Outcome:
        """Run a round to its end; cancelling this call aborts (invalidates) the round."""
        running = await self.start(
            request, agents=agents, voters=voters, deadline=deadline, model=model
        )
        try:
            await running.finished.wait()
        finally:
            if not running.finished.is_set():
                with trio.CancelScope(shield=True):
                    await self.abort(running.id)
        assert running.outcome is not None  # noqa: S101 - set before finished
        return running.outcome

    async def start(
        self,
        request: Any,
        *,
        agents: Sequence[str] = (),
        voters: int | None = None,
        deadline: float = DEFAULT_DEADLINE,
        model: str | None = None,
    ) -> Round:
        """Check everything, launch the voters and return the running round.

        Raises :class:`RoundError` (a round runs already, a gate fails, a nominee cannot vote)
        or :class:`CapacityError` before anything is launched; errors from spawning the fresh
        voters propagate with nothing left running.
        """
        if self.current is not None:
            raise RoundError(
                f"{REFUSED}: round {self.current.id} is still running "
                "(wait for its result, or invalidate it with fleet vote --abort)",
                field="round",
            )
        checked = validate_request(request)
        seats = seat_count(voters, self.fleet.capacity.cap)
        if isinstance(deadline, bool) or not isinstance(deadline, int | float):
            raise UsageError(f"vote: deadline {deadline!r} is not a number of seconds")
        if not (math.isfinite(deadline) and deadline > 0):
            raise UsageError(f"vote: deadline {deadline!r} must be a positive number of seconds")
        nominated = nominees(self.fleet.registry, agents, seats)
        check_capacity(self.fleet.capacity, seats - len(nominated))
        self._ids += 1
        round_id = f"r{self._ids}"
        running = Round(
            id=round_id,
            nonce=new_nonce(),
            request=checked,
            deadline=float(deadline),
            seats=[_Seat(name=r.name, key=r.key, fresh=False) for r in nominated]
            + [
                _Seat(name=f"voter-{round_id}-{n}", fresh=True)
                for n in range(1, seats - len(nominated) + 1)
            ],
        )
        self.current = running  # before any await: from here a second round is refused
        self.rounds[round_id] = running
        while len(self.rounds) > KEPT_ROUNDS:
            self.rounds.popitem(last=False)
        try:
            await self._launch(running, model)
            await self.fleet.nursery.start(self._run, running)
        except BaseException as exc:
            if not running.finished.is_set():
                started = [s for s in running.seats if s.fresh or s.prompted]
                with trio.CancelScope(shield=True):
                    await self._retire(running, started, pause=True)
                running.outcome = Outcome(
                    round=round_id, status="failed", invited=seats, reason=f"not started: {exc}"
                )
                self.current = None
                running.finished.set()
            raise
        return running

    async def wait(
        self,
        round_id: str,
        timeout: float,  # noqa: ASYNC109 - one slice of fleet vote's wait
    ) -> Outcome | None:
        """The outcome of *round_id* once it ends, or ``None`` if it runs past *timeout*."""
        found = self.rounds.get(round_id)
        if found is None:
            raise NotFound(f"vote: no round {round_id!r} in this session (rounds are r1, r2, ...)")
        with trio.move_on_after(timeout):
            await found.finished.wait()
        return found.outcome

    async def abort(self, round_id: str | None = None) -> Outcome:
        """Invalidate the running round (``round_id``, when given, must name it)."""
        running = self.current
        if running is None or (round_id is not None and round_id != running.id):
            what = "no round is running" if round_id is None else f"round {round_id} is not running"
            raise NotFound(f"vote --abort: {what} (nothing to abort)")
        running.aborted = True
        if running.scope is not None:
            running.scope.cancel()
        await running.finished.wait()
        assert running.outcome is not None  # noqa: S101 - set before finished
        return running.outcome

    def collect(self, record: ChildRecord, *, report: str, error: str, failure: bool) -> bool:
        """Take a settle note if it belongs to a voter of the running round.

        Called by the supervisor before a note reaches the parent; ``True`` means the note was
        a ballot (or came from a voter after the round closed) and must not be shown.
        """
        running = self.current
        seat = None if running is None else running.seat_for(record)
        if running is None or seat is None:
            return False
        if not running.closed:
            seat.key = record.key
            if failure or error:
                seat.record(_unheard(record.key, "failed", error or "the voter failed"))
            else:
                ids = {option.id for option in running.request.options}
                seat.record(parse_ballot(record.key, report, running.nonce, ids))
        return True

    # -- the round --------------------------------------------------------------------------

    async def _launch(self, running: Round, model: str | None) -> None:
        prompt = voter_prompt(running.request, running.nonce)
        fresh = [seat for seat in running.seats if seat.fresh]
        if fresh:
            records = await self.fleet.spawn(
                [
                    SpawnRequest(task=prompt, agent=VOTER_AGENT, name=seat.name, model=model)
                    for seat in fresh
                ]
            )
            for seat, spawned in zip(fresh, records, strict=True):
                seat.key = spawned.key
        for seat in running.seats:
            if seat.fresh:
                continue
            key = seat.key or seat.name
            # Checked again with no await before the prompt: the spawn above yielded, and a
            # voter resumed meanwhile would settle the parent's turn first, not its ballot.
            record = self.fleet.registry.records.get(key)
            if record is None or record.state not in VOTABLE or record.queued:
                state = "gone" if record is None else str(record.state)
                seat.record(_unheard(key, "failed", f"{state} when the round began"))
                continue
            await self.fleet.prompt(key, prompt)
            seat.prompted = True

    async def _run(
        self, running: Round, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            with trio.CancelScope() as scope:
                running.scope = scope
                if running.aborted:
                    scope.cancel()
                task_status.started()
                with trio.move_on_after(running.deadline):
                    async with trio.open_nursery() as nursery:
                        for seat in running.seats:
                            nursery.start_soon(self._await_ballot, seat)
        finally:
            with trio.CancelScope(shield=True):
                await self._close(running)

    async def _await_ballot(self, seat: _Seat) -> None:
        done = self.fleet.run_done(seat.key or "")
        if done is not None:
            await wait_first(seat.done, done)
        # A failed voter's note arrives before its run is done; only a quiet end is left here.
        seat.record(_unheard(seat.key or seat.name, "missing", "ended before it voted"))

    async def _close(self, running: Round) -> None:
        running.closed = True
        for seat in running.seats:
            if seat.ballot is None:
                seat.cancelled = True
                seat.record(
                    _unheard(
                        seat.key or seat.name,
                        "failed",
                        f"no ballot within the {running.deadline:g} s deadline; cancelled",
                    )
                )
        leaving = [seat for seat in running.seats if seat.fresh or seat.cancelled]
        await self._retire(running, leaving, pause=running.aborted)
        running.outcome = self._outcome(running)
        self.current = None
        running.finished.set()

    async def _retire(self, running: Round, seats: Sequence[_Seat], *, pause: bool) -> None:
        """Discard fresh voters; stop (or, on abort, pause) nominated ones cancelled mid-vote."""

        async def retire(seat: _Seat) -> None:
            ref = seat.key or seat.name
            try:
                if seat.fresh:
                    await self.fleet.discard(ref)
                elif pause:
                    await self.fleet.pause(ref)
                else:
                    await self.fleet.stop([ref])
            except FleetError:
                return  # already gone: someone stopped or discarded it

        async with trio.open_nursery() as nursery:
            for seat in seats:
                nursery.start_soon(retire, seat)

    def _outcome(self, running: Round) -> Outcome:
        invited = len(running.seats)
        if running.aborted:
            reason = f"round {running.id} was aborted; its ballots are void (start a new round)"
            return Outcome(round=running.id, status="failed", invited=invited, reason=reason)
        ballots = tuple(seat.ballot for seat in running.seats if seat.ballot is not None)
        if all(ballot.status in {"failed", "missing"} for ballot in ballots):
            reason = "no voter returned a ballot (see each ballot's reason)"
            return Outcome(
                round=running.id, status="failed", invited=invited, ballots=ballots, reason=reason
            )
        result = tally(ballots, invited)
        options = {option.id: option for option in running.request.options}
        leading = tuple(
            Leading(
                id=option,
                title=options[option].title,
                tradeoffs=options[option].tradeoffs,
                votes=result.counts[option],
                rationales=tuple(b.rationale for b in ballots if b.option == option),
            )
            for option in result.leading
        )
        return Outcome(
            round=running.id,
            status=result.status,
            invited=invited,
            ballots=ballots,
            winner=result.winner,
            counts=result.counts,
            leading=leading,
        )
