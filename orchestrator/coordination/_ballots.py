"""Democracy rounds as pure logic: the request gates, nonce-bound ballots and the tally.

A round is only for a persistent, super-complex decision, so ``validate_request`` refuses any
request that does not carry its own evidence: a concrete complexity justification, the issue, at
least two distinct failed approaches with evidence and 2-8 uniquely identified options with
tradeoffs. Each voter gets ``voter_prompt`` and must end its reply with exactly one line::

    BALLOT <nonce> <option-id> <rationale>

whitespace-separated, the rationale being the rest of that line (1-600 chars). Surrounding
whitespace or a pair of backticks around the line is tolerated; the word ``BALLOT`` is not
case-folded. ``parse_ballot`` records what it finds and never infers: a line with another round's
nonce is *stale*; no line, several lines, an unknown option or an overlong rationale is
*malformed*. The round runner records voters that never answered as *missing* and voters that
crashed or ran out of time as *failed*.

``tally`` applies the strict-majority rule: an option wins only with at least two valid ballots
and more than half of ALL invited voters (``2 * count > invited``); a ballot that is not valid
never shrinks that denominator. Anything else (a tie, a plurality, too few ballots) is
``needs-user`` with the leading options. This module does no I/O.
"""

import re
import secrets
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final, Literal

import attrs

from orchestrator._errors import Refused

MIN_OPTIONS: Final = 2
MAX_OPTIONS: Final = 8
MIN_FAILED_APPROACHES: Final = 2
MAX_FAILED_APPROACHES: Final = 8
MAX_RATIONALE: Final = 600
MAX_REASON: Final = 200
OPTION_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,40}")
# "Concrete" is judged by people; the gate only refuses the trivially short ("it is hard").
_MIN_JUSTIFICATION_CHARS: Final = 40
_MIN_JUSTIFICATION_WORDS: Final = 6
_MIN_ISSUE_CHARS: Final = 20


class RoundError(Refused):
    """A democracy round (or tally) was refused; ``field`` names the offending input.

    The message is one line: what was refused, the field, the cause and what to do. It is a
    ``Refused`` so the control API and the CLI report it like any refusal (exit code 4).
    """

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@attrs.frozen(kw_only=True)
class FailedApproach:
    approach: str
    evidence: str


@attrs.frozen(kw_only=True)
class Option:
    id: str
    title: str
    tradeoffs: str


@attrs.frozen(kw_only=True)
class RoundRequest:
    """A request that passed every gate of ``validate_request``."""

    complexity: str
    justification: str
    issue: str
    failed_approaches: tuple[FailedApproach, ...]
    options: tuple[Option, ...]


def _refuse(field: str, cause: str, fix: str) -> RoundError:
    return RoundError(f"democracy round refused: {field} {cause} ({fix})", field=field)


