"""The loop gate's rules as a table: repeats within the window, results compared, failures in a
row, and the budget of two interventions per prompt."""

from collections.abc import Sequence

import pytest

from orchestrator.governance._loopgate import INTERVENTIONS, LoopGate, Trip

# Each step: ("call", tool, input) or ("result", tool, output, failed); the expected trip kinds
# (None: no trip) in order, one per step.
CASES = {
    "third identical call with identical results trips": (
        [("call", "read", "a"), ("result", "read", "x", False)] * 2 + [("call", "read", "a")],
        [None, None, None, None, "repeat"],
    ),
    "a growing log (same input, new output) never trips": (
        [
            ("call", "read", "log"),
            ("result", "read", "1", False),
            ("call", "read", "log"),
            ("result", "read", "12", False),
            ("call", "read", "log"),
            ("result", "read", "123", False),
            ("call", "read", "log"),
        ],
        [None] * 7,
    ),
    "a repeat answered differently from the first call trips once the answers stop changing": (
        [
            ("call", "Read", "a"),
            ("result", "Read", "content", False),
            ("call", "Read", "a"),
            ("result", "Read", "unchanged", False),
            ("call", "Read", "a"),
            ("result", "Read", "unchanged", False),
            ("call", "Read", "a"),
        ],
        [None] * 6 + ["repeat"],
    ),
    "different inputs never trip": (
        [("call", "read", "a"), ("call", "read", "b"), ("call", "read", "c")],
        [None, None, None],
    ),
    "the same input to another tool is another call": (
        [
            ("call", "read", "a"),
            ("result", "read", "x", False),
            ("call", "grep", "a"),
            ("result", "grep", "x", False),
            ("call", "read", "a"),
        ],
        [None] * 5,
    ),
    "repeats pushed out of the last eight calls do not count": (
        [("call", "read", "a"), ("result", "read", "x", False)] * 2
        + [("call", "ls", str(i)) for i in range(7)]
        + [("call", "read", "a")],
        [None] * 12,
    ),
    "a repeat whose earlier result is still unknown does not trip": (
        [("call", "read", "a"), ("call", "read", "a"), ("call", "read", "a")],
        [None, None, None],
    ),
    "three failures in a row trip": (
        [("call", "bash", str(i)) for i in range(1)]
        + [("result", "bash", "e", True), ("call", "bash", "2"), ("result", "bash", "e", True)]
        + [("call", "bash", "3"), ("result", "bash", "e", True)],
        [None, None, None, None, None, "failures"],
    ),
    "a success breaks the failing row": (
        [
            ("result", "bash", "e", True),
            ("result", "bash", "e", True),
            ("result", "bash", "ok", False),
            ("result", "bash", "e", True),
            ("result", "bash", "e", True),
        ],
        [None] * 5,
    ),
}


def run(
    gate: LoopGate, steps: Sequence[tuple[object, ...]], *, blocking: bool = False
) -> list[Trip | None]:
    trips: list[Trip | None] = []
    for step in steps:
        if step[0] == "call":
            trips.append(gate.on_call(str(step[1]), str(step[2]), blocking=blocking))
        else:
            trips.append(gate.on_result(str(step[1]), str(step[2]), failed=bool(step[3])))
    return trips


@pytest.mark.parametrize(("steps", "expected"), list(CASES.values()), ids=list(CASES))
def test_the_gate_trips_exactly_where_the_rules_say(steps, expected):
    trips = run(LoopGate(), steps)
    assert [t and t.kind for t in trips] == expected


def test_the_trip_line_names_the_repeated_call():
    gate = LoopGate()
    steps = [("call", "read", "a"), ("result", "read", "x", False)] * 2
    [*_, trip] = run(gate, [*steps, ("call", "read", "a")])
    assert trip is not None
    assert trip.line.startswith("loop gate: read was called with the same input 3 times")
    assert "\n" not in trip.line
    assert gate.last == trip.line


def test_a_refused_call_keeps_tripping_and_the_third_trip_stops_the_child():
    gate = LoopGate()
    steps = [("call", "read", "a"), ("result", "read", "x", False)] * 2
    run(gate, steps, blocking=True)
    # A builtin child's refused call gets no result; the same call again trips again.
    trips = [gate.on_call("read", "a", blocking=True) for _ in range(INTERVENTIONS + 1)]
    assert [t is not None and t.stop for t in trips] == [False, False, True]
    assert gate.interventions == INTERVENTIONS + 1


def test_repeats_and_failures_share_one_budget_reset_by_a_new_prompt():
    gate = LoopGate()
    run(gate, [("call", "read", "a"), ("result", "read", "x", False)] * 2)
    first = gate.on_call("read", "a")
    fails = run(gate, [("result", "bash", "e", True)] * 3)
    assert first is not None
    assert not first.stop
    assert fails[-1] is not None
    assert fails[-1].kind == "failures"
    assert not fails[-1].stop
    third = run(gate, [("result", "bash", "e", True)] * 3)[-1]
    assert third is not None
    assert third.stop
    gate.new_prompt()
    assert (gate.interventions, gate.last) == (0, "")
    assert gate.on_call("read", "a") is None  # history is gone with the old prompt
