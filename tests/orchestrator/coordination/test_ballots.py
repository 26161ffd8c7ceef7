"""Democracy-round gates, ballot parsing and the strict-majority tally (pure logic)."""

import copy
import random
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator._errors import Refused
from orchestrator.coordination._ballots import (
    Ballot,
    RoundError,
    new_nonce,
    parse_ballot,
    tally,
    validate_request,
    voter_prompt,
)

NONCE = "0123456789abcdef"
IDS = ("A", "B", "C", "keep-lock")


def good() -> dict[str, Any]:
    return {
        "complexity": "super-complex",
        "justification": "Lock, replay cache and reconnects interact; each fix broke another.",
        "issue": "Replayed requests run twice after a reconnect.",
        "failed_approaches": [
            {"approach": "Bigger replay cache", "evidence": "Duplicate in run 41 (log line 88)."},
            {"approach": "Per-owner locks", "evidence": "test_reconnect deadlocks at 30 s."},
        ],
        "options": [
            {"id": "A", "title": "Persist the cache", "tradeoffs": "Disk writes per request."},
            {"id": "keep-lock", "title": "Idempotency keys", "tradeoffs": "A protocol change."},
        ],
    }


def test_a_complete_request_passes_every_gate() -> None:
    data = good()
    data["issue"] = "  Replayed requests run twice after a reconnect.  \n"
    request = validate_request(data)
    assert request.complexity == "super-complex"
    assert request.issue == "Replayed requests run twice after a reconnect."
    assert [item.approach for item in request.failed_approaches] == [
        "Bigger replay cache",
        "Per-owner locks",
    ]
    assert [(option.id, option.title) for option in request.options] == [
        ("A", "Persist the cache"),
        ("keep-lock", "Idempotency keys"),
    ]


def with_options(count: int) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["options"] = [
            {"id": f"o{n}", "title": f"Option {n}", "tradeoffs": "Some."} for n in range(count)
        ]

    return change


