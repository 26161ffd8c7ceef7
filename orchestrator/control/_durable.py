"""``fleet serve``'s journal: written for core, read for ``fleet events`` and ``fleet revive``.

:func:`open_durability` opens the session's ``journal.jsonl``, takes from it every child the
previous supervisor left live — each is now *lost*: listed in ``peek``'s ``stale`` with
whether it can be revived, and journaled as such — and wires the journal into the supervisor
(``Supervisor.journal``) with the tasks that keep it written. Its ops serve ``fleet events``
(the journal's records after a ``seq``, waiting a while for new ones when asked) and ``fleet
revive`` (:func:`orchestrator.core._revive.revive` for each lost child named).
"""

import logging
from collections.abc import Mapping
from typing import Any, Final

import attrs
import trio

from orchestrator._errors import FleetError, Refused, UsageError
from orchestrator.control._args import str_arg, strs_arg
from orchestrator.control._server import OPS, Op
from orchestrator.core._revive import Revival, find_lost, revive, why_not
from orchestrator.core._supervisor import Supervisor
from orchestrator.durability import ChildFacts, Journal, keep_journal
from orchestrator.durability._session import SessionJournal

__all__ = ["Durability", "open_durability"]

log = logging.getLogger(__name__)

#: How often record states and locks no hook reported are looked for (seconds).
OBSERVE_INTERVAL: Final = 0.2
#: The most records one ``events`` reply carries (the client asks again from the last seq).
EVENTS_LIMIT: Final = 2000
#: The longest an ``events`` request waits for a first new record (seconds).
MAX_WAIT: Final = 60.0


def revival_of(facts: ChildFacts) -> Revival:
    spawn = facts.spawn
    loadout = dict(spawn.get("loadout") or {})
    if facts.resume:
        loadout["resume"] = facts.resume
    return Revival(
        key=facts.key,
        name=str(spawn.get("name") or facts.key),
        agent=str(spawn.get("agent") or ""),
        mode=str(spawn.get("mode") or "scout"),
        task=str(spawn.get("task") or ""),
        backend=str(spawn.get("backend") or ""),
        surface=str(spawn.get("surface") or "process"),
        workflow_mode=str(spawn.get("workflow_mode") or "build"),
        depth=int(spawn.get("depth") or 1),
        loadout=loadout,
        worktree=spawn.get("worktree"),
        locks=tuple(spawn.get("locks") or ()),
        report=facts.report,
        schema=spawn.get("schema"),
        budget=spawn.get("budget"),
        role=str(spawn.get("role") or ""),
        models=tuple(str(m) for m in spawn.get("models") or ()),
    )


@attrs.define(eq=False)
class Durability:
    """The session journal of one ``fleet serve``, and the lost children it found."""

    sup: Supervisor
    journal: Journal
    session: SessionJournal
    lost: dict[str, Revival] = attrs.Factory(dict)
    #: Lost children that cannot be revived, and why.
    unrevivable: dict[str, str] = attrs.Factory(dict)

    def ops(self) -> dict[str, Op]:
        """The control ops this adds (``resume`` and ``ask`` revive a lost child first)."""
        ops: dict[str, Op] = {"events": self._events, "revive": self._revive}
        ops["discard"] = self._discard
        for name in ("resume", "ask"):
            ops[name] = self._reviving(OPS[name])
        return ops

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
            return {"key": ref, "discarded": True}
        return {"key": await sup.discard(ref), "discarded": True}

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
        return {"events": events, "seq": self.journal.seq}

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
            await trio.sleep(OBSERVE_INTERVAL)


def _live(sup: Supervisor, ref: str) -> bool:
    try:
        sup.registry.find(ref, include_retired=False)
    except FleetError:
        return False
    return True


def _mark_lost(durability: "Durability") -> None:
    """Every child the journal says was live: journaled ``lost`` and listed in ``stale``."""
    sup, journal = durability.sup, durability.journal
    # Keys go on after every key the journal names: a new a1 must not take a lost a1's place.
    numbers = [int(r.key[1:]) for r in journal.found.records if r.key[1:].isdigit()]
    sup.registry._next = max([sup.registry._next, *(n + 1 for n in numbers)])
    stale = {entry["key"]: entry for entry in sup.stale}
    lost = durability.lost
    for facts in list(journal.facts.values()):
        if facts.ended or facts.key in sup.registry.records:
            continue
        revival = revival_of(facts)
        entry = stale.get(facts.key)
        if entry is None:
            entry = {
                "key": facts.key,
                "name": revival.name,
                "agent": revival.agent,
                "state": facts.state,
                "pid": None,
                "log": str(sup.paths.logs / f"{facts.key}.log"),
                "worktree": (revival.worktree or {}).get("path"),
                "recoverable": False,
                "running": False,
            }
            sup.stale.append(entry)
        scratch = sup.paths.scratch / facts.key
        reason = "it is still running" if entry.get("running") else why_not(revival, scratch)
        entry.update(state="lost", revivable=not reason, revive=reason or "fleet revive")
        journal.append("lost", facts.key, durable=True, state="lost", was=facts.state)
        if reason:
            durability.unrevivable[facts.key] = reason
        else:
            lost[facts.key] = revival
    if lost:
        note = f"fleet revive {' '.join(lost)} brings them back with their context"
        for index, line in enumerate(sup.warnings):
            if line.startswith("the previous supervisor"):
                sup.warnings[index] = f"{line}; {note}"
                break
        else:
            sup.warnings.append(f"the previous supervisor left lost children; {note}")


def open_durability(sup: Supervisor, nursery: trio.Nursery) -> Durability:
    """Open the session journal, find the lost children, and wire the journal in."""
    found: list[str] = []
    journal = Journal.open(sup.paths.journal, warn=found.append)
    journal.warn = log.warning  # from now on, to the supervisor's log
    sup.warnings.extend(found)
    durability = Durability(sup=sup, journal=journal, session=SessionJournal(journal))
    _mark_lost(durability)
    sup.journal = durability.session
    nursery.start_soon(keep_journal, journal)
    nursery.start_soon(durability.keep)
    return durability
