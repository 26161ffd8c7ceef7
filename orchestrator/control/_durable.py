"""``fleet serve``'s journal: written for core, read for ``fleet events`` and ``fleet revive``.

:func:`open_durability` opens the session's ``journal.jsonl``, takes from it every child the
previous supervisor left live — each is now *lost*: listed in ``peek``'s ``stale`` with
whether it can be revived, and journaled as such — and wires the journal into the supervisor
(``Supervisor.journal``) with the tasks that keep it written. Its ops serve ``fleet events``
(the journal's records after a ``seq``, waiting a while for new ones when asked) and ``fleet
revive`` (:func:`orchestrator.core._revive.revive` for each lost child named).
"""

import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Final

import attrs
import trio

from orchestrator._errors import FleetError, Refused, UsageError
from orchestrator.control._args import str_arg, strs_arg
from orchestrator.control._server import OPS, Op
from orchestrator.control._stale import take_stale
from orchestrator.core._revive import Revival, find_lost, revive
from orchestrator.core._supervisor import Supervisor
from orchestrator.durability import Journal, keep_journal
from orchestrator.durability._format import ENVELOPE
from orchestrator.durability._session import SessionJournal

__all__ = ["Durability", "close_durability", "open_durability"]

log = logging.getLogger(__name__)

#: How often record states and locks no hook reported are looked for (seconds).
OBSERVE_INTERVAL: Final = 0.2
#: The most records one ``events`` reply carries (the client asks again from the last seq).
EVENTS_LIMIT: Final = 2000
#: The longest an ``events`` request waits for a first new record (seconds).
MAX_WAIT: Final = 60.0
#: The records one reply carries, in bytes: well inside the 1 MiB frame (the caller asks on
#: from the last record it got).
EVENTS_BYTES: Final = 768 * 1024
_ENVELOPE: Final = ("v", "seq", "at", "kind", "key")


