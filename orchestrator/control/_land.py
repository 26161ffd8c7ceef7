"""The ``land`` and ``queue`` control ops: the integration queue (docs/worktrees.md).

``land`` ``{"agent"?: "a3", "resolve"?: bool}`` lands the first queued held change (or the named
one) and answers ``{"entry": {key, status, reason, conflicts, gate, held_files, landed} | null,
"handoff"?, "resolver"?, "queue": [...]}``; with ``resolve``, a change left held is handed to a
fresh worktree worker whose task is the failure. ``queue`` answers ``{"queue": [...]}``.
"""

import logging
from collections.abc import Mapping
from typing import Any, Final, NoReturn

import trio

from orchestrator._errors import FleetError, UsageError
from orchestrator._records import SpawnRequest, clip
from orchestrator.batch import Entry
from orchestrator.control._args import str_arg
from orchestrator.core._isolation import apply_settlement
from orchestrator.core._supervisor import Supervisor

__all__ = ["land_op", "land_queued", "queue_op"]

log = logging.getLogger(__name__)

#: The most of a held change's patch a resolver's task carries.
PATCH_CLIP: Final = 16_000


async def queue_op(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"queue": sup.queue.show()}


async def land_op(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    ref = str_arg(args, "agent", required=False) or None
    resolve = args.get("resolve", False)
    if not isinstance(resolve, bool):
        raise UsageError("land: resolve must be true or false")
    key = None if ref is None else sup.registry.find(ref).key
    landed = await sup.queue.land(key)
    data: dict[str, Any] = {"entry": None}
    if landed is not None:
        entry, fields = landed
        data["entry"] = entry.as_json()
        record = sup.registry.find(entry.key)
        if fields:
            apply_settlement(record, fields)
            data["handoff"] = record.handoff()
        if resolve and entry.status == "held":
            data["resolver"] = await _resolver(sup, entry)
    data["queue"] = sup.queue.show()
    return data


async def land_queued(sup: Supervisor, *, every: float = 1.0) -> NoReturn:
    """``integration.auto``: land each change that enters the queue, in order, as it comes.

    Runs in ``fleet serve``'s supervisor, not in a request, so a gate may run its whole
    ``integration.timeout``. The queue's lock orders it with a ``fleet land`` by hand; a change
    it holds stays held (``fleet land aN`` retries it). A supervisor stopped mid-gate lands
    nothing: the copy-back runs only after a green gate, and the change stays queued."""
    while True:
        try:
            landed = await sup.queue.land()
        except (FleetError, OSError) as exc:
            log.warning("integration.auto: %s", exc)
            landed = None
        if landed is None:
            await trio.sleep(every)
            continue
        entry, fields = landed
        if fields:
            apply_settlement(sup.registry.find(entry.key), fields)
        log.info("integration.auto: %s %s %s", entry.key, entry.status, entry.reason)


async def _resolver(sup: Supervisor, entry: Entry) -> str:
    """A worktree worker whose task is *entry*'s failure and its patch."""
    pairs = await sup.worktrees.change(entry.key, [])
    patch = "".join(text for pending, text in pairs if not pending.why)
    failure = entry.reason
    if entry.gate:
        failure += f"\nThe gate's output ended with:\n{entry.gate}"
    task = (
        f"The change of {entry.key} could not land: {failure}\n"
        f"Make the same change on the current tree so that it applies and `{sup.queue.gate}` "
        f"passes. The change, as a patch:\n{clip(patch, PATCH_CLIP)}"
    )
    [record] = await sup.spawn(
        [SpawnRequest(task=task, agent="worker", mode="worktree", name=f"resolve-{entry.key}")]
    )
    return record.key
