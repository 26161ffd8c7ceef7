"""What a previous supervisor of the session left, read from the session journal alone.

:func:`take_stale` runs once, when ``fleet serve`` opens the journal (we hold the session lock,
so every earlier supervisor has ended). Each child the journal says was live is *lost*: listed
in ``peek``'s ``stale`` with whether ``fleet revive`` can bring it back (a hibernated one too:
its ``lost`` record says ``was: hibernated``). Each child — live or ended — whose kept worktree
is still on disk and was never resolved is adopted: a retired FAILED record and its worktree
snapshot, so ``fleet stop KEY`` copies it back and ``fleet discard KEY`` deletes it. Keys go on
after every key the journal names, and one warning line says what was found, and whether the
previous supervisor ``stopped`` (its ``shutdown`` record) or ``died``.
"""

from pathlib import Path
from typing import Any

import attrs
import psutil

from orchestrator._records import ChildRecord, State
from orchestrator.core._revive import Revival, why_not
from orchestrator.core._supervisor import Supervisor
from orchestrator.durability import ChildFacts, Journal
from orchestrator.workspace._worktree import Snapshot

__all__ = ["Stale", "revival_of", "still_running", "take_stale"]


@attrs.define
class Stale:
    """The lost children found: revivable ones, and the reason each other one is not."""

    lost: dict[str, Revival] = attrs.Factory(dict)
    unrevivable: dict[str, str] = attrs.Factory(dict)


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


def still_running(pid: object, loadout: Path) -> bool:
    """Whether *pid* is still that child (its argv names its loadout: pids get reused)."""
    if not isinstance(pid, int):
        return False
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and str(loadout) in process.cmdline()
    except psutil.Error:
        return False


def _adopt(sup: Supervisor, revival: Revival, worktree: dict[str, Any], pid: object) -> None:
    key = revival.key
    sup.registry.retired[key] = ChildRecord(
        key=key,
        name=revival.name,
        agent=revival.agent,
        mode=revival.mode,
        task=revival.task,
        workspace=str(worktree["path"]),
        backend=revival.backend,
        state=State.FAILED,
        error=f"its supervisor (pid {pid}) ended; the worktree was kept",
    )
    sup.worktrees.snapshots[key] = Snapshot.from_json(worktree)


def take_stale(sup: Supervisor, journal: Journal) -> Stale:
    """Adopt what the journal says a previous supervisor left (see the module docstring)."""
    numbers = [int(r.key[1:]) for r in journal.found.records if r.key[1:].isdigit()]
    sup.registry._next = max([sup.registry._next, *(n + 1 for n in numbers)])
    previous = journal.supervisor
    pid = None if previous is None else previous.fields.get("pid")
    how = "stopped" if previous is not None and previous.kind == "shutdown" else "died"
    stale = Stale()
    listed, kept, running = [], [], []
    for facts in list(journal.facts.values()):
        live = not facts.ended
        if facts.key in sup.registry.records or not (live or facts.unresolved):
            continue
        revival = revival_of(facts)
        worktree = dict(revival.worktree or {})
        alive = live and still_running(facts.pid, sup.paths.loadouts / f"{facts.key}.json")
        recoverable = bool(worktree.get("path")) and Path(worktree["path"]).is_dir()
        entry: dict[str, Any] = {
            "key": facts.key,
            "name": revival.name,
            "agent": revival.agent,
            "state": facts.state,
            "pid": facts.pid,
            "log": str(sup.paths.logs / f"{facts.key}.log"),
            "worktree": worktree.get("path"),
            "recoverable": recoverable,
            "running": alive,
        }
        listed.append(f"{facts.key} ({revival.agent}, {facts.state})")
        if recoverable and not alive:
            _adopt(sup, revival, worktree, pid)
            if (facts.handoff or {}).get("pending"):  # kept by stop --hold: still held
                sup.worktrees.holding.add(facts.key)
            kept.append(facts.key)
        if alive:
            running.append(str(facts.pid))
        if live:
            scratch = sup.paths.scratch / facts.key
            reason = "it is still running" if alive else why_not(revival, scratch)
            entry.update(state="lost", revivable=not reason, revive=reason or "fleet revive")
            journal.append("lost", facts.key, durable=True, state="lost", was=facts.state)
            if reason:
                stale.unrevivable[facts.key] = reason
            else:
                stale.lost[facts.key] = revival
        sup.stale.append(entry)
    if not listed:
        return stale
    line = (
        f"the previous supervisor of this session (pid {pid}) {how} leaving "
        f"{', '.join(listed)}; their logs are kept in {sup.paths.logs}"
    )
    if kept:
        line += (
            f"; the worktrees of {', '.join(kept)} are kept (fleet stop KEY copies one "
            "back, fleet discard KEY deletes it)"
        )
    if running:
        line += f"; still running: pid {', '.join(running)} (stop them with kill)"
    if stale.lost:
        line += f"; fleet revive {' '.join(stale.lost)} brings them back with their context"
    sup.warnings.append(line)
    return stale
