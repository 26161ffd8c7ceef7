"""The journal's format: one versioned JSON record a line, read back tolerantly, folded to facts.

A record is one JSON object on one line: ``{"v": 1, "seq": 7, "at": 1764745000.123, "kind":
"state", "key": "a1", ...fields}``. ``seq`` rises by one per record across rotations; ``at`` is
wall-clock seconds. Reading never fails on what a crash or a newer fleet can leave: a torn last
line (a write cut short) is ignored with one warning, a record of a newer version is skipped
with one line saying so (and left in the file), and a line that is not a record is skipped and
counted. Everything here is pure: bytes in, records and warnings out.
"""

from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs
import orjson

__all__ = [
    "ENDED",
    "JOURNAL_VERSION",
    "ChildFacts",
    "JournalRecord",
    "ReadResult",
    "fold",
    "last_supervisor",
    "parse_journal",
]

JOURNAL_VERSION: Final = 1
#: The names every record has; a record's own fields never reuse them.
ENVELOPE: Final = frozenset({"v", "seq", "at", "kind", "key"})
#: States after which a child has no process and never will (a ``lost`` child may be revived).
ENDED: Final = frozenset({"stopped", "failed"})
#: The session's own records (key ""): a supervisor started serving, or stopped cleanly.
SUPERVISOR_KINDS: Final = frozenset({"serve", "shutdown"})


@attrs.frozen(kw_only=True)
class JournalRecord:
    """One fact, as written."""

    v: int = JOURNAL_VERSION
    seq: int
    at: float
    kind: str
    key: str = ""
    fields: Mapping[str, Any] = attrs.Factory(dict)

    def as_json(self) -> dict[str, Any]:
        """The record's JSON object (``fleet events --json`` prints exactly this)."""
        head = {"v": self.v, "seq": self.seq, "at": self.at, "kind": self.kind, "key": self.key}
        return {**head, **{k: v for k, v in self.fields.items() if k not in ENVELOPE}}

    def line(self) -> bytes:
        return orjson.dumps(self.as_json()) + b"\n"


@attrs.frozen(kw_only=True)
class ReadResult:
    """What a journal's bytes hold: its records, and one line per kind of damage met."""

    records: tuple[JournalRecord, ...]
    warnings: tuple[str, ...] = ()
    #: Bytes of a torn last line (0: the file ended on a complete line).
    torn: int = 0
    #: Records skipped because a newer fleet wrote them.
    newer: int = 0


def _record(obj: object) -> JournalRecord | None:
    if not isinstance(obj, dict):
        return None
    v, seq, at, kind, key = (obj.get(name) for name in ("v", "seq", "at", "kind", "key"))
    if not (isinstance(v, int) and isinstance(seq, int) and isinstance(kind, str)):
        return None
    if not isinstance(at, int | float) or not isinstance(key, str) or v < 1:
        return None
    fields = {k: value for k, value in obj.items() if k not in ENVELOPE}
    return JournalRecord(v=v, seq=seq, at=float(at), kind=kind, key=key, fields=fields)


def parse_journal(data: bytes, *, where: str = "journal") -> ReadResult:
    """The records in *data* (a journal's bytes), tolerating what a crash or upgrade leaves."""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records: list[JournalRecord] = []
    warnings: list[str] = []
    bad: list[int] = []
    newer: list[JournalRecord] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = _record(orjson.loads(line))
        except orjson.JSONDecodeError:
            record = None
        if record is None:
            bad.append(number)
        elif record.v > JOURNAL_VERSION:
            newer.append(record)
        else:
            records.append(record)
    if bad:
        warnings.append(
            f"{where}: {len(bad)} line(s) are not journal records (first: line {bad[0]}); "
            "they were skipped"
        )
    if newer:
        versions = ", ".join(f"v{v}" for v in sorted({r.v for r in newer}))
        warnings.append(
            f"{where}: {len(newer)} record(s) from seq {newer[0].seq} are journal {versions}, "
            f"newer than this fleet reads (v{JOURNAL_VERSION}); they were skipped and kept in "
            "the file (upgrade fleet to read them)"
        )
    if tail:
        warnings.append(
            f"{where}: the last line is torn ({len(tail)} bytes, a write cut short by a crash); "
            "it was ignored"
        )
    return ReadResult(
        records=tuple(records), warnings=tuple(warnings), torn=len(tail), newer=len(newer)
    )


