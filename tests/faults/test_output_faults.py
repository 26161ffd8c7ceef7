"""A child that prints its own token and floods its output: bounded, redacted diagnostics."""

import pytest
import trio

from orchestrator._records import State
from orchestrator.core._supervisor import SpawnRequest, open_supervisor

pytestmark = pytest.mark.slow

CEILING = 60
MIB = 1 << 20


async def test_a_recorded_flood_is_capped_and_the_token_never_reaches_the_log(faults) -> None:
    config = faults.rogue_config(record_output=True)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", name="rogue-flood")])
            token = sup.runs[record.key].token
            [note] = await sup.wait([record.key])  # the flood is over: it became the real child
            assert note["state"] == "idle"
            pids = faults.tree(record.pid)
            [handoff] = await sup.stop([record.key])
            assert handoff["state"] == "stopped"
            await faults.ended(sup, record.key, state=State.STOPPED, pids=pids)
            data = (sup.paths.logs / f"{record.key}.log").read_bytes()
            tail = sup.logs(record.key)["tail"]
    assert len(data) <= MIB
    assert token.encode() not in data
    assert token not in tail
    assert b"bytes dropped" in data
    assert b"and again [redacted]" in data  # the newest output is kept, redacted
    assert (sup.paths.logs / f"{record.key}.log").stat().st_mode & 0o777 == 0o600


async def test_a_failed_floods_diagnostics_show_a_redacted_tail_once(faults) -> None:
    config = faults.rogue_config(idle_timeout_ms=300, max_total_ms=60_000)
    hang = faults.script("hang", "turns:\n  - steps:\n      - hang: true\n")
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", name="rogue-flood", model=hang)])
            token = sup.runs[record.key].token
            await faults.until(lambda: record.pid is not None)
            pids = faults.tree(record.pid)
            note = await faults.ended(sup, record.key, state=State.FAILED, kind="idle", pids=pids)
            data = (sup.paths.logs / f"{record.key}.log").read_bytes()
    tail = note["failure"]["tail"]
    assert 0 < len(tail.encode()) <= 8192
    assert token not in tail
    assert "[redacted]" in tail
    assert token.encode() not in data
    # A healthy run writes no output; a failed one persists only the recent tail.
    assert len(data) < 16 * 1024
    assert data.count(b"--- recent output ---") == 1
