import pytest
import trio

from orchestrator._errors import CapacityError, UsageError
from orchestrator.core._capacity import Capacity, Lane


def test_a_batch_reserves_all_or_nothing():
    capacity = Capacity(cap=4)
    capacity.reserve(3)
    with pytest.raises(CapacityError, match=r"1 free") as info:
        capacity.reserve(2)
    assert "max_subagents 4" in str(info.value)
    assert capacity.used == 3
    capacity.reserve(1)
    assert capacity.used == 4


def test_lowering_the_cap_keeps_the_fleet_and_blocks_new_spawns():
    capacity = Capacity(cap=4)
    capacity.reserve(4)
    capacity.set_cap(2)
    assert capacity.used == 4
    with pytest.raises(CapacityError):
        capacity.reserve(1)
    capacity.release(3)
    capacity.reserve(1)
    assert capacity.used == 2


def test_hibernated_children_hold_no_live_slot_but_count_against_max_retained():
    capacity = Capacity(cap=2, max_retained=3)
    capacity.reserve(2)
    capacity.hibernate()
    capacity.hibernate()
    assert (capacity.used, capacity.hibernated) == (0, 2)
    capacity.reserve(1)  # 1 live + 2 hibernated: at max_retained
    with pytest.raises(CapacityError, match=r"max_retained 3 \(1 live, 2 hibernated\)"):
        capacity.reserve(1)
    assert capacity.wake()  # a wake keeps the total: it needs only a live slot
    assert not capacity.wake()  # the cap (2) is full
    assert (capacity.used, capacity.hibernated) == (2, 1)
    capacity.reclaim()  # a hibernated child being finalized holds a slot until its release
    capacity.release()
    assert (capacity.used, capacity.hibernated) == (2, 0)


def test_max_retained_never_binds_below_the_live_cap():
    capacity = Capacity(cap=4, max_retained=1)
    capacity.reserve(4)
    assert capacity.used == 4


@pytest.mark.parametrize("cap", [0, 3, 5, 32])
def test_only_the_documented_caps_are_accepted(cap):
    with pytest.raises(UsageError, match="2, 4, 6, 8, 16"):
        Capacity(cap=4).set_cap(cap)


async def test_the_lane_queues_in_order_and_never_fails(autojump_clock):
    lane = Lane(capacity=2)
    started: list[int] = []

    async def turn(index: int) -> None:
        await lane.acquire()
        started.append(index)
        await trio.sleep(10)
        lane.release()

    async with trio.open_nursery() as nursery:
        for index in range(5):
            nursery.start_soon(turn, index)
            await trio.sleep(0.001)
        await trio.sleep(1)
        assert lane.statistics() == {"capacity": 2, "working": 2, "queued": 3}
    assert started == [0, 1, 2, 3, 4]
    assert lane.statistics() == {"capacity": 2, "working": 0, "queued": 0}


async def test_raising_the_lane_capacity_starts_queued_turns_in_order(autojump_clock):
    lane = Lane(capacity=1)
    started: list[int] = []

    async def turn(index: int) -> None:
        await lane.acquire()
        started.append(index)

    async with trio.open_nursery() as nursery:
        for index in range(4):
            nursery.start_soon(turn, index)
            await trio.sleep(0.001)
        assert started == [0]
        lane.set_capacity(3)
        await trio.sleep(0.001)
        # Slots go to the two oldest waiters; trio may resume woken tasks in any order.
        assert sorted(started) == [0, 1, 2]
        assert lane.statistics() == {"capacity": 3, "working": 3, "queued": 1}
        lane.release()
    assert started[-1] == 3


async def test_a_cancelled_waiter_leaves_no_slot_behind(autojump_clock):
    lane = Lane(capacity=1)
    await lane.acquire()
    with trio.move_on_after(5):
        await lane.acquire()
    assert lane.statistics() == {"capacity": 1, "working": 1, "queued": 0}
    lane.release()
    assert lane.statistics()["working"] == 0
    await lane.acquire()
    assert lane.statistics()["working"] == 1
