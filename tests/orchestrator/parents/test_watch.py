"""The events ``fleet mcp`` derives from two peek snapshots."""

from typing import Any

from orchestrator.parents._watch import events, fingerprint


def _peek(*agents: tuple[str, str], questions=(), activity="reading") -> dict[str, Any]:
    return {
        "mode": "default",
        "agents": [
            {"key": k, "name": f"n-{k}", "state": s, "activity": activity, "progress": {}}
            for k, s in agents
        ],
        "questions": list(questions),
    }


def test_a_turn_that_ends_is_settled_a_failure_failed_and_a_question_needs_input():
    before = _peek(("a1", "working"), ("a2", "working"), ("a3", "working"))
    after = _peek(
        ("a1", "idle"),
        ("a2", "failed"),
        ("a3", "waiting"),
        questions=[{"id": "q1", "key": "a3", "text": "Which   database?\n" + "x" * 500}],
    )
    found = events(before, after)
    assert [(e["event"], e["key"]) for e in found] == [
        ("settled", "a1"),
        ("failed", "a2"),
        ("needs-input", "a3"),
    ]
    asking = found[-1]
    assert asking["question"] == "q1"
    assert asking["line"].startswith("Which database? x")
    assert len(asking["line"]) == 200  # clipped: never a whole report or question body
    assert set(found[0]) == {"event", "key", "name", "state", "line"}


def test_nothing_new_is_no_event_and_the_same_question_is_heard_once():
    question = [{"id": "q1", "key": "a1", "text": "?"}]
    same = _peek(("a1", "waiting"), questions=question)
    assert events(same, same) == []
    assert fingerprint(same) == fingerprint(_peek(("a1", "waiting"), questions=question))
    # Activity alone changes the resource (fingerprint) but is no event.
    busier = _peek(("a1", "waiting"), questions=question, activity="writing")
    assert fingerprint(busier) != fingerprint(same)
    assert events(same, busier) == []


def test_a_child_first_seen_settled_is_heard():
    assert [e["event"] for e in events(_peek(), _peek(("a1", "stopped")))] == ["settled"]
