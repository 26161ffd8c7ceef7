"""Each child's timeline, read from the session journal (``fleet events``) as it grows.

The journal holds what the supervisor recorded of a child: its spawn (task, model, budget),
state changes, questions and answers, settled turns with their (clipped) reports, resume ids,
its spend as it grew and its handoff. :class:`Timelines` keeps them per child, asking only for
records after the last one it has, merged with the recent activities (tool calls, messages)
the supervisor keeps for a live child; and the session's tokens over time, summed from each
child's journaled spend (so the chart covers the whole session, not only while a page was
open, and a restarted server draws it again).
"""

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

import attrs

#: The most records kept per child (the oldest go first; the spawn record stays).
KEEP: Final = 500
#: The most journaled spends kept for the session's chart (the oldest go first).
SPENT_KEPT: Final = 20_000
#: Journal kinds a timeline shows (locks, pids and resume ids are bookkeeping).
SHOWN: Final = frozenset(
    {
        "spawn",
        "state",
        "question",
        "answer",
        "settled",
        "handoff",
        "lost",
        "revived",
        "hibernate",
        "wake",
        "models",
        "worktree",
    }
)

Call = Callable[[str, Mapping[str, Any]], Awaitable[dict[str, Any]]]


@attrs.define(eq=False)
class Timelines:
    """The journal's records per child key."""

    seq: int = 0
    spawned: dict[str, dict[str, Any]] = attrs.Factory(dict)
    records: dict[str, list[dict[str, Any]]] = attrs.Factory(dict)
    #: Each journaled spend: (when, child, its tokens so far), in journal order.
    _spent: list[tuple[float, str, float]] = attrs.Factory(list)

    async def refresh(self, call: Call) -> None:
        """Read the records after the last one seen (each reply is capped; ask until done)."""
        while True:
            reply = await call("events", {"since": self.seq})
            events = reply.get("events", [])
            for record in events:
                self.add(record)
            if not events or self.seq >= int(reply.get("seq", 0)):
                return

    def add(self, record: Mapping[str, Any]) -> None:
        seq = record.get("seq")
        if isinstance(seq, int):
            if seq <= self.seq:
                return
            self.seq = seq
        key, kind = record.get("key"), record.get("kind")
        if kind == "usage" and isinstance(key, str) and key:
            self._spend(key, record)
        if not isinstance(key, str) or not key or kind not in SHOWN:
            return
        shown = {k: v for k, v in record.items() if k != "loadout"}  # the loadout is plumbing
        if kind == "spawn":
            self.spawned[key] = shown
        self._keep(key, shown)

    def _spend(self, key: str, record: Mapping[str, Any]) -> None:
        at, tokens = record.get("at"), record.get("tokens")
        if not isinstance(at, int | float) or isinstance(tokens, bool):
            return
        if not isinstance(tokens, int | float) or tokens < 0:
            return
        self._spent.append((float(at), key, float(tokens)))
        del self._spent[:-SPENT_KEPT]

    def spending(self) -> list[tuple[float, float]]:
        """The session's tokens after each journaled spend: (when, the sum of every child's
        latest), oldest first."""
        latest: dict[str, float] = {}
        points: list[tuple[float, float]] = []
        for at, key, tokens in sorted(self._spent, key=lambda p: p[0]):
            latest[key] = tokens
            points.append((at, sum(latest.values())))
        return points

    def _keep(self, key: str, record: dict[str, Any]) -> None:
        kept = self.records.setdefault(key, [])
        kept.append(record)
        if len(kept) > KEEP:
            del kept[1 : len(kept) - KEEP + 1]

    def of(self, key: str, recent: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
        """The child's records, oldest first: journal records, and the *recent* activities
        (tool calls, messages) its supervisor keeps, which the journal does not."""
        activities = [
            {"kind": "activity", "key": key, "at": a.get("at"), "activity": a.get("activity")}
            for a in recent
            if isinstance(a.get("at"), int | float) and isinstance(a.get("activity"), str)
        ]
        merged = [*self.records.get(key, []), *activities]
        return sorted(merged, key=lambda r: float(r.get("at") or 0))

    def reports(self, key: str) -> list[dict[str, Any]]:
        """Each settled turn's report, oldest first."""
        return [r for r in self.records.get(key, []) if r.get("kind") == "settled"]
