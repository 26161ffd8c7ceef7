"""The web view's timelines and the session's spend over time, read from journal records."""

from collections.abc import Mapping
from typing import Any

import trio

from orchestrator.web._timeline import Timelines


def _usage(seq: int, at: float, key: str, tokens: object = 0) -> dict[str, object]:
    return {"seq": seq, "at": at, "kind": "usage", "key": key, "tokens": tokens}


def test_the_sessions_tokens_over_time_sum_each_childs_latest_spend():
    timelines = Timelines()
    for record in [
        {"seq": 1, "at": 10.0, "kind": "spawn", "key": "a1", "task": "t"},
        _usage(2, 11.0, "a1", 120),
        _usage(3, 12.0, "a2", 100),
        _usage(4, 13.0, "a1", 240),  # a1's cumulative spend: replaces its 120
        _usage(5, 14.0, "a2", -5),  # not a spend: ignored
        _usage(6, 15.0, "a2", tokens=True),  # nor this
        _usage(4, 16.0, "a3", 999),  # an old seq, seen already: ignored
    ]:
        timelines.add(record)
    assert timelines.spending() == [(11.0, 120.0), (12.0, 220.0), (13.0, 340.0)]
    # Spend is not a timeline entry; the spawn is.
    assert [r["kind"] for r in timelines.of("a1")] == ["spawn"]


def test_a_server_started_late_draws_the_whole_session_from_the_journal():
    journal = [(n, _usage(n, float(n), f"a{n % 3}", 10 * n)) for n in range(1, 31)]

    async def call(op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        assert op == "events"
        since = int(args["since"])
        page = [record for seq, record in journal if seq > since][:7]
        return {"events": page, "seq": 30}

    timelines = Timelines()
    trio.run(timelines.refresh, call)
    points = timelines.spending()
    assert len(points) == 30
    assert points[-1] == (30.0, 280.0 + 290.0 + 300.0)
