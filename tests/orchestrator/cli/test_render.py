import itertools
from typing import Any

from orchestrator._records import ChildRecord, State
from orchestrator.cli._render import (
    fleet_view,
    handoff_text,
    peek_table,
    spawned_line,
    usage_table,
    watch_line,
)


def _peek(agents, **extra):
    return {
        "session": "s",
        "mode": "plan",
        "cap": 4,
        "lane": {"capacity": 3, "working": 1, "queued": 0},
        "agents": agents,
        **extra,
    }


def _agent(key: str, mode: str, state: str = "working"):
    return {
        "key": key,
        "name": f"n{key}",
        "agent": "scout",
        "state": state,
        "queued": False,
        "workflow_mode": mode,
        "progress": {"done": 1, "total": 3},
        "last_event_age_s": 2.0,
        "activity": "reading",
    }


def test_a_child_launched_under_another_mode_says_so():
    lines = peek_table(_peek([_agent("a1", "build"), _agent("a2", "plan")])).splitlines()
    assert lines[0].startswith("session s · mode plan · cap 4")
    row_a1 = next(line for line in lines if line.startswith("a1"))
    row_a2 = next(line for line in lines if line.startswith("a2"))
    assert "working [build]" in row_a1
    assert "[" not in row_a2
    assert "1/3" in row_a1


def test_stale_children_of_a_dead_supervisor_are_listed_even_with_no_live_child():
    stale = [
        {
            "key": "a3",
            "name": "worker-3",
            "state": "working",
            "pid": 4242,
            "log": "/s/logs/a3.log",
            "worktree": "/s/worktrees/a3",
        }
    ]
    text = peek_table(_peek([], stale=stale))
    assert "no live children" in text
    assert (
        "stale a3 worker-3 (working, pid 4242): log /s/logs/a3.log, worktree /s/worktrees/a3"
        in text
    )


def test_a_lost_child_says_how_it_comes_back_or_why_it_cannot():
    base = {"name": "n", "state": "lost", "pid": None, "log": "/l", "worktree": None}
    stale = [
        {**base, "key": "a1", "revivable": True, "revive": "fleet revive"},
        {**base, "key": "a2", "revivable": False, "revive": "its transcript /t is gone"},
    ]
    lines = peek_table(_peek([], stale=stale)).splitlines()
    assert "stale a1 n (lost, pid None): log /l; fleet revive a1 brings it back" in lines
    assert "stale a2 n (lost, pid None): log /l; not revivable: its transcript /t is gone" in lines


def _row(lines: list[str], key: str) -> str:
    return next(line for line in lines if line.startswith(key))


def test_peek_lists_waiting_children_first_in_key_order_otherwise():
    agents = [_agent("a1", "plan"), _agent("a2", "plan", "waiting"), _agent("a3", "plan")]
    agents.append(_agent("a4", "plan", "waiting"))
    lines = peek_table(_peek(agents)).splitlines()
    assert [line.split()[0] for line in lines[2:6]] == ["a2", "a4", "a1", "a3"]
    view = fleet_view(_peek([{**a, "mode": "scout"} for a in agents]))
    assert [line.split()[0] for line in view[2:6]] == ["a2", "a4", "a1", "a3"]


def test_a_settled_child_reads_done_and_no_word_is_said_twice():
    agents = [
        {**_agent("a1", "plan", "idle"), "activity": "idle"},
        {**_agent("a2", "plan", "starting"), "activity": "starting"},
        {**_agent("a3", "plan", "idle"), "activity": "turn failed: HTTP 500"},
        {**_agent("a4", "plan"), "activity": "starting pi"},
    ]
    lines = peek_table(_peek(agents)).splitlines()
    assert _row(lines, "a1").split()[3:] == ["done", "1/3", "2s"]
    assert _row(lines, "a2").split()[3:] == ["starting", "1/3", "2s"]
    assert "idle" in _row(lines, "a3")
    assert _row(lines, "a3").endswith("turn failed: HTTP 500")
    assert _row(lines, "a4").split()[3:] == ["working", "1/3", "2s", "starting", "pi"]
    for agent in agents:
        words = watch_line({**agent, "mode": "scout"}).replace(":", "").split()
        assert not any(a == b for a, b in itertools.pairwise(words)), words
    assert watch_line({**agents[0], "mode": "scout"}) == "a1 na1 done scout 1/3 process"