@attrs.define(eq=False)
class ChildFacts:
    """What the journal says of one child: how it was spawned and where it got to."""

    key: str
    #: The spawn record's fields (definition, mode, model, backend, workspace, worktree, ...).
    spawn: dict[str, Any] = attrs.Factory(dict)
    state: str = "starting"
    #: The backend's resumable session id (the builtin agent: its transcript file).
    resume: str = ""
    report: str = ""
    question: dict[str, Any] | None = None
    handoff: dict[str, Any] | None = None
    #: The child's process id, once known (a later supervisor checks it is gone).
    pid: int | None = None
    #: Whether its kept worktree was resolved after its handoff (copied back or discarded).
    resolved: bool = False
    #: Its usage so far, every life's (the ledger's ``spent``), as last journaled.
    spent: dict[str, Any] = attrs.Factory(dict)

    @property
    def ended(self) -> bool:
        return self.handoff is not None or self.state in ENDED

    @property
    def keep(self) -> bool:
        """Whether a compacted journal must still carry this child: it is live (or lost), or
        its handoff left a worktree unresolved."""
        return not self.ended or self.unresolved

    @property
    def unresolved(self) -> bool:
        """Whether it ended leaving its worktree kept (copy-back refused, conflicted, or not
        yet applied) and nothing resolved it since."""
        return bool((self.handoff or {}).get("remaining")) and not self.resolved

    def as_fields(self) -> dict[str, Any]:
        """The fields of the ``child`` record that stands for all of this child's records."""
        return {
            "spawn": self.spawn,
            "state": self.state,
            "resume": self.resume,
            "report": self.report,
            "question": self.question,
            "handoff": self.handoff,
            "pid": self.pid,
            "resolved": self.resolved,
            "spent": self.spent,
        }


def apply(facts: dict[str, ChildFacts], record: JournalRecord) -> None:
    """Fold one record into *facts* (kinds this version does not know are left out)."""
    key, kind, fields = record.key, record.kind, record.fields
    if kind == "spawn":
        facts[key] = ChildFacts(key=key, spawn=dict(fields))
        return
    if kind == "child":
        facts[key] = ChildFacts(
            key=key,
            spawn=dict(fields.get("spawn") or {}),
            state=str(fields.get("state") or "starting"),
            resume=str(fields.get("resume") or ""),
            report=str(fields.get("report") or ""),
            question=fields.get("question"),
            handoff=fields.get("handoff"),
            pid=_pid(fields.get("pid")),
            resolved=bool(fields.get("resolved")),
            spent=_spent(fields.get("spent")),
        )
        return
    child = facts.get(key)
    if child is None:
        return
    if kind == "resume":
        child.resume = str(fields.get("id") or "")
    elif kind in {"state", "lost", "revived", "hibernate", "wake"}:
        child.state = str(fields.get("state") or kind)
        if kind == "revived":
            child.handoff, child.pid, child.resolved = None, None, False
    elif kind == "pid":
        child.pid = _pid(fields.get("pid"))
    elif kind == "usage":
        child.spent = _spent(fields)
    elif kind == "resolved":
        child.resolved = True
    elif kind == "question":
        child.question = {"id": fields.get("id"), "text": fields.get("text")}
        child.state = "waiting"
    elif kind == "answer":
        child.question = None
    elif kind == "settled":
        child.report = str(fields.get("report") or child.report)
        child.state = str(fields.get("state") or child.state)
    elif kind == "models":
        child.spawn["models"] = list(fields.get("models") or [])
    elif kind == "locks":
        child.spawn["locks"] = list(fields.get("paths") or [])
    elif kind == "worktree":
        child.spawn["worktree"] = dict(fields)
    elif kind == "handoff":
        child.handoff, child.resolved = dict(fields), False
        child.state = str(fields.get("state") or child.state)


def last_supervisor(records: Iterable[JournalRecord]) -> JournalRecord | None:
    """The newest ``serve`` or ``shutdown`` record: which supervisor served last, and whether
    it stopped cleanly (``shutdown``) or died (``serve`` with nothing after it)."""
    last = None
    for record in records:
        if record.key == "" and record.kind in SUPERVISOR_KINDS:
            last = record
    return last


def _spent(value: object) -> dict[str, Any]:
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


def _pid(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def fold(records: Iterable[JournalRecord]) -> dict[str, ChildFacts]:
    """Every child's facts after *records*, in spawn order."""
    facts: dict[str, ChildFacts] = {}
    for record in records:
        apply(facts, record)
    return facts
