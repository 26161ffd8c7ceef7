"""Each child's timeline, read from the session journal (``fleet events``) as it grows.

The journal holds what the supervisor recorded of a child: its spawn (task, model, budget),
state changes, questions and answers, settled turns with their (clipped) reports, resume ids
and its handoff. :class:`Timelines` keeps them per child, asking only for records after the
last one it has.
"""

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import attrs

#: The most records kept per child (the oldest go first; the spawn record stays).
KEEP: Final = 500
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
        if not isinstance(key, str) or not key or kind not in SHOWN:
            return
        shown = {k: v for k, v in record.items() if k != "loadout"}  # the loadout is plumbing
        if kind == "spawn":
            self.spawned[key] = shown
        kept = self.records.setdefault(key, [])
        kept.append(shown)
        if len(kept) > KEEP:
            del kept[1 : len(kept) - KEEP + 1]

    def of(self, key: str) -> list[dict[str, Any]]:
        return list(self.records.get(key, []))

    def reports(self, key: str) -> list[dict[str, Any]]:
        """Each settled turn's report, oldest first."""
        return [r for r in self.records.get(key, []) if r.get("kind") == "settled"]
