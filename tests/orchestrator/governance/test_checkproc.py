"""Validation off the event loop: a schema with patterns is validated in a killable process,
so a backtracking pattern on a crafted result cannot stall the supervisor."""

import time

import pytest
import trio

from orchestrator.governance._checked import Checked, CheckedResult, needs_isolation
from orchestrator.governance._checkproc import validate_safely

BACKTRACKS = {"type": "array", "items": {"type": "string", "pattern": "^(a+)+$"}}


def block(body: str) -> str:
    return f"```json\n{body}\n```"


@pytest.mark.parametrize(
    ("schema", "isolated"),
    [
        ({"type": "object"}, False),
        ({"properties": {"a": {"type": "string", "minLength": 2}}}, False),
        (BACKTRACKS, True),
        ({"patternProperties": {"^x": {}}}, True),
        ({"anyOf": [{"type": "null"}, {"items": [{"pattern": "a"}]}]}, True),
        ({"properties": {"pattern": {"type": "string"}}}, True),  # only slower
    ],
)
def test_schemas_with_patterns_are_isolated(schema, isolated):
    assert needs_isolation(schema) is isolated


def test_a_remembered_validation_serves_only_its_own_report():
    checked = CheckedResult({"type": "array"})
    report = block("[1]")
    checked.remember(report, Checked(ok=False, error="from elsewhere"))
    assert "(from elsewhere)" in checked.judge(report).steer
    checked.remember(block("[2]"), Checked(ok=False, error="stale"))
    assert checked.judge(report).valid  # another report: validated afresh


async def test_a_schema_without_patterns_is_validated_in_place():
    checked = await validate_safely(block("[1]"), {"type": "array"})
    assert (checked.ok, checked.value) == (True, [1])


@pytest.mark.slow
async def test_an_isolated_validation_answers_like_one_in_place():
    good = await validate_safely(block('["aaa"]'), BACKTRACKS)
    assert (good.ok, good.value) == (True, ["aaa"])
    bad = await validate_safely(block('["ab"]'), BACKTRACKS)
    assert bad.error == "result invalid at /0: 'ab' does not match '^(a+)+$'"
    assert not bad.broken


@pytest.mark.slow
async def test_a_backtracking_pattern_is_killed_and_the_loop_keeps_running():
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.05)

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        checked = await validate_safely(block('["' + "a" * 60 + 'b"]'), BACKTRACKS, timeout=1.5)
        nursery.cancel_scope.cancel()
    assert time.monotonic() - started < 5
    assert ticks >= 20  # the loop ran all along
    assert checked.broken
    assert checked.error.startswith("validation ran past 1.5 s")