def setter(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target = data
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return change


def deleter(*path: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target = data
        for step in path[:-1]:
            target = target[step]
        del target[path[-1]]

    return change


@pytest.mark.parametrize(
    ("change", "field", "cause"),
    [
        (setter("complexity", value="complex"), "complexity", "is 'complex', not 'super-complex'"),
        (deleter("complexity"), "complexity", "is missing"),
        (setter("complexity", value=3), "complexity", "must be a string, not int"),
        (setter("options", 0, "a\nb", value=1), "options[0].'a\\nb'", "is not a known field"),
        (setter("justification", value="It is hard."), "justification", "is only 11 chars"),
        (setter("justification", value="   "), "justification", "is empty"),
        (
            setter("justification", value="Concurrency-persistence-reconnect-interactions-galore"),
            "justification",
            "has under 6 words",
        ),
        (setter("issue", value="Flaky."), "issue", "is only 6 chars"),
        (deleter("issue"), "issue", "is missing"),
        (setter("issue", value="x" * 2001), "issue", "is 2001 chars, over 2000"),
        (setter("failed_approaches", value="tried things"), "failed_approaches", "is not a list"),
        (deleter("failed_approaches", 1), "failed_approaches", "has 1 items, not 2-8"),
        (setter("failed_approaches", 1, value="x"), "failed_approaches[1]", "is not an object"),
        (
            setter("failed_approaches", 1, "approach", value=" bigger  replay-cache. "),
            "failed_approaches[1].approach",
            "repeats failed_approaches[0]",
        ),
        (
            deleter("failed_approaches", 0, "evidence"),
            "failed_approaches[0].evidence",
            "is missing",
        ),
        (
            setter("failed_approaches", 0, "evidence", value=" "),
            "failed_approaches[0].evidence",
            "is empty",
        ),
        (
            setter("failed_approaches", 0, "source", value="me"),
            "failed_approaches[0].source",
            "is not a known field",
        ),
        (with_options(1), "options", "has 1 items, not 2-8"),
        (with_options(9), "options", "has 9 items, not 2-8"),
        (setter("options", value={}), "options", "is not a list"),
        (setter("options", 0, "id", value="a b"), "options[0].id", "'a b' does not match"),
        (setter("options", 0, "id", value="x" * 41), "options[0].id", f"{'x' * 41!r} does not"),
        (setter("options", 1, "id", value="A"), "options[1].id", "'A' repeats options[0].id"),
        (setter("options", 1, "id", value="a"), "options[1].id", "'a' repeats options[0].id"),
        (setter("options", 1, "tradeoffs", value=""), "options[1].tradeoffs", "is empty"),
        (deleter("options", 0, "title"), "options[0].title", "is missing"),
        (setter("options", 0, "colour", value="red"), "options[0].colour", "is not a known"),
        (setter("votes", value=3), "votes", "is not a known field"),
    ],
)
def test_each_gate_refuses_with_one_line_naming_the_field(
    change: Callable[[dict[str, Any]], None], field: str, cause: str
) -> None:
    data = copy.deepcopy(good())
    change(data)
    with pytest.raises(RoundError) as caught:
        validate_request(data)
    message = str(caught.value)
    assert caught.value.field == field
    assert isinstance(caught.value, Refused)
    assert message.startswith(f"democracy round refused: {field} {cause}")
    assert message.endswith(")")
    assert "\n" not in message


def test_eight_options_and_eight_failed_approaches_are_the_most_accepted() -> None:
    data = good()
    with_options(8)(data)
    data["failed_approaches"] = [
        {"approach": f"approach {n}", "evidence": f"failed in run {n}"} for n in range(8)
    ]
    request = validate_request(data)
    assert (len(request.options), len(request.failed_approaches)) == (8, 8)
    data["failed_approaches"].append({"approach": "ninth", "evidence": "run 9"})
    with pytest.raises(RoundError, match="has 9 items, not 2-8"):
        validate_request(data)


def test_a_request_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(RoundError, match="request is not an object") as caught:
        validate_request(["super-complex"])  # type: ignore[arg-type]
    assert caught.value.field == "request"


def test_nonces_are_16_hex_digits_and_fresh() -> None:
    nonces = {new_nonce() for _ in range(200)}
    assert len(nonces) == 200
    assert all(re.fullmatch(r"[0-9a-f]{16}", nonce) for nonce in nonces)


def test_voter_prompt_carries_evidence_options_format_and_the_paper_ban() -> None:
    request = validate_request(good())
    prompt = voter_prompt(request, NONCE)
    for expected in (
        "Replayed requests run twice after a reconnect.",
        "each fix broke another",
        "Bigger replay cache",
        "Duplicate in run 41 (log line 88).",
        "test_reconnect deadlocks at 30 s.",
        "`A`: Persist the cache",
        "Tradeoffs: A protocol change.",
        "exactly one of: A, keep-lock",
        "Do not use the discussion paper",
        "600 characters at most",
    ):
        assert expected in prompt
    assert [line for line in prompt.split("\n") if line.startswith("BALLOT")] == [
        f"BALLOT {NONCE} <option-id> <rationale>"
    ]


def test_a_ballot_line_is_parsed_with_its_rationale() -> None:
    reply = (
        f"## Summary\nI read the logs.\n\nBALLOT {NONCE} keep-lock   Keys survive reconnects.  \n"
    )
    ballot = parse_ballot("v1", reply, NONCE, IDS)
    assert ballot == Ballot(
        voter="v1",
        status="valid",
        option="keep-lock",
        rationale="Keys survive reconnects.",
        reason="",
    )


@pytest.mark.parametrize(
    "line",
    [f"  BALLOT {NONCE} B why\r", f"`BALLOT {NONCE} B why`", f"BALLOT\t{NONCE}\tB\twhy"],
)
def test_whitespace_crlf_and_backticks_around_the_line_are_tolerated(line: str) -> None:
    ballot = parse_ballot("v1", f"text\n{line}\nmore text", NONCE, IDS)
    assert (ballot.status, ballot.option, ballot.rationale) == ("valid", "B", "why")


@pytest.mark.parametrize(
    ("reply", "status", "reason"),
    [
        ("I could not decide.", "malformed", "0 BALLOT lines; exactly one is required"),
        (f"ballot {NONCE} A why", "malformed", "0 BALLOT lines"),
        (f"BALLOTS {NONCE} A why", "malformed", "0 BALLOT lines"),
        (f"BALLOT {NONCE} A why\nBALLOT {NONCE} A why", "malformed", "2 BALLOT lines"),
        (f"BALLOT {NONCE} A why\nBALLOT ffffffffffffffff B why", "malformed", "2 BALLOT lines"),
        ("BALLOT", "malformed", "the BALLOT line has no nonce"),
        ("BALLOT ffffffffffffffff A why", "stale", "nonce 'ffffffffffffffff' is not this round's"),
        ("BALLOT ffffffffffffffff", "stale", "is not this round's"),
        (f"BALLOT {NONCE}", "malformed", "the BALLOT line has no option id"),
        (f"BALLOT {NONCE} D why", "malformed", "unknown option 'D'"),
        (f"BALLOT {NONCE} a why", "malformed", "unknown option 'a'"),
        (f"BALLOT {NONCE} A", "malformed", "the BALLOT line has no rationale"),
        (f"BALLOT {NONCE} A {'r' * 601}", "malformed", "rationale is 601 chars, over 600"),
    ],
)
def test_what_is_not_one_ballot_line_for_this_round_is_recorded_not_counted(
    reply: str, status: str, reason: str
) -> None:
    ballot = parse_ballot("v2", reply, NONCE, IDS)
    assert (ballot.voter, ballot.status, ballot.option, ballot.rationale) == (
        "v2",
        status,
        None,
        "",
    )
    assert reason in ballot.reason


def test_a_rationale_of_exactly_600_chars_counts() -> None:
    ballot = parse_ballot("v1", f"BALLOT {NONCE} C {'r' * 600}", NONCE, IDS)
    assert (ballot.status, len(ballot.rationale)) == ("valid", 600)


def test_reasons_quoting_voter_text_stay_within_200_chars() -> None:
    ballot = parse_ballot("v1", f"BALLOT {'n' * 5000} A why", NONCE, IDS)
    assert ballot.status == "stale"
    assert len(ballot.reason) <= 200


@given(st.text())
def test_parse_ballot_never_raises_and_respects_its_bounds(reply: str) -> None:
    ballot = parse_ballot("v1", reply, NONCE, IDS)
    assert ballot.status in {"valid", "malformed", "stale"}
    assert len(ballot.reason) <= 200
    assert len(ballot.rationale) <= 600
    assert (ballot.option is None) == (ballot.status != "valid")


@given(
    option=st.sampled_from(IDS),
    rationale=st.text(st.characters(blacklist_characters="\n`"), min_size=1, max_size=600).filter(
        lambda text: text.strip() != ""
    ),
)
def test_a_well_formed_ballot_round_trips(option: str, rationale: str) -> None:
    ballot = parse_ballot("v1", f"Done.\nBALLOT {NONCE} {option} {rationale}", NONCE, IDS)
    assert (ballot.status, ballot.option) == ("valid", option)
    assert ballot.rationale == rationale.strip()


def test_a_ballot_cannot_claim_an_option_unless_valid() -> None:
    with pytest.raises(ValueError, match="a missing ballot has option='A'"):
        Ballot(voter="v1", status="missing", option="A", rationale="", reason="no reply")
    with pytest.raises(ValueError, match="a valid ballot has option=None"):
        Ballot(voter="v1", status="valid", option=None, rationale="why", reason="")
    with pytest.raises(ValueError):
        Ballot(voter="v1", status="failed", option=None, rationale="", reason="x" * 201)


def vote(voter: str, option: str) -> Ballot:
    return Ballot(voter=voter, status="valid", option=option, rationale="why", reason="")


def lost(voter: str, status: Any = "missing") -> Ballot:
    return Ballot(voter=voter, status=status, option=None, rationale="", reason=status)


def test_a_clear_majority_of_the_invited_wins() -> None:
    result = tally([vote("v1", "A"), vote("v2", "A"), vote("v3", "A"), vote("v4", "B")], 4)
    assert (result.status, result.winner, result.leading) == ("winner", "A", ("A",))
    assert (result.counts, result.invited, result.valid) == ({"A": 3, "B": 1}, 4, 4)


def test_two_of_three_and_two_of_two_are_majorities() -> None:
    assert tally([vote("v1", "A"), vote("v2", "A"), lost("v3", "failed")], 3).winner == "A"
    assert tally([vote("v1", "B"), vote("v2", "B")], 2).winner == "B"


def test_half_of_the_invited_is_not_a_majority_even_when_unopposed() -> None:
    result = tally([vote("v1", "A"), vote("v2", "A"), lost("v3"), lost("v4", "malformed")], 4)
    assert (result.status, result.winner, result.leading) == ("needs-user", None, ("A",))
    assert (result.counts, result.valid) == ({"A": 2}, 2)


def test_a_tie_never_wins_and_leads_with_every_tied_option() -> None:
    result = tally([vote("v1", "B"), vote("v2", "A"), vote("v3", "B"), vote("v4", "A")], 4)
    assert (result.status, result.winner, result.leading) == ("needs-user", None, ("A", "B"))


def test_a_plurality_without_majority_never_wins() -> None:
    ballots = [vote("v1", "A"), vote("v2", "A"), vote("v3", "B"), vote("v4", "C"), lost("v5")]
    result = tally(ballots, 5)
    assert (result.status, result.leading, result.counts) == (
        "needs-user",
        ("A",),
        {"A": 2, "B": 1, "C": 1},
    )


def test_a_single_valid_ballot_never_wins() -> None:
    four = tally([vote("v1", "A"), lost("v2"), lost("v3", "stale"), lost("v4", "failed")], 4)
    assert (four.status, four.leading, four.valid) == ("needs-user", ("A",), 1)
    assert tally([vote("v1", "A")], 1).status == "needs-user"


def test_absent_voters_count_as_missing_and_no_ballots_lead_nowhere() -> None:
    assert tally([vote("v1", "A"), vote("v2", "A")], 4).status == "needs-user"
    nothing = tally([], 4)
    assert (nothing.status, nothing.leading, nothing.counts, nothing.valid) == (
        "needs-user",
        (),
        {},
        0,
    )


@pytest.mark.parametrize(
    ("ballots", "invited", "field", "match"),
    [
        ([], 0, "invited", "invited is 0"),
        ([vote("v1", "A"), vote("v2", "A")], 1, "ballots", "2 ballots for 1 invited voters"),
        ([vote("v1", "A"), vote("v1", "A")], 4, "ballots", "voter 'v1' has 2 ballots"),
    ],
)
def test_an_inconsistent_electorate_is_refused(
    ballots: list[Ballot], invited: int, field: str, match: str
) -> None:
    with pytest.raises(RoundError, match=match) as caught:
        tally(ballots, invited)
    assert caught.value.field == field


STATUSES = ("valid", "valid", "valid", "malformed", "stale", "missing", "failed")


@st.composite
def electorates(draw: st.DrawFn) -> tuple[list[Ballot], int]:
    invited = draw(st.integers(min_value=1, max_value=12))
    ballots = []
    for n in range(draw(st.integers(min_value=0, max_value=invited))):
        status = draw(st.sampled_from(STATUSES))
        option = draw(st.sampled_from(("A", "B", "C")))
        ballots.append(vote(f"v{n}", option) if status == "valid" else lost(f"v{n}", status))
    return ballots, invited


@given(electorates())
def test_a_winner_always_has_a_strict_majority_of_all_invited(
    electorate: tuple[list[Ballot], int],
) -> None:
    ballots, invited = electorate
    result = tally(ballots, invited)
    top = max(result.counts.values(), default=0)
    strict = result.valid >= 2 and 2 * top > invited
    assert (result.status == "winner") == strict  # plurality without majority never wins
    if result.winner is not None:
        assert 2 * result.counts[result.winner] > result.invited
        assert result.valid >= 2
        assert result.leading == (result.winner,)
    if len(result.leading) > 1:  # a tie never wins
        assert result.status == "needs-user"
    assert sum(result.counts.values()) == result.valid


@given(electorates(), st.data())
def test_a_missing_ballot_never_helps(
    electorate: tuple[list[Ballot], int], data: st.DataObject
) -> None:
    ballots, invited = electorate
    valid = [n for n, ballot in enumerate(ballots) if ballot.status == "valid"]
    if not valid:
        return
    index = data.draw(st.sampled_from(valid))
    weaker = [*ballots[:index], lost(ballots[index].voter), *ballots[index + 1 :]]
    before, after = tally(ballots, invited), tally(weaker, invited)
    assert after.winner in {None, before.winner}


@given(electorates(), st.integers(min_value=1, max_value=8), st.randoms())
def test_more_invited_voters_never_help_and_order_never_matters(
    electorate: tuple[list[Ballot], int], more: int, rng: random.Random
) -> None:
    ballots, invited = electorate
    result = tally(ballots, invited)
    assert tally(ballots, invited + more).winner in {None, result.winner}
    shuffled = list(ballots)
    rng.shuffle(shuffled)
    assert tally(shuffled, invited) == result
