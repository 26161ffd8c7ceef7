"""Who may vote in a democracy round, and the fleet operations a round runs through.

:class:`Electorate` is the narrow face of the fleet a round uses (the supervisor provides it);
the checks here run before anything is launched and refuse with one line naming the field.
"""

from collections.abc import Mapping, Sequence
from typing import Final, Protocol

import trio

from orchestrator._errors import CapacityError, FleetError
from orchestrator._records import ChildRecord, SpawnRequest, State
from orchestrator.coordination._ballots import RoundError

__all__ = [
    "DEFAULT_VOTERS",
    "MIN_VOTERS",
    "REFUSED",
    "VOTABLE",
    "Electorate",
    "Records",
    "Slots",
    "check_capacity",
    "nominees",
    "seat_count",
]

DEFAULT_VOTERS: Final = 4
MIN_VOTERS: Final = 2
REFUSED: Final = "democracy round refused"
VOTABLE: Final = frozenset({State.IDLE, State.PAUSED, State.HIBERNATED})


class Slots(Protocol):
    """The fleet's capacity as a round reads it: the cap and the live children it counts."""

    @property
    def cap(self) -> int: ...
    @property
    def used(self) -> int: ...


class Records(Protocol):
    """The fleet registry as a round reads it."""

    @property
    def records(self) -> Mapping[str, ChildRecord]: ...
    def find(self, ref: str, *, include_retired: bool = True) -> ChildRecord: ...


class Electorate(Protocol):
    """The fleet operations a round uses, wired by the supervisor (the composition root)."""

    @property
    def nursery(self) -> trio.Nursery: ...
    @property
    def capacity(self) -> Slots: ...
    @property
    def registry(self) -> Records: ...
    async def spawn(self, requests: Sequence[SpawnRequest]) -> list[ChildRecord]: ...
    async def prompt(self, ref: str, text: str) -> ChildRecord: ...
    async def pause(self, ref: str) -> object: ...
    async def stop(self, refs: Sequence[str]) -> object: ...
    async def discard(self, ref: str) -> str: ...
    def run_done(self, key: str) -> trio.Event | None:
        """The event set when *key*'s process is done, or ``None`` if it has no run."""


def seat_count(voters: int | None, cap: int) -> int:
    """The seats a round fills: *voters* checked against the cap, or the default."""
    if voters is None:
        return min(DEFAULT_VOTERS, cap)
    if isinstance(voters, bool) or not isinstance(voters, int) or not MIN_VOTERS <= voters <= cap:
        raise RoundError(
            f"{REFUSED}: voters {voters!r} is not {MIN_VOTERS}-{cap} (a strict majority "
            f"needs {MIN_VOTERS} voters and a round never exceeds max_subagents {cap})",
            field="voters",
        )
    return voters


def nominees(registry: Records, agents: Sequence[str], seats: int) -> list[ChildRecord]:
    """The nominated voters: live, idle or paused scouts, each named once."""
    if len(agents) > seats:
        raise RoundError(
            f"{REFUSED}: {len(agents)} nominated voters for {seats} seats "
            "(nominate at most --voters scouts)",
            field="agents",
        )
    chosen: dict[str, str] = {}
    records = []
    for ref in agents:
        try:
            record = registry.find(ref, include_retired=False)
        except FleetError as exc:
            raise RoundError(f"{REFUSED}: nominee {ref[:80]!r}: {exc}", field="agents") from None
        who = f"{record.key} ({record.name})"
        if record.key in chosen:
            raise RoundError(
                f"{REFUSED}: {who} is nominated twice (as {chosen[record.key]!r} and "
                f"{ref!r}) (name each voter once)",
                field="agents",
            )
        if record.mode != "scout":
            kind = {"fork": "a fork", "worktree": "a worker"}.get(record.mode, record.mode)
            raise RoundError(
                f"{REFUSED}: {who} is {kind}, not a scout (only read-only scouts vote; "
                "nominate a scout or leave the seat to a fresh one)",
                field="agents",
            )
        if record.state not in VOTABLE or record.queued:
            raise RoundError(
                f"{REFUSED}: {who} is {record.state}, not idle or paused "
                "(wait for it to settle, pause it, or nominate another scout)",
                field="agents",
            )
        chosen[record.key] = ref
        records.append(record)
    return records


def check_capacity(capacity: Slots, fresh: int) -> None:
    """Refuse a round whose fresh voters would not fit in the free slots."""
    free = max(0, capacity.cap - capacity.used)
    if fresh > free:
        raise CapacityError(
            f"vote: {fresh} fresh voter(s) need free slots but max_subagents {capacity.cap} "
            f"has {free} free ({capacity.used} live) (nominate idle scouts with --agents, "
            "lower --voters, or stop children yourself; a round never stops one)"
        )
