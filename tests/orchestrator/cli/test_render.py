from orchestrator.cli._render import peek_table


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
