"""The moderator brief: at most 2000 characters telling a parent agent what its fleet is doing.

A parent that has a fleet is its moderator; ``fleet brief`` is what it reads at the start of a
turn. The supervisor gathers the :class:`Facts` from its memory (:func:`paper_line` and
:func:`voting_line` word the paper and a running round); the pure
:func:`render` lays them out in a fixed order — the session line, the children, what needs the
parent, how to moderate — and fits them into :data:`LIMIT`. The session line and the
moderator paragraph always stay; the parent's to-do items may take half of the room left (any
beyond are counted); the children get the rest, those waiting on the parent first and the
others cut from the end and counted by state.
"""

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Final

import attrs

from orchestrator._records import ChildRecord, clip
from orchestrator.coordination._democracy import Round
from orchestrator.coordination._paper import PARENT, Paper, PaperError

LIMIT: Final = 2000
LINE: Final = 160
MODERATOR: Final = (
    "How to moderate: decompose the task and route each part to the right agent (scouts read, "
    "workers write). Check with fleet peek, redirect with fleet steer, answer with fleet "
    "answer. Never redo a child's task yourself. Do not poll: fleet wait returns when a child "
    "settles. Resolve disagreements with evidence on the paper (fleet discuss); keep entries "
    "terse. Use fleet vote only for a persistent, super-complex decision after two failed "
    "approaches; a majority is a recommendation. Synthesize the reports into one answer and "
    "stop children you no longer need."
)


@attrs.frozen(kw_only=True)
class Facts:
    """What the brief says, read from the supervisor at one moment."""

    mode: str
    used: int
    cap: int
    working: int
    lane: int
    queued: int
    workspace: str
    children: tuple[ChildRecord, ...]
    questions: tuple[tuple[str, str, str], ...]  # (question id, child key, text)
    unread: tuple[str, ...]  # keys whose settled reports nobody has taken with fleet wait
    unresolved: tuple[ChildRecord, ...]  # retired children that left conflicts or changes
    paper: str  # the paper's line, already worded
    voting: str = ""  # the running democracy round, if any


def voting_line(running: Round | None) -> str:
    """The brief's words for the running democracy round, if any."""
    if running is None:
        return ""
    return (
        f"vote {running.id} is running with voters {', '.join(running.voters)}: leave them "
        "be; fleet vote prints the result"
    )


async def paper_line(paper: Paper) -> str:
    """The brief's words for the paper: the questions still open to the parent or everyone."""
    try:
        listed = await paper.list(PARENT, since="d0")
    except PaperError as exc:
        return f"the paper cannot be read: {exc}"
    answered = {entry.question for entry in listed.entries if entry.kind == "answer"}
    open_ids = [
        entry.id
        for entry in reversed(listed.entries)
        if entry.kind == "question"
        and entry.author != PARENT
        and entry.to in {None, PARENT}
        and entry.id not in answered
    ]
    if not open_ids:
        return ""
    return (
        f"paper (latest {listed.latest}): unanswered questions to you or everyone: "
        f"{', '.join(open_ids)} (fleet discuss list; fleet discuss answer dN TEXT)"
    )


def _line(text: str, limit: int = LINE) -> str:
    """One clipped line: children write the texts shown here, newlines included."""
    return clip(" ".join(text.split()), limit)


def _child_line(record: ChildRecord, workspace: str) -> str:
    progress = record.progress
    done = f" {progress['done']}/{progress['total']}" if progress.get("total") else ""
    doing = progress.get("current") or record.activity
    waiting = f" on {record.question}" if record.question else ""
    where = "" if record.workspace == workspace else f" in {record.workspace}"
    return _line(
        f"- {record.key} {record.name} ({record.agent}, {record.mode}) {record.state}{done}"
        f"{waiting}{where} — {doing}"
    )


def _todo(facts: Facts) -> list[str]:
    items = [
        _line(f"- {qid} from {key}: {text} (fleet answer {qid} TEXT)")
        for qid, key, text in facts.questions
    ]
    if facts.unread:
        items.append(_line(f"- reports ready from {', '.join(facts.unread)} (fleet wait)"))
    items.extend(
        _line(
            f"- {r.key} left {len(r.conflicts)} conflict(s) and {len(r.remaining)} unapplied "
            f"change(s) (fleet diff {r.key}; fleet stop {r.key} after resolving)"
        )
        for r in facts.unresolved
    )
    if facts.paper:
        items.append(_line(f"- {facts.paper}", 2 * LINE))
    if facts.voting:
        items.append(_line(f"- {facts.voting}"))
    return items


def _fit(lines: Sequence[str], budget: int, more: Callable[[int], str]) -> list[str]:
    """As many of *lines* as fit *budget* characters, then ``more(count)`` for the rest."""
    kept: list[str] = []
    used = 0
    for index, line in enumerate(lines):
        left = len(lines) - index - 1
        reserve = len(more(left)) + 1 if left else 0
        if used + len(line) + 1 + reserve > budget:
            break
        kept.append(line)
        used += len(line) + 1
    if len(kept) < len(lines):
        kept.append(more(len(lines) - len(kept)))
    return kept


def _fleet(facts: Facts, budget: int) -> list[str]:
    # Children that need the parent first, so a cut never hides one of them behind idle ones.
    ordered = sorted(facts.children, key=lambda r: r.question is None)

    def more(count: int) -> str:
        states = Counter(str(r.state) for r in ordered[len(ordered) - count :])
        counted = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
        return f"- +{count} more ({counted}): fleet peek"

    lines = [_child_line(record, facts.workspace) for record in ordered]
    return ["Children:", *_fit(lines, budget - len("Children:") - 1, more)] if lines else []


def render(facts: Facts) -> str:
    """The brief text for *facts*, at most :data:`LIMIT` characters."""
    head = (
        f"You moderate a fleet: mode {facts.mode}, {facts.used}/{facts.cap} children, "
        f"{facts.working}/{facts.lane} working, {facts.queued} queued; workspace "
        f"{_line(facts.workspace, 200)} unless a child line says otherwise."
    )
    budget = LIMIT - len(head) - 1 - len(MODERATOR)
    todo = _todo(facts)
    if todo:
        # The parent's to-do items may use half of what is left; the fleet gets the rest.
        todo = ["Needs you:", *_fit(todo, budget // 2 - 11, lambda n: f"- +{n} more: fleet peek")]
    budget -= sum(len(line) + 1 for line in todo)
    return "\n".join([head, *_fleet(facts, budget), *todo, MODERATOR])
