"""The workspace as reading children on Ray nodes get it: one shipment shared by a batch.

A reading child on another node gets a read-only checkout of the workspace *as it is now*
(:func:`orchestrator.workspace._bundle.ship_workspace`: a snapshot commit of the work tree and a
bundle of it, some ten ``git`` processes). A shipment whose making began after a child's launch
began is exactly that for the child, so every child whose launch began before the newest
shipment of its workspace began takes that shipment instead of making its own: 64 scouts
spawned together make one bundle, not 64. A child launched later (the parent may have written
since) starts a new one.
A shipment that failed is not shared: each waiting child then makes its own, and gets its own
error. The newest shipment of a workspace is kept :data:`KEEP_S` seconds after it was made.
The last shipment of each workspace is kept for the session as well: a later batch whose
snapshot has the same tree (a parent scouting again before it edits) takes its bundle instead
of packing the same files again (its snapshot is still taken: that is how the tree is known).
"""

import time
from pathlib import Path
from typing import Final

import attrs
import trio

from orchestrator.workspace._bundle import Shipped, ship_workspace

__all__ = ["KEEP_S", "ReaderShipments"]

#: How long the newest shipment of a workspace is kept for children asked for before it began.
KEEP_S: Final = 60.0


@attrs.define(eq=False)
class _Making:
    began: float
    done: trio.Event = attrs.Factory(trio.Event)
    shipped: Shipped | None = None


@attrs.define(eq=False)
class ReaderShipments:
    """The newest shipment of each workspace (see the module docstring)."""

    _newest: dict[Path, _Making] = attrs.field(factory=dict, init=False)
    #: The last shipment made of each workspace, whatever its age.
    _last: dict[Path, Shipped] = attrs.field(factory=dict, init=False)

    async def ship(self, workspace: Path, asked_at: float, nursery: trio.Nursery) -> Shipped:
        """*workspace* as it is now for a child whose launch began at *asked_at*
        (``time.monotonic``)."""
        making = self._newest.get(workspace)
        if making is not None and making.began >= asked_at:
            await making.done.wait()
            if making.shipped is not None:
                return making.shipped
            return await self._make(workspace)
        making = _Making(began=time.monotonic())
        self._newest[workspace] = making
        try:
            making.shipped = await self._make(workspace)
        finally:
            making.done.set()
            if making.shipped is None:
                self._drop(workspace, making)
            else:
                nursery.start_soon(self._expire, workspace, making)
        return making.shipped

    async def _make(self, workspace: Path) -> Shipped:
        shipped = await trio.to_thread.run_sync(
            ship_workspace, workspace, self._last.get(workspace)
        )
        self._last[workspace] = shipped
        return shipped

    async def _expire(self, workspace: Path, making: _Making) -> None:
        await trio.sleep(KEEP_S)
        self._drop(workspace, making)

    def _drop(self, workspace: Path, making: _Making) -> None:
        if self._newest.get(workspace) is making:
            del self._newest[workspace]
