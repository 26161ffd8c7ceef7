"""The model gateway catches a lying child (real bwrap, a rogue child, the loopback model).

The rogue ``meterless`` child runs sandboxed with its egress proxy like any model-using child;
it answers each prompt by calling its model itself and reports no usage at all. The ledger
counts what the gateway metered anyway, the lie is flagged, and a hard cap is refused at the
gateway with the reason in the answer the child gets.
"""

import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator._records import TERMINAL, State
from orchestrator.core._supervisor import SpawnRequest, open_supervisor
from tests.fakes.model_server import ModelServer
from tests.faults.conftest import Faults

pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]


def _rogue(faults: Faults) -> str:
    """The rogue interpreter where the sandbox can see it (it replaces /tmp, where the fault
    suite keeps its scripts): beside the venv's interpreter."""
    wrapper = Path(sys.executable).parent / "fleet-test-rogue-python"
    wrapper.write_text(Path(faults.rogue()).read_text())
    wrapper.chmod(0o755)
    return str(wrapper)


BILL = 120  # the model server's default usage: 100 in, 20 out
CEILING = 60


async def test_a_child_that_reports_nothing_is_counted_what_the_gateway_metered(faults):
    async with ModelServer() as srv:
        srv.script("c1", [{"text": "one"}, {"text": "two"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        config = faults.config(python=_rogue(faults), model=model, reject_log=True)
        with trio.fail_after(CEILING):
            async with open_supervisor(config) as sup:
                [child] = await sup.spawn([SpawnRequest(task="x", name="rogue-meterless")])
                [note] = await sup.wait([child.key])
                await sup.prompt(child.key, "again")
                [again] = await sup.wait([child.key])
                report = sup.spend.report()
                sandboxed = sup.peek([child.key])["agents"][0]["sandboxed"]
                await sup.stop([child.key])
        log = (sup.paths.logs / f"{child.key}.log").read_text()
        billed = len(srv.requests("c1")) * BILL
        keys = {r.headers.get("authorization") for r in srv.requests("c1")}
    assert sandboxed is True
    assert (note["report"], again["report"]) == ("HTTP/1.1 200 OK", "HTTP/1.1 200 OK")
    [account] = report["agents"]
    assert (account["tokens"], account["metered_tokens"], billed) == (2 * BILL, 2 * BILL, 2 * BILL)
    assert report["session"]["tokens"] == billed
    assert account["flags"] == [
        f"the child reported 0 tokens, the gateway metered {BILL}",
        f"the child reported 0 tokens, the gateway metered {2 * BILL}",
    ]
    assert f"usage report flagged: the child reported 0 tokens, the gateway metered {BILL}" in log
    assert keys == {"Bearer fleet-placeholder"}  # no real key configured: the child's passes


async def test_a_hard_cap_is_refused_at_the_gateway_and_stops_the_child(faults):
    async with ModelServer() as srv:
        srv.script("c1", [{"text": "one"}, {"text": "two"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        budget = {"child": {"hard_tokens": 100}}
        config = faults.config(python=_rogue(faults), model=model, budget=budget)
        with trio.fail_after(CEILING):
            async with open_supervisor(config) as sup:
                [child] = await sup.spawn([SpawnRequest(task="x", name="rogue-meterless")])
                record = sup.registry.find(child.key)
                await Faults.until(lambda: record.state in TERMINAL)
                [handoff] = await sup.stop([child.key])
        assert len(srv.requests("c1")) == 1
    assert record.state is State.STOPPED
    assert handoff["incomplete"] == f"budget spent: {BILL} of 100 tokens"


async def test_sixteen_children_wait_out_one_shared_cooldown_with_no_extra_429s(faults):
    """#37 item 4: a provider answers 429 with ``Retry-After`` for as long as it says; once the
    first child met it, the gate makes every other child's request wait the cooldown out
    instead of meeting a 429 of its own (without the gate each met one), and all finish."""
    children, window = 16, 6.0
    async with ModelServer() as srv:
        for i in range(children):
            srv.script(f"c{i}", [{"text": f"done {i}"}])
        srv.rate_limit(window, str(int(window)))
        config = faults.config(max_subagents=children, lane=children, pacing={"patience": 30})

        def spawn(i: int) -> SpawnRequest:
            return SpawnRequest(
                task=f"task {i}", model=f"openai:fake-model@{srv.base_url(f'c{i}')}/v1"
            )

        with trio.fail_after(240):
            async with open_supervisor(config) as sup:
                records = await sup.spawn([spawn(0)])
                assert sup.spend.pacing is not None
                gates = sup.spend.pacing.gates
                await Faults.until(lambda: any(g.cooling for g in gates.values()))
                records += await sup.spawn([spawn(i) for i in range(1, children)])
                live = [sup.registry.find(r.key) for r in records]
                await Faults.until(lambda: any("cooldown" in r.activity for r in live[1:]))
                waiting = next(r.peek_line() for r in live[1:] if "cooldown" in r.activity)
                await Faults.until(lambda: all(r.state is State.IDLE for r in live))
                reports = sorted(r.report for r in live)
                errors = [r.error for r in live if r.error]
                sandboxed = {a["sandboxed"] for a in sup.peek()["agents"]}
                await sup.stop([r.key for r in records])
        served = [r for r in srv.requests() if r.api is not None]
        limited = list(srv.limited)
    assert sandboxed == {True}
    assert reports == sorted(f"done {i}" for i in range(children))
    assert errors == []
    assert len(served) == children  # each child's one answer, after the cooldown
    assert [child for _, child in limited] == ["c0"]  # the first child's 429, and no other
    assert "waiting on http://127.0.0.1:" in waiting, waiting


def _help(helper: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "subagent", "arguments": {"agent": helper, "task": "help"}}]}


READ = {"tool_calls": [{"name": "read", "arguments": {"path": "README.md"}}]}


async def test_a_tree_cap_stops_the_right_children_at_the_gateway(faults):
    """#37 item 3: two trees run at once (a lead and the helper it spawned, each); every
    response bills 120 tokens and a tree may spend 400. Tree A's helper goes on reading: the
    bill that passes 400 makes the gateway refuse tree A's next model request and stops its
    helper and its lead ``incomplete``; tree B (360 tokens in all) finishes its work."""
    async with ModelServer() as srv:
        srv.script("la", [_help("helpa"), {"text": "lead a done"}])
        srv.script("ha", [READ, READ, READ, READ, READ, {"text": "never"}])
        srv.script("lb", [_help("helpb"), {"delay": 1, "text": "lead b done"}])
        srv.script("hb", [{"text": "helped b"}])

        def model(path: str) -> str:
            return f"openai:fake-model@{srv.base_url(path)}/v1"

        for lead, helper in (("leada", "helpa"), ("leadb", "helpb")):
            faults.agent(lead, tools=["read"], mode="fork", subagent_agents=[helper])
            faults.agent(helper, tools=["read"], mode="scout", model=model(helper[0] + helper[-1]))
        budget = {"tree": {"hard_tokens": 400}}
        config = faults.config(budget=budget, max_subagents=4, lane=4)
        with trio.fail_after(CEILING * 2):
            async with open_supervisor(config) as sup:
                spawned = await sup.spawn(
                    [
                        SpawnRequest(task="a", agent="leada", model=model("la")),
                        SpawnRequest(task="b", agent="leadb", model=model("lb")),
                    ]
                )
                lead_a, lead_b = (sup.registry.find(r.key) for r in spawned)
                await Faults.until(lambda: lead_a.state in TERMINAL)
                await Faults.until(lambda: lead_b.state is State.IDLE)
                members = {t["key"]: t["members"] for t in sup.spend.report()["trees"]}
                helper_a, helper_b = (
                    sup.registry.find(members[lead.key][1]) for lead in (lead_a, lead_b)
                )
                await Faults.until(lambda: {helper_a.state, helper_b.state} <= TERMINAL)
                report = sup.spend.report()
                refusals = [sup.spend.refusal(r.key) for r in (lead_a, lead_b)]
                sandboxed = {a["sandboxed"] for a in sup.peek()["agents"]}
                await sup.stop([lead_b.key])
        served = {path: len(srv.requests(path)) for path in ("la", "ha", "lb", "hb")}
        log = (sup.paths.logs / f"{helper_a.key}.log").read_text()
    assert sandboxed == {True}
    assert lead_a.state is State.STOPPED
    assert lead_a.incomplete.startswith("tree budget spent: ")
    assert helper_a.incomplete.startswith("tree budget spent: ")
    assert "of 400 tokens" in helper_a.incomplete
    assert (lead_b.report, lead_b.incomplete, helper_b.incomplete) == ("lead b done", "", "")
    assert helper_b.report == "helped b"
    # Tree A: the lead's first request and the helper's three; nothing after the cap.
    assert served == {"la": 1, "ha": 3, "lb": 2, "hb": 1}, served
    assert refusals[0] == (
        f"fleet: tree {lead_a.key} budget spent (480 of 400 tokens): no more model requests"
    )
    assert refusals[1] is None
    assert "stopped incomplete: tree budget spent: 480 of 400 tokens" in log
    trees = {t["key"]: t for t in report["trees"]}
    assert trees[lead_a.key]["members"] == [lead_a.key, helper_a.key]
    assert trees[lead_a.key]["tokens"] == 480
    assert trees[lead_a.key]["reached"] == ["hard", "soft"]
    assert trees[lead_a.key]["left"] == {"hard_tokens": 0}
    assert trees[lead_b.key]["tokens"] == 360
    assert trees[lead_b.key]["left"] == {"hard_tokens": 40}
    assert trees[lead_b.key]["reached"] == []
