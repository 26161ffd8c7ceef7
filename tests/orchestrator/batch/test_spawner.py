"""A map's spawner: waiting rows spawn together, within free capacity, never past the cap."""

from collections.abc import Sequence

import attrs
import trio

from orchestrator._errors import CapacityError, UsageError
from orchestrator._records import ChildRecord, SpawnRequest
from orchestrator.batch._spawner import Spawner


@attrs.define
class FakeCapacity:
    cap: int
    used: int = 0


@attrs.define
class FakeFleet:
    capacity: FakeCapacity
    batches: list[list[str]] = attrs.Factory(list)
    refuse: set[str] = attrs.Factory(set)
    peak: int = 0

    async def spawn(self, requests: Sequence[SpawnRequest]) -> list[ChildRecord]:
        await trio.sleep(0.1)  # a spawn's round trip
        if self.capacity.used + len(requests) > self.capacity.cap:
            raise CapacityError("full")
        bad = [r.task for r in requests if r.task in self.refuse]
        if bad:
            raise UsageError(f"spawn: {bad[0]} refused")
        self.capacity.used += len(requests)
        self.peak = max(self.peak, self.capacity.used)
        self.batches.append([r.task for r in requests])
        return [
            ChildRecord(
                key=f"a{r.task}",
                name=r.task,
                agent="scout",
                mode="scout",
                task=r.task,
                workspace="/",
                backend="builtin",
            )
            for r in requests
        ]

    async def discard(self, ref: str) -> str:
        return ref


async def test_rows_waiting_together_spawn_in_one_batch_within_free_capacity(autojump_clock):
    fleet = FakeFleet(capacity=FakeCapacity(cap=3))
    spawner = Spawner(fleet=fleet)
    got: list[str] = []

    async def row(task: str) -> None:
        record = await spawner.spawn(SpawnRequest(task=task))
        got.append(record.key)
        await trio.sleep(1)
        fleet.capacity.used -= 1
        spawner.given_back()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(spawner.serve)
        async with trio.open_nursery() as rows:
            for n in range(7):
                rows.start_soon(row, str(n))
        nursery.cancel_scope.cancel()
    assert sorted(got) == [f"a{n}" for n in range(7)]
    assert fleet.peak == 3
    assert [len(b) for b in fleet.batches][:1] == [3]
    assert len(fleet.batches) < 7  # batched, not one spawn per row


async def test_a_refused_batch_is_retried_row_by_row_so_each_row_gets_its_own_error(
    autojump_clock,
):
    fleet = FakeFleet(capacity=FakeCapacity(cap=4), refuse={"bad"})
    spawner = Spawner(fleet=fleet)
    outcome: dict[str, str] = {}

    async def row(task: str) -> None:
        try:
            outcome[task] = (await spawner.spawn(SpawnRequest(task=task))).key
        except UsageError as exc:
            outcome[task] = str(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(spawner.serve)
        async with trio.open_nursery() as rows:
            for task in ("ok1", "bad", "ok2"):
                rows.start_soon(row, task)
        nursery.cancel_scope.cancel()
    assert outcome == {"ok1": "aok1", "bad": "spawn: bad refused", "ok2": "aok2"}
