"""A map's spawns, coalesced: the rows waiting for a child are spawned together, as one batch.

The supervisor spawns one batch at a time (plans, names and reservations are checked against a
settled fleet), so W workers each spawning one child would launch one child per spawn's whole
round trip. :class:`Spawner` takes every row waiting when it wakes, up to the fleet's free
capacity, and spawns them in one call — still reserved atomically, never past the cap. A full
fleet makes rows wait for :meth:`Spawner.given_back` (or a short retry), never fail. A batch
refused for another reason is spawned again one row at a time, so each row gets its own error.
"""

from collections.abc import Sequence
from typing import Any, Final, Protocol

import attrs
import trio

from orchestrator._errors import CapacityError, FleetError
from orchestrator._records import ChildRecord, SpawnRequest

__all__ = ["CAPACITY_RETRY", "Spawner"]

#: How long rows wait for a slot of a full fleet before they look again (seconds).
CAPACITY_RETRY: Final = 0.2


class SpawnFleet(Protocol):
    @property
    def capacity(self) -> Any: ...

    async def spawn(self, requests: Sequence[SpawnRequest]) -> list[ChildRecord]: ...
    async def discard(self, ref: str) -> str: ...


@attrs.define(eq=False)
class _Ask:
    request: SpawnRequest
    done: trio.Event = attrs.Factory(trio.Event)
    record: ChildRecord | None = None
    error: FleetError | None = None
    #: Its row stopped waiting (the map was cancelled): a child spawned for it is discarded.
    abandoned: bool = False


@attrs.define(eq=False)
class Spawner:
    """Spawns for one map; :meth:`serve` runs in the map's nursery."""

    fleet: SpawnFleet
    _pending: list[_Ask] = attrs.Factory(list)
    _wake: trio.Event = attrs.Factory(trio.Event)
    _freed: trio.Event = attrs.Factory(trio.Event)
    #: Children spawned for rows that had stopped waiting.
    orphans: list[str] = attrs.Factory(list)

    async def spawn(self, request: SpawnRequest) -> ChildRecord:
        """One child for *request* (raises the :class:`FleetError` that refused it)."""
        ask = _Ask(request=request)
        self._pending.append(ask)
        self._wake.set()
        try:
            await ask.done.wait()
        except BaseException:
            ask.abandoned = True
            if ask in self._pending:
                self._pending.remove(ask)
            raise
        if ask.error is not None:
            raise ask.error
        assert ask.record is not None  # noqa: S101 - set with done
        return ask.record

    def given_back(self) -> None:
        """A slot was freed: rows waiting for capacity look again."""
        self._freed.set()
        self._freed = trio.Event()

    async def serve(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._pending:
                capacity = self.fleet.capacity
                free = capacity.cap - capacity.used
                if free <= 0:
                    await self._wait_for_room()
                    continue
                batch = self._pending[:free]
                del self._pending[:free]
                try:
                    records = await self.fleet.spawn([ask.request for ask in batch])
                except CapacityError:
                    self._pending[:0] = batch  # someone else took the room: wait, in order
                    await self._wait_for_room()
                    continue
                except FleetError as exc:
                    if len(batch) == 1:
                        self._answer(batch[0], None, exc)
                        continue
                    for ask in batch:  # each row its own error
                        await self._one(ask)
                    continue
                for ask, record in zip(batch, records, strict=True):
                    self._answer(ask, record, None)

    async def _one(self, ask: _Ask) -> None:
        while True:
            try:
                [record] = await self.fleet.spawn([ask.request])
            except CapacityError:
                await self._wait_for_room()
                continue
            except FleetError as exc:
                self._answer(ask, None, exc)
                return
            self._answer(ask, record, None)
            return

    async def _wait_for_room(self) -> None:
        with trio.move_on_after(CAPACITY_RETRY):
            await self._freed.wait()

    def _answer(self, ask: _Ask, record: ChildRecord | None, error: FleetError | None) -> None:
        if ask.abandoned and record is not None:
            self.orphans.append(record.key)  # its row is gone: the map's end discards it
        ask.record, ask.error = record, error
        ask.done.set()
