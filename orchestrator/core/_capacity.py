"""Capacity: the retained-fleet cap and the lane for working children.

The cap counts every live child (idle and paused included); a hibernated child has no process
and counts only against ``max_retained``, which bounds live and hibernated children together.
A batch reserves atomically and is refused whole before any launch. Lowering the cap keeps
the fleet and blocks new spawns until there is room. The lane bounds how many children
actively work at once; turns beyond it wait in FIFO order and never fail.
"""

import attrs
import trio

from orchestrator._config import CAPS
from orchestrator._errors import CapacityError, UsageError


@attrs.define(eq=False)
class Capacity:
    """Counts live children against ``cap``."""

    cap: int
    used: int = 0
    #: Children stopped without finalizing (``subagents.hibernate_after_s``).
    hibernated: int = 0
    max_retained: int = 64

    def reserve(self, count: int) -> None:
        """Reserve *count* slots at once, or none (raises :class:`CapacityError`)."""
        if count < 1:
            raise UsageError("spawn: nothing to reserve")
        bound = max(self.max_retained, self.cap)
        if self.used + self.hibernated + count > bound:
            raise CapacityError(
                f"spawn: {count} new child(ren) would exceed max_retained {bound} "
                f"({self.used} live, {self.hibernated} hibernated)",
                hint="stop or discard a hibernated child, or raise subagents.max_retained",
            )
        if self.used + count > self.cap:
            free = max(0, self.cap - self.used)
            raise CapacityError(
                f"spawn: {count} new child(ren) would exceed max_subagents {self.cap} "
                f"({self.used} live, {free} free)",
                hint="stop or discard a child, or raise the cap",
            )
        self.used += count

    def release(self, count: int = 1) -> None:
        self.used = max(0, self.used - count)

    def hibernate(self) -> None:
        """A live child gave up its slot and stays retained."""
        self.release()
        self.hibernated += 1

    def wake(self) -> bool:
        """A hibernated child takes a live slot back; ``False`` while the cap is full."""
        if self.used >= self.cap:
            return False
        self.used += 1
        self.hibernated = max(0, self.hibernated - 1)
        return True

    def reclaim(self) -> None:
        """A hibernated child is being finalized: it holds a slot again until its release."""
        self.hibernated = max(0, self.hibernated - 1)
        self.used += 1

    def set_cap(self, cap: int) -> None:
        if cap not in CAPS:
            raise UsageError(f"max_subagents {cap} is not one of {', '.join(map(str, CAPS))}")
        self.cap = cap


@attrs.define(eq=False)
class Lane:
    """A FIFO slot pool for working children; its capacity may change while in use."""

    capacity: int
    working: int = 0
    queued: int = 0
    _lot: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)

    async def acquire(self) -> None:
        """Wait (in order) for a slot."""
        if self.working < self.capacity and not self._lot:
            self.working += 1
            await trio.lowlevel.checkpoint()
            return
        self.queued += 1
        try:
            # The releaser counts the slot as ours before it wakes us, so a slot handed over
            # is never lost to a cancellation that arrives later.
            await self._lot.park()
        finally:
            self.queued -= 1

    def release(self) -> None:
        self.working -= 1
        self._hand_over()

    def set_capacity(self, capacity: int) -> None:
        """Resize; lowering it lets working children finish and holds new turns back."""
        if not 1 <= capacity <= 64:
            raise UsageError(f"lane capacity {capacity} is outside 1..64")
        self.capacity = capacity
        self._hand_over()

    def _hand_over(self) -> None:
        while self.working < self.capacity and self._lot:
            self.working += 1
            self._lot.unpark(count=1)

    def statistics(self) -> dict[str, int]:
        return {"capacity": self.capacity, "working": self.working, "queued": self.queued}


@attrs.define(eq=False)
class LaneSlot:
    """One run's hold on the lane: at most one slot, given back exactly once."""

    lane: Lane
    held: bool = False

    async def take(self) -> None:
        await self.lane.acquire()
        self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self.lane.release()

    def lane_full(self) -> bool:
        return self.lane.working >= self.lane.capacity