def _mapping(value: Any, where: str, keys: Collection[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _refuse(where or "request", "is not an object", f"pass {{{', '.join(keys)}}}")
    for key in value:
        if key not in keys:
            # Keys come from the caller: keep the one-line message one line and short.
            name = (
                key if isinstance(key, str) and re.fullmatch(r"\w{1,40}", key) else repr(key)[:40]
            )
            field = f"{where}.{name}" if where else name
            raise _refuse(field, "is not a known field", f"use only {', '.join(keys)}")
    return value


def _text(
    data: Mapping[str, Any], where: str, key: str, *, fix: str, max_chars: int, min_chars: int = 1
) -> str:
    field = f"{where}.{key}" if where else key
    value = data.get(key)
    if not isinstance(value, str):
        cause = "is missing" if value is None else f"must be a string, not {type(value).__name__}"
        raise _refuse(field, cause, fix)
    value = value.strip()
    if len(value) < min_chars:
        raise _refuse(field, "is empty" if not value else f"is only {len(value)} chars", fix)
    if len(value) > max_chars:
        raise _refuse(field, f"is {len(value)} chars, over {max_chars}", "shorten it")
    return value


def _list(data: Mapping[str, Any], key: str, low: int, high: int, fix: str) -> Sequence[Any]:
    value = data.get(key)
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise _refuse(key, "is missing" if value is None else "is not a list", fix)
    if not low <= len(value) <= high:
        raise _refuse(key, f"has {len(value)} items, not {low}-{high}", fix)
    return value


def _normalized(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())


def validate_request(data: Mapping[str, Any]) -> RoundRequest:
    """The round request in ``data``, or ``RoundError`` naming the first field that fails a gate."""
    _mapping(data, "", ("complexity", "justification", "issue", "failed_approaches", "options"))
    complexity = _text(data, "", "complexity", fix="set it to 'super-complex'", max_chars=40)
    if complexity != "super-complex":
        fix = "a round is only for a persistent super-complex decision; decide this one directly"
        raise _refuse("complexity", f"is {complexity!r}, not 'super-complex'", fix)
    fix = "say concretely why this decision is super-complex"
    justification = _text(
        data, "", "justification", fix=fix, min_chars=_MIN_JUSTIFICATION_CHARS, max_chars=2000
    )
    if len(justification.split()) < _MIN_JUSTIFICATION_WORDS:
        raise _refuse("justification", f"has under {_MIN_JUSTIFICATION_WORDS} words", fix)
    fix = "describe the persistent issue"
    issue = _text(data, "", "issue", fix=fix, min_chars=_MIN_ISSUE_CHARS, max_chars=2000)
    return RoundRequest(
        complexity=complexity,
        justification=justification,
        issue=issue,
        failed_approaches=_failed_approaches(data),
        options=_options(data),
    )


def _failed_approaches(data: Mapping[str, Any]) -> tuple[FailedApproach, ...]:
    fix = (
        f"give {MIN_FAILED_APPROACHES}-{MAX_FAILED_APPROACHES} distinct failed approaches, "
        "each with evidence"
    )
    items = _list(data, "failed_approaches", MIN_FAILED_APPROACHES, MAX_FAILED_APPROACHES, fix)
    failed: list[FailedApproach] = []
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        where = f"failed_approaches[{index}]"
        _mapping(item, where, ("approach", "evidence"))
        approach = _text(item, where, "approach", fix="say what was tried", max_chars=500)
        evidence = _text(item, where, "evidence", fix="quote what showed it failed", max_chars=1000)
        # "Retry  the lock." and "retry the lock" are one approach, not two.
        earlier = first_seen.setdefault(_normalized(approach), index)
        if earlier != index:
            raise _refuse(f"{where}.approach", f"repeats failed_approaches[{earlier}]", fix)
        failed.append(FailedApproach(approach=approach, evidence=evidence))
    return tuple(failed)


def _options(data: Mapping[str, Any]) -> tuple[Option, ...]:
    fix = f"give {MIN_OPTIONS}-{MAX_OPTIONS} options, each with an id, a title and tradeoffs"
    options: list[Option] = []
    first_seen: dict[str, int] = {}
    for index, item in enumerate(_list(data, "options", MIN_OPTIONS, MAX_OPTIONS, fix)):
        where = f"options[{index}]"
        _mapping(item, where, ("id", "title", "tradeoffs"))
        option_id = _text(item, where, "id", fix="give it an id like A or keep-lock", max_chars=80)
        if OPTION_ID.fullmatch(option_id) is None:
            cause = f"{option_id!r} does not match {OPTION_ID.pattern}"
            raise _refuse(f"{where}.id", cause, "use 1-40 letters, digits, '_' or '-'")
        # Voters type the id back; "a" and "A" side by side invite the wrong one.
        earlier = first_seen.setdefault(option_id.casefold(), index)
        if earlier != index:
            cause = f"{option_id!r} repeats options[{earlier}].id"
            raise _refuse(f"{where}.id", cause, "make ids unique, ignoring case")
        title = _text(item, where, "title", fix="name the option", max_chars=200)
        fix_tradeoffs = "say what the option costs and what it buys"
        tradeoffs = _text(item, where, "tradeoffs", fix=fix_tradeoffs, max_chars=1000)
        options.append(Option(id=option_id, title=title, tradeoffs=tradeoffs))
    return tuple(options)


def new_nonce() -> str:
    """A fresh round nonce: 16 hex digits, unguessable, so old or forged ballots read as stale."""
    return secrets.token_hex(8)


def voter_prompt(request: RoundRequest, nonce: str) -> str:
    """The whole task a voter receives: the evidence, the options and the ballot format."""
    failed = "\n".join(
        f"{n}. {item.approach}\n   Evidence: {item.evidence}"
        for n, item in enumerate(request.failed_approaches, 1)
    )
    options = "\n".join(
        f"- `{option.id}`: {option.title}\n  Tradeoffs: {option.tradeoffs}"
        for option in request.options
    )
    ids = ", ".join(option.id for option in request.options)
    return f"""You are one voter in a democracy round on a persistent, super-complex decision.
Decide independently: check the evidence below briefly, read code if it helps, change nothing.
Do not use the discussion paper (do not read it, do not write to it) and do not ask other agents.

## The issue
{request.issue}

## Why it is super-complex
{request.justification}

## Approaches that already failed
{failed}

## Options
{options}

## Your ballot
End your reply with exactly one line in this form, and no other line starting with BALLOT:

BALLOT {nonce} <option-id> <rationale>

- <option-id> is exactly one of: {ids}
- <rationale> is the rest of the line: why, from the evidence ({MAX_RATIONALE} characters at most).
A ballot with another nonce, an unknown option, a longer rationale or a second BALLOT line is
not counted.
"""


def _one_of_status(ballot: "Ballot", _: "attrs.Attribute[Any]", option: str | None) -> None:
    # A ballot counts for an option only when valid; the others record, they never infer.
    if (ballot.status == "valid") != (option is not None):
        msg = f"a {ballot.status} ballot has option={option!r}"
        raise ValueError(msg)


@attrs.frozen(kw_only=True)
class Ballot:
    """One voter's recorded ballot. Only a ``valid`` ballot names an option."""

    voter: str
    status: Literal["valid", "malformed", "stale", "missing", "failed"]
    option: str | None = attrs.field(validator=_one_of_status)
    rationale: str = attrs.field(validator=attrs.validators.max_len(MAX_RATIONALE))
    reason: str = attrs.field(validator=attrs.validators.max_len(MAX_REASON))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_ballot(voter: str, text: str, nonce: str, option_ids: Collection[str]) -> Ballot:
    """The ballot in a voter's final ``text``; never raises, whatever the voter wrote."""

    def rejected(status: Literal["malformed", "stale"], reason: str) -> Ballot:
        return Ballot(
            voter=voter, status=status, option=None, rationale="", reason=_clip(reason, MAX_REASON)
        )

    lines = [line.strip().strip("`").strip() for line in text.split("\n")]
    found = [line for line in lines if line.split(maxsplit=1)[:1] == ["BALLOT"]]
    if len(found) != 1:
        return rejected("malformed", f"{len(found)} BALLOT lines; exactly one is required")
    parts = found[0].split(maxsplit=3)
    if len(parts) < 2:
        return rejected("malformed", "the BALLOT line has no nonce")
    if parts[1] != nonce:
        return rejected("stale", f"nonce {parts[1][:40]!r} is not this round's")
    if len(parts) < 3:
        return rejected("malformed", "the BALLOT line has no option id")
    if parts[2] not in option_ids:
        return rejected("malformed", f"unknown option {parts[2][:40]!r}")
    rationale = parts[3].strip() if len(parts) == 4 else ""
    if not rationale:
        return rejected("malformed", "the BALLOT line has no rationale")
    if len(rationale) > MAX_RATIONALE:
        return rejected("malformed", f"rationale is {len(rationale)} chars, over {MAX_RATIONALE}")
    return Ballot(voter=voter, status="valid", option=parts[2], rationale=rationale, reason="")


@attrs.frozen(kw_only=True)
class Tally:
    """The outcome. ``counts`` holds valid ballots per option, most votes first."""

    status: Literal["winner", "needs-user"]
    winner: str | None
    counts: dict[str, int]
    leading: tuple[str, ...]
    invited: int
    valid: int


def tally(ballots: Sequence[Ballot], invited: int) -> Tally:
    """Apply the strict-majority rule to one ballot per voter (absent voters count as missing).

    A winner needs at least two valid ballots and ``2 * count > invited``; ``leading`` is every
    option tied at the top count (the winner alone when there is one).
    """
    if invited < 1:
        raise RoundError(
            f"tally refused: invited is {invited} (a round needs at least one voter)",
            field="invited",
        )
    if len(ballots) > invited:
        raise RoundError(
            f"tally refused: {len(ballots)} ballots for {invited} invited voters "
            "(pass one ballot per invited voter)",
            field="ballots",
        )
    voters = Counter(ballot.voter for ballot in ballots)
    if twice := [voter for voter, count in voters.items() if count > 1]:
        raise RoundError(
            f"tally refused: voter {twice[0]!r} has {voters[twice[0]]} ballots "
            "(record one ballot per voter)",
            field="ballots",
        )
    # Ballot's validator guarantees: an option is named exactly when the ballot is valid.
    valid = [ballot.option for ballot in ballots if ballot.option is not None]
    ranked = sorted(Counter(valid).items(), key=lambda item: (-item[1], item[0]))
    top = ranked[0][1] if ranked else 0
    leading = tuple(option for option, count in ranked if count == top)
    # 2 * top > invited >= len(valid) leaves no room for a second option at the top count.
    won = len(valid) >= 2 and 2 * top > invited
    return Tally(
        status="winner" if won else "needs-user",
        winner=leading[0] if won else None,
        counts=dict(ranked),
        leading=leading,
        invited=invited,
        valid=len(valid),
    )
