"""The model gateway catches a lying child (real bwrap, a rogue child, the loopback model).

The rogue ``meterless`` child runs sandboxed with its egress proxy like any model-using child;
it answers each prompt by calling its model itself and reports no usage at all. The ledger
counts what the gateway metered anyway, the lie is flagged, and a hard cap is refused at the
gateway with the reason in the answer the child gets.
"""

import sys
from pathlib import Path

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
