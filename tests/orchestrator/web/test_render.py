"""What the pages draw: the fleet's order, escaped diffs and charts, timelines from the journal."""

from collections.abc import Mapping
from typing import Any

from orchestrator.web import _render
from orchestrator.web._timeline import KEEP, Timelines


def _agent(key: str, state: str, question: str | None = None) -> dict[str, object]:
    return {"key": key, "state": state, "question": question}


def test_waiting_children_come_first_then_the_busy_then_by_key():
    agents = [
        _agent("a10", "idle"),
        _agent("a2", "working"),
        _agent("a3", "idle", question="q1"),  # a pending question counts as waiting
        _agent("a1", "paused"),
        _agent("a4", "waiting"),
        _agent("a9", "working"),
    ]
    assert [a["key"] for a in _render.fleet_order(agents)] == [
        "a3",
        "a4",
        "a2",
        "a9",
        "a1",
        "a10",
    ]


def test_a_diff_is_highlighted_and_escaped():
    html = _render.highlighted_diff("--- a/x\n+++ b/x\n+<script>alert(1)</script>\n")
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<span" in html


def test_the_chart_escapes_its_labels():
    svg = _render.bar_chart([("<b>a1</b>", 10.0, "10 tokens"), ("a2", 0.0, "0 tokens")])
    assert svg.startswith("<svg")
    assert "<b>" not in svg
    assert "&lt;b&gt;a1&lt;/b&gt;" in svg
    assert svg.count("<rect") == 2


def test_budget_and_age_read_as_a_person_would():
    assert _render.budget_of({"tokens": 1200, "budget": {"hard_tokens": 50000}}) == (
        "1200 / 50000 tokens"
    )
    assert _render.budget_of({"tokens": 5, "cost_usd": 0.5, "budget": {"hard_usd": 2.0}}) == (
        "$0.50 / $2.00"
    )
    assert _render.budget_of({"tokens": 7, "cost_usd": None}) == "7 tokens"
    assert [_render.age(s) for s in (None, 5, 125, 7200)] == ["?", "5s", "2m", "2.0h"]


async def test_timelines_read_only_new_records_and_keep_each_childs_own():
    journal: list[dict[str, Any]] = [
        {"seq": 1, "kind": "serve", "key": "", "at": 1.0},
        {"seq": 2, "kind": "spawn", "key": "a1", "at": 2.0, "task": "t", "loadout": {"x": 1}},
        {"seq": 3, "kind": "pid", "key": "a1", "at": 3.0, "pid": 7},
        {"seq": 4, "kind": "settled", "key": "a1", "at": 4.0, "report": "done", "turn": 1},
        {"seq": 5, "kind": "state", "key": "a2", "at": 5.0, "state": "working"},
    ]
    asked: list[int] = []

    async def call(op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        assert op == "events"
        since = int(args["since"])
        asked.append(since)
        newer = [r for r in journal if r["seq"] > since][:2]  # replies are capped
        return {"events": newer, "seq": journal[-1]["seq"]}

    timelines = Timelines()
    await timelines.refresh(call)
    assert asked == [0, 2, 4]
    assert [r["kind"] for r in timelines.of("a1")] == ["spawn", "settled"]
    assert "loadout" not in timelines.spawned["a1"]
    assert [r["report"] for r in timelines.reports("a1")] == ["done"]
    journal.append({"seq": 6, "kind": "question", "key": "a1", "at": 6.0, "id": "q1"})
    await timelines.refresh(call)
    assert asked[-1] == 5
    assert [r["kind"] for r in timelines.of("a1")][-1] == "question"
    for seq in range(7, 7 + KEEP + 10):
        timelines.add({"seq": seq, "kind": "state", "key": "a1", "at": seq, "state": "idle"})
    kept = timelines.of("a1")
    assert len(kept) == KEEP
    assert kept[0]["kind"] == "spawn"  # the spawn record stays


def test_the_session_over_time_is_a_line_through_each_sample():
    assert "not enough samples" in _render.line_chart([(1.0, 5.0)])
    svg = _render.line_chart([(100.0, 0.0), (110.0, 50.0), (120.0, 100.0)])
    assert svg.startswith("<svg")
    assert 'points="30.0,130.0 320.0,80.0 610.0,30.0"' in svg
    assert "100 tokens" in svg


def test_the_supervisors_recent_activities_join_the_journal_in_the_timeline():
    timelines = Timelines()
    timelines.add({"seq": 1, "kind": "spawn", "key": "a1", "at": 1.0})
    timelines.add({"seq": 2, "kind": "settled", "key": "a1", "at": 4.0, "turn": 1})
    recent: list[dict[str, object]] = [
        {"at": 2.0, "activity": "read README.md"},
        {"at": 3.0, "activity": "grep TODO"},
        {"at": "x", "activity": "not a time"},
    ]
    timeline = timelines.of("a1", recent)
    assert [(r["kind"], r.get("activity")) for r in timeline] == [
        ("spawn", None),
        ("activity", "read README.md"),
        ("activity", "grep TODO"),
        ("settled", None),
    ]
    assert timelines.of("a2") == []
