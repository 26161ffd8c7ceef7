"""A reader's workspace bundle put in Ray's object store once a tree, not once a child.

Every reading child of a batch gets the same snapshot (``orchestrator.core._shipping``), and
each child's launch is a call to its node. With the bundle's bytes in each call, Ray stored and
sent them once a child: 64 scouts of a 16 MB workspace moved 1 GB between the supervisor and
four nodes, and took 7.6 times a local fleet's wall (``benchmarks/ray_fleet.py 64
--workspace-mb 16``). :class:`SharedBundles` puts a reader's bundle in the object store once
(``ray.put``) and each launch carries only its reference; on its node the reference is fetched
only when the node has not kept that tree already (:mod:`._read_trees`), and Ray fetches an
object once a node however many of its workers ask.

A bundle is keyed by the snapshot's Git tree id, so a later batch of an unchanged workspace
reuses the object too. The newest :data:`KEPT` trees are kept (their objects live while the
supervisor holds their references); a bundle below :data:`SHARED_BYTES` goes in the call as
before, where a reference would cost more than it saves.
"""

import collections
from typing import Any, Final

import attrs
import trio

from orchestrator.launch._launcher import Shipment
from orchestrator.launch._ray_node import ray_module

__all__ = ["KEPT", "SHARED_BYTES", "SharedBundles"]

#: Bundles at least this large are put in the object store once a tree.
SHARED_BYTES: Final = 256 * 1024
#: How many trees' objects are kept (the newest).
KEPT: Final = 2


@attrs.define(eq=False)
class SharedBundles:
    """The supervisor's shared reader bundles (see the module docstring)."""

    _refs: "collections.OrderedDict[str, Any]" = attrs.field(
        factory=collections.OrderedDict, init=False
    )
    #: Held while a tree's bundle is put: the launches of a batch wait for the first.
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    async def bundle(self, ship: Shipment) -> Any:
        """What a launch carries of *ship*'s bundle: a reference to it in the object store for
        a large reader's bundle of a known tree, else its bytes."""
        if not (ship.read_only and ship.tree) or len(ship.bundle) < SHARED_BYTES:
            return ship.bundle
        async with self._lock:
            ref = self._refs.get(ship.tree)
            if ref is None:
                ref = await trio.to_thread.run_sync(ray_module().put, ship.bundle)
                self._refs[ship.tree] = ref
                while len(self._refs) > KEPT:
                    self._refs.popitem(last=False)
            else:
                self._refs.move_to_end(ship.tree)
            return ref