def test_the_peek_line_of_a_record_says_done_once():
    record = ChildRecord(
        key="a1", name="scout-1", agent="scout", mode="scout", task="t", workspace="/w", backend="b"
    )
    assert record.peek_line() == "a1 scout-1 starting"
    record.state, record.activity = State.IDLE, "idle"
    assert record.peek_line() == "a1 scout-1 done"
    record.state, record.activity = State.WORKING, "read README.md"
    assert record.peek_line() == "a1 scout-1 working — read README.md"


def test_a_spawned_line_names_the_mode_only_when_it_is_not_the_agents_name():
    row = {"key": "a1", "name": "scout-1", "agent": "scout", "mode": "scout", "state": "starting"}
    assert spawned_line(row) == "a1 scout-1 (scout) starting"
    assert spawned_line({**row, "agent": "worker", "mode": "worktree"}) == (
        "a1 scout-1 (worker, worktree) starting"
    )


def test_peek_and_usage_show_tokens_cost_and_budget():
    child = {
        "key": "a1",
        "agent": "scout",
        "tokens": 120,
        "input_tokens": 100,
        "output_tokens": 20,
        "cache_read_tokens": 3,
        "cache_write_tokens": 4,
        "cost_usd": 0.0125,
        "budget": {"soft_tokens": 100, "hard_tokens": 500, "hard_usd": 2},
        "reached": ["soft"],
        "model": "m",
    }
    quiet = {**_agent("a2", "plan"), "usage": {"tokens": 0, "cost_usd": None}}
    lines = peek_table(_peek([{**_agent("a1", "plan"), "usage": child}, quiet])).splitlines()
    assert lines[-1] == (
        "usage a1: 120 tokens (in 100, out 20, cache 3/4) $0.0125 · budget soft 100 tok, "
        "hard 500 tok $2 (reached soft)"
    )
    assert not any(line.startswith("usage a2") for line in lines)
    session: dict[str, Any] = {"tokens": 120, "cost_usd": None, "budget": {}, "reached": []}
    definitions = {"scout": {"tokens": 120, "cost_usd": 0.0125, "children": 1}}
    text = usage_table({"agents": [child], "definitions": definitions, "session": session})
    head, row, *rest = text.splitlines()
    headers = ["KEY", "AGENT", "TOKENS", "IN", "OUT", "CACHE", "R/W", "COST", "TURNS", "BUDGET"]
    assert head.split() == headers
    assert row.split()[:8] == ["a1", "scout", "120", "100", "20", "3/4", "$0.0125", "0"]
    assert rest == [
        "scout: 120 tokens, $0.0125 over 1 children",
        "session: 120 tokens, -, 0 spawns, 0 turns, budget -",
    ]


def test_usage_shows_each_trees_caps_and_what_is_left():
    tree = {
        "key": "a1",
        "tokens": 480,
        "cost_usd": None,
        "children": 2,
        "spawns": 1,
        "turns": 3,
        "members": ["a1", "a2"],
        "budget": {"soft_tokens": 300, "hard_tokens": 400, "hard_spawns": 4},
        "left": {"soft_tokens": 0, "hard_tokens": 0, "hard_spawns": 3},
        "reached": ["hard", "soft"],
    }
    session: dict[str, Any] = {
        "tokens": 480,
        "cost_usd": None,
        "spawns": 2,
        "turns": 3,
        "budget": {"hard_turns": 10, "hard_usd": 5},
        "left": {"hard_turns": 7},
        "reached": [],
    }
    text = usage_table({"agents": [], "definitions": {}, "trees": [tree], "session": session})
    assert text.splitlines()[1:] == [
        (
            "tree a1 (2 children): 480 tokens, -, 1 spawns, 3 turns, cap soft 300 tok, "
            "hard 400 tok 4 spawns · left 0 tok 3 spawns (reached hard+soft)"
        ),
        "session: 480 tokens, -, 2 spawns, 3 turns, budget hard $5 10 turns · left 7 turns",
    ]


def test_a_handoff_lists_each_held_file_with_why_and_the_command_that_lands_it():
    handoff = {
        "key": "a2",
        "name": "worker-2",
        "state": "stopped",
        "changed": [".envrc", "src/app.py"],
        "applied": ["src/app.py"],
        "held": [{"path": ".envrc", "why": "environment file: direnv loads it"}],
        "pending": [],
    }
    text = handoff_text([handoff], lambda p: f"../{p}")
    assert (
        "held: .envrc: environment file: direnv loads it (fleet diff a2 ../.envrc reviews it, "
        "fleet apply a2 ../.envrc lands it)"
    ) in text
    kept = handoff_text([handoff | {"held": [], "pending": ["src/app.py"]}])
    assert "kept for review: src/app.py (fleet apply a2)" in kept