@attrs.define(eq=False)
class Durability:
    """The session journal of one ``fleet serve``, and the lost children it found."""

    sup: Supervisor
    journal: Journal
    session: SessionJournal
    lost: dict[str, Revival] = attrs.Factory(dict)
    #: Lost children that cannot be revived, and why.
    unrevivable: dict[str, str] = attrs.Factory(dict)
    #: Retired children whose worktree is kept, as last seen (one leaving it is resolved).
    _kept: set[str] = attrs.Factory(set)

    def ops(self) -> dict[str, Op]:
        """The control ops this adds (``resume`` and ``ask`` revive a lost child first)."""
        ops: dict[str, Op] = {"events": self._events, "revive": self._revive}
        ops["discard"] = self._discard
        ops["stop"] = self._stop
        ops["apply"] = self._apply
        for name in ("resume", "ask", "steer"):
            ops[name] = self._reviving(OPS[name])
        ops["land"] = self._land
        ops["map"] = self._map
        return ops

    async def _land(self, sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
        """``fleet land``: the queue entry's outcome, and a landed change's new handoff, are
        journaled (as ``fleet apply``'s)."""
        result = await OPS["land"](sup, args)
        entry = result.get("entry")
        if isinstance(entry, dict):
            fields = {k: v for k, v in entry.items() if k not in ENVELOPE}
            self.journal.append("queue", entry["key"], durable=True, **fields)
        handoff = result.get("handoff")
        if isinstance(handoff, dict):
            fields = {k: v for k, v in handoff.items() if k not in ENVELOPE}
            self.journal.append("handoff", handoff["key"], durable=True, **fields)
        self.note_resolved()
        return result

    async def _map(self, sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
        """``fleet map``: a map started or resumed is journaled with where its ledger is (the
        ledger holds its rows and each row's outcome)."""
        result = await OPS["map"](sup, args)
        if args.get("action") in {"start", "resume"}:
            ledger = sup.maps.book.path(result["map"])
            fields = {"action": args["action"], "total": result["total"], "out": result["out"]}
            self.journal.append("map", result["map"], durable=True, ledger=str(ledger), **fields)
        return result

    def note_resolved(self) -> None:
        """Journal ``resolved`` for each retired child whose kept worktree is gone (copied
        back by ``fleet stop``, or deleted by ``fleet discard``): no later supervisor adopts
        it again."""
        sup = self.sup
        kept = {key for key in sup.worktrees.snapshots if key not in sup.registry.records}
        for key in sorted(self._kept - kept):
            if key not in sup.registry.records:
                self.journal.append("resolved", key, durable=True)
        self._kept = kept

    async def _stop(self, sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
        """``fleet stop``; stopping a lost child (its kept worktree copied back) ends it in
        the journal too."""
        result = await OPS["stop"](sup, args)
        for handoff in result.get("handoffs", []):
            key = handoff.get("key")
            lost = key in self.lost or key in self.unrevivable
            if isinstance(key, str) and lost and key not in sup.registry.records:
                self.lost.pop(key, None)
                self.unrevivable.pop(key, None)
                fields = {k: v for k, v in handoff.items() if k not in ENVELOPE}
                self.journal.append("handoff", key, durable=True, **fields)
                await sup.drop_scratch(key)
                for entry in sup.stale:
                    if entry["key"] == key:
                        entry.update(state="stopped", revivable=False, revive="")
        self.note_resolved()
        return result

    async def _apply(self, sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
        """``fleet apply``: the new handoff (what landed, what is still held) is journaled."""
        result = await OPS["apply"](sup, args)
        for handoff in result.get("handoffs", []):
            fields = {k: v for k, v in handoff.items() if k not in ENVELOPE}
            self.journal.append("handoff", handoff["key"], durable=True, **fields)
        self.note_resolved()
        return result

    def _reviving(self, op: Op) -> Op:
        async def reviving(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
            ref = args.get("agent")
            if isinstance(ref, str) and self.lost and not _live(sup, ref):
                lost = next((r for r in self.lost.values() if ref in {r.key, r.name}), None)
                if lost is not None:  # by key or name, as the op itself finds children
                    await self._revive(sup, {"agents": [lost.key]})
            return await op(sup, args)

        return reviving

    async def _discard(self, sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
        """``fleet discard`` of a lost child forgets it for good; any other goes on as ever."""
        ref = str_arg(args, "agent")
        lost = {**self.unrevivable, **dict.fromkeys(self.lost, "")}
        if ref in lost and ref not in sup.registry.records:
            if ref in sup.all_records() or ref in sup.worktrees.snapshots:
                await sup.discard(ref)  # its kept worktree goes too
            self.lost.pop(ref, None)
            self.unrevivable.pop(ref, None)
            sup.stale = [entry for entry in sup.stale if entry["key"] != ref]
            handoff = {"state": "failed", "error": "discarded while lost", "remaining": []}
            self.journal.append("handoff", ref, durable=True, **handoff)
            await sup.drop_scratch(ref)
            await trio.to_thread.run_sync(sup.kept.forget, ref)  # discarded: nothing kept
            self.note_resolved()
            return {"key": ref, "discarded": True}
        key = await sup.discard(ref)
        self.note_resolved()
        return {"key": key, "discarded": True}

    async def _events(self, sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
        since, wait = args.get("since", 0), args.get("wait", 0)
        if not isinstance(since, int) or isinstance(since, bool) or since < 0:
            raise UsageError("events: --since must be a record number >= 0")
        if not isinstance(wait, int | float) or isinstance(wait, bool) or wait < 0:
            raise UsageError("events: wait must be a number of seconds >= 0")
        with trio.move_on_after(min(float(wait), MAX_WAIT)):
            while self.journal.seq <= since:
                await self.journal.grown.wait()
        events = (await trio.to_thread.run_sync(self.journal.since, since))[:EVENTS_LIMIT]
        return {"events": _fitting(events), "seq": self.journal.seq}

    async def _revive(self, sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
        refs = strs_arg(args, "agents")
        if not refs:
            raise UsageError("revive: name at least one lost child (see fleet peek)")
        revived = []
        for ref in refs:
            if ref in self.unrevivable:
                raise Refused(f"revive: {ref}: {self.unrevivable[ref]}")
            revival = find_lost(self.lost, ref)
            record = await revive(sup, sup.spawning, sup.locks, revival)
            del self.lost[revival.key]
            self.journal.append("revived", record.key, durable=True, state="starting")
            for entry in sup.stale:
                if entry["key"] == record.key:
                    entry.update(state="revived", revivable=False, revive="")
            revived.append({"key": record.key, "name": record.name, "state": str(record.state)})
        return {"revived": revived}

    async def keep(self) -> None:
        """Look for unreported state and lock changes, forever (the journal writes them)."""
        while True:
            self.session.observe(self.sup.registry.live(), self.sup.locks.snapshot())
            self.note_resolved()
            await trio.sleep(OBSERVE_INTERVAL)


def _live(sup: Supervisor, ref: str) -> bool:
    try:
        sup.registry.find(ref, include_retired=False)
    except FleetError:
        return False
    return True


def open_durability(sup: Supervisor, nursery: trio.Nursery) -> Durability:
    """Open the session journal, find the lost children, and wire the journal in."""
    found: list[str] = []
    journal = Journal.open(sup.paths.journal, warn=found.append)
    journal.warn = log.warning  # from now on, to the supervisor's log
    sup.warnings.extend(found)
    stale = take_stale(sup, journal)
    durability = Durability(
        sup=sup,
        journal=journal,
        session=SessionJournal(journal),
        lost=stale.lost,
        unrevivable=stale.unrevivable,
    )
    durability.note_resolved()  # the adopted worktrees, as kept now
    journal.append("serve", durable=True, pid=os.getpid())
    sup.journal = durability.session
    nursery.start_soon(keep_journal, journal)
    nursery.start_soon(durability.keep)
    return durability


def close_durability(durability: Durability, *, clean: bool) -> None:
    """Journal how this supervisor ends (a clean stop: ``shutdown``), then close the journal."""
    durability.note_resolved()
    if clean:
        durability.journal.append("shutdown", durable=True, pid=os.getpid(), clean=True)
    durability.journal.close()


def _fitting(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first *events* whose JSON fits :data:`EVENTS_BYTES`; a record too large alone is
    sent as its envelope with ``clipped`` saying so (never a reply the frame refuses)."""
    fitting: list[dict[str, Any]] = []
    size = 0
    for event in events:
        length = len(json.dumps(event, ensure_ascii=False).encode("utf-8", "replace"))
        if length > EVENTS_BYTES // 2:
            event = {k: event[k] for k in _ENVELOPE if k in event}  # noqa: PLW2901
            event["clipped"] = f"a {length}-byte record: too large to send"
            length = len(json.dumps(event))
        if fitting and size + length > EVENTS_BYTES:
            break
        fitting.append(event)
        size += length
    return fitting
