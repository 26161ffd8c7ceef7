"""The fleet registry: one record per child, read by ``peek`` from memory only.

Keys are ``a1``, ``a2``, … in spawn order within the session. Retired records (stopped,
failed, discarded) leave the live fleet; the newest :data:`RETAINED_REPORTS` stay readable.
"""

import collections
from collections.abc import Collection, Iterator

import attrs

from orchestrator._errors import NotFound, UsageError
from orchestrator._records import RETAINED_REPORTS, ChildRecord

__all__ = ["Registry"]


@attrs.define(eq=False)
class Registry:
    """Live records by key, plus the newest retired ones."""

    records: dict[str, ChildRecord] = attrs.Factory(dict)
    retired: collections.OrderedDict[str, ChildRecord] = attrs.Factory(collections.OrderedDict)
    _next: int = 1

    def new_key(self) -> str:
        key = f"a{self._next}"
        self._next += 1
        return key

    def add(self, record: ChildRecord) -> None:
        if any(r.name == record.name for r in self.records.values()):
            raise UsageError(f"spawn: a live child is already named {record.name!r} (pick another)")
        self.records[record.key] = record

    def live(self) -> Iterator[ChildRecord]:
        return iter(list(self.records.values()))

    def retire(self, key: str, *, pinned: Collection[str] = ()) -> None:
        """Move *key* to the retired reports; the oldest beyond the newest 8 are dropped,
        except *pinned* ones (an unresolved worktree stays recoverable)."""
        record = self.records.pop(key, None)
        if record is None:
            return
        self.retired[key] = record
        evictable = [k for k in self.retired if k not in pinned]
        while len(self.retired) > RETAINED_REPORTS and evictable:
            self.retired.pop(evictable.pop(0))

    def find(self, ref: str, *, include_retired: bool = True) -> ChildRecord:
        """A child by key or unique name."""
        if ref in self.records:
            return self.records[ref]
        named = [r for r in self.records.values() if r.name == ref]
        if include_retired:
            if ref in self.retired:
                return self.retired[ref]
            named += [r for r in self.retired.values() if r.name == ref]
        if len(named) == 1:
            return named[0]
        if len(named) > 1:
            raise UsageError(f"{ref!r} names {len(named)} children (use a key such as a1)")
        ended = self.retired.get(ref) or next(
            (r for r in self.retired.values() if r.name == ref), None
        )
        if ended is not None:  # a live child was asked for: say why this one is not
            first = ended.error.strip().splitlines()[0][:200] if ended.error.strip() else ""
            why = f": {first}" if first else ""
            key = ended.key
            raise NotFound(f"{key} has ended ({ended.state}{why}); see fleet peek {key}")
        raise NotFound(f"no child {ref!r} in this session (see fleet peek)")
