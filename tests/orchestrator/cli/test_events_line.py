"""``fleet events``: one human line per journal record."""

import time

import pytest

from orchestrator.cli._durable import event_line

AT = time.mktime((2026, 12, 3, 8, 1, 2, 0, 0, -1))


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        (
            {"kind": "spawn", "agent": "scout", "backend": "builtin", "mode": "scout"},
            "7 08:01:02 a1 spawn scout (builtin, scout)",
        ),
        ({"kind": "state", "state": "working"}, "7 08:01:02 a1 state working"),
        (
            {"kind": "settled", "state": "idle", "report": "## Summary\nfound it"},
            "7 08:01:02 a1 settled idle: ## Summary",
        ),
        (
            {"kind": "settled", "state": "idle", "report": "", "error": "model: 500"},
            "7 08:01:02 a1 settled idle: model: 500",
        ),
        ({"kind": "question", "id": "q1", "text": "which?"}, "7 08:01:02 a1 question q1: which?"),
        ({"kind": "locks", "paths": []}, "7 08:01:02 a1 locks (none)"),
        ({"kind": "resume", "id": "/s/t.json"}, "7 08:01:02 a1 resume /s/t.json"),
        ({"kind": "later", "x": 1}, "7 08:01:02 a1 later"),
        ({"kind": "session", "key": ""}, "7 08:01:02 - session"),
        ({"kind": "state", "state": "x" * 200}, "7 08:01:02 a1 state " + "x" * 99 + "…"),
    ],
)
def test_each_record_is_one_line(fields, line):
    event = {"v": 1, "seq": 7, "at": AT, "key": "a1", **fields}
    assert event_line(event) == line
