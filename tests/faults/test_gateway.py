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
