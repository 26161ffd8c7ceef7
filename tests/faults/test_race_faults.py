"""Two endings at once, protocol abuse, and failures between reservation and launch.

Children that misbehave on the wire are ``_rogue.py`` stand-ins (``Config(python=...)``), run
unsandboxed; everything else is the real child.
"""

import contextlib
import json
import os
import signal
import sys

import attrs
import psutil
import pytest
import trio

import ipc
from orchestrator._errors import NotFound, OperationFailed
from orchestrator._records import State
from orchestrator.core._supervisor import SpawnRequest, open_supervisor
from orchestrator.governance._ownership import LockTable

pytestmark = pytest.mark.slow

CEILING = 60

HANG = """
turns:
  - steps:
      - say: "working"
      - hang: true
"""


@attrs.define(eq=False)
class CountingLocks(LockTable):
    """The real lock table, counting each release that actually gave locks back."""

    released: dict[str, int] = attrs.Factory(dict)

    def release(self, owner: str) -> tuple[str, ...]:
        specs = super().release(owner)
        if specs:
            self.released[owner] = self.released.get(owner, 0) + 1
        return specs


async def test_a_disconnect_mid_request_rejects_what_was_pending(faults) -> None:
    config = faults.rogue_config()
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", name="rogue-vanish")])
            [note] = await sup.wait([record.key])
            question = note["question"]["id"]
            # The rogue asks at once; wait for its prompt turn, which the pause must abort.
            await faults.until(lambda: record.turn == 1)
            pids = faults.tree(record.pid)
            # ask pauses the child first: the abort goes out, and the child hangs up on it.
            with pytest.raises(OperationFailed) as failed:
                await sup.ask(record.key, "status?")
            assert "\n" not in str(failed.value)
            assert record.key in str(failed.value)
            await faults.ended(sup, record.key, state=State.FAILED, kind="exited", pids=pids)
            with pytest.raises(NotFound):
                sup.answer(question, "too late")


async def test_a_dropped_connection_fails_the_child_and_releases_its_locks_once(faults) -> None:
    faults.agent("rw", tools=["read", "write"], mode="worktree")
    locks = CountingLocks()
    config = faults.rogue_config()
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            sup.locks = locks
            [record] = await sup.spawn([SpawnRequest(task="t", agent="rw", name="rogue-drop")])
            # The drop follows the grant at once: the lock may already be given back.
            await faults.until(
                lambda: record.key in locks.snapshot() or record.key in locks.released
            )
            pids = faults.tree(record.pid)
            note = await faults.ended(
                sup, record.key, state=State.FAILED, kind="protocol", pids=pids
            )
            assert note["failure"]["error"] == "child closed its connection"
    assert locks.released == {record.key: 1}


async def test_invalid_frames_close_the_connection_and_are_logged_as_rejected(faults) -> None:
    config = faults.rogue_config(reject_log=True)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", name="rogue-garbage")])
            pids = faults.tree(record.pid)
            note = await faults.ended(
                sup, record.key, state=State.FAILED, kind="protocol", pids=pids
            )
            assert note["failure"]["error"] == (
                "connection closed after invalid frames ({'token': 16})"
            )
            lines = (sup.paths.logs / "rejected.jsonl").read_text().splitlines()
    [entry] = [json.loads(line) for line in lines]
    assert entry["kind"] == "dropped-frame"
    assert entry["owner"] == record.key
    assert entry["args"] == {"drops": {"token": 16}, "flagged": True}


async def test_late_settled_frames_are_ignored_and_a_dead_owner_cannot_come_back(faults) -> None:
    config = faults.rogue_config(reject_log=True)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", name="rogue-late")])
            token = sup.runs[record.key].token
            [note] = await sup.wait([record.key])
            assert (note["state"], note["report"]) == ("idle", "first")
            log = sup.paths.logs / f"{record.key}.log"
            await faults.until(lambda: log.read_text().count("ignored a late settled") == 3)
            await trio.sleep(0.3)
            assert [n for n in sup.notes.pending if n["key"] == record.key] == []
            assert record.state is State.IDLE
            # Dropped, but counted: in the channel's drops and the reject log, one each.
            run = sup.runs[record.key]
            assert run.channel is not None
            assert run.channel.drops["late-settled"] == 3
            rejected = (sup.paths.logs / "rejected.jsonl").read_text().splitlines()
            late = [json.loads(line) for line in rejected]
            assert [(e["kind"], e["owner"], "settled" in e["args"]) for e in late] == [
                ("dropped-frame", record.key, True)
            ] * 3
            pids = faults.tree(record.pid)
            await sup.discard(record.key)
            with pytest.raises(NotFound):
                sup.registry.find(record.key)
            await faults.gone(pids)
            # The evicted owner's token opens nothing any more, and nothing is resurrected.
            with pytest.raises(ipc.HandshakeError):
                await ipc.open_client(
                    sup.paths.ipc_socket,
                    owner=record.key,
                    token=token,
                    hello=ipc.Hello(pid=os.getpid()),
                )
            assert await sup.wait() == []
            assert sup.capacity.used == 0


@pytest.mark.parametrize("ending", ["reply", "exit"])
async def test_a_watchdog_firing_as_the_child_finishes_gives_one_terminal_state(
    faults, ending: str
) -> None:
    # Each child finishes within a few ms of its idle budget (500 ms of silent work), on
    # either side of it.
    last = "reply: done" if ending == "reply" else "crash: 0"
    offsets = [-0.02, -0.01, -0.005, 0.0, 0.005, 0.01, 0.02, 0.03]
    requests = [
        SpawnRequest(
            task=f"t{i}",
            model=faults.script(
                f"s{i}", f"turns:\n  - steps:\n      - wait: {0.5 + offset}\n      - {last}\n"
            ),
        )
        for i, offset in enumerate(offsets)
    ]
    config = faults.config(idle_timeout_ms=500, max_total_ms=60_000, lane=8, max_subagents=8)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            records = await sup.spawn(requests)
            pids = {r.key: faults.tree(r.pid) for r in records}
            for record in records:
                [note] = await sup.wait([record.key])
                if note["state"] == "idle":
                    assert ending == "reply"
                    assert note["report"] == "done"
                    assert "failure" not in note
                    [handoff] = await sup.stop([record.key])
                    assert handoff["state"] == "stopped"
                else:
                    assert note["state"] == "failed"
                    assert note["failure"]["kind"] in {"idle", "exited"}
                    assert note["report"] == ""
                assert record.state in {State.STOPPED, State.FAILED}
            await trio.sleep(0.3)
            assert sup.notes.pending == []
            assert sup.capacity.used == 0
            assert sup.lane.statistics()["working"] == 0
            for record in records:
                await faults.gone(pids[record.key])


async def test_a_result_arriving_after_the_watchdog_fired_is_rejected(faults) -> None:
    # The narrowest form of the race above, made certain: the budget has run out (the callback
    # ran) and the child's settled frame is read before the timeout's ending has begun.
    hold = faults.script("hold", "turns:\n  - steps:\n      - wait: 30\n        until: steer\n")
    config = faults.config(model=hold, lane=8, max_subagents=8)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            records = await sup.spawn([SpawnRequest(task=f"t{i}") for i in range(8)])
            await faults.until(lambda: all(sup.runs[r.key].turn is not None for r in records))
            for record in records:
                run = sup.runs[record.key]
                assert run.turn is not None
                run.on_timeout("idle")
                late = ipc.Envelope(
                    v=1,
                    token=run.token,
                    owner=record.key,
                    corr="",
                    kind="event",
                    type="settled",
                    body=ipc.Settled(turn=run.turn.number, text="too late"),
                )
                await run.requests.on_event(late)
            for record in records:
                [note] = await sup.wait([record.key])
                assert (note["state"], note["report"]) == ("failed", "")
                assert note["failure"]["kind"] == "idle"
                assert record.report == ""
            await trio.sleep(0.3)
            assert sup.notes.pending == []


@pytest.mark.parametrize("delay", [0.0, 0.005, 0.05])
async def test_stop_racing_a_disconnect_ends_the_child_once(faults, delay: float) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(model=faults.script("hang", HANG))) as sup:
            [record] = await sup.spawn([SpawnRequest(task="hang")])
            await faults.until(lambda: record.activity == "working")
            pids = faults.tree(record.pid)
            child = faults.child_process(record.key)
            handoffs = []

            async def stop() -> None:
                handoffs.extend(await sup.stop([record.key]))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop)
                await trio.sleep(delay)
                with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                    child.send_signal(signal.SIGKILL)  # stop may have ended it already
            [handoff] = handoffs
            assert handoff["state"] == str(record.state)
            kind = None if record.state is State.STOPPED else "killed"
            await faults.ended(sup, record.key, state=record.state, kind=kind, pids=pids)


async def test_closing_the_supervisor_while_children_fail_and_launch(faults) -> None:
    config = faults.config(model=faults.script("hang", HANG))
    pids: list[int] = []
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            dying, steady = await sup.spawn([SpawnRequest(task="a"), SpawnRequest(task="b")])
            await faults.until(lambda: dying.activity == steady.activity == "working")
            pids = faults.tree(dying.pid) + faults.tree(steady.pid)
            [late] = await sup.spawn([SpawnRequest(task="c")])  # still starting at close
            pids += faults.tree(late.pid)
            faults.child_process(dying.key).send_signal(signal.SIGKILL)
        # Closing returned: every record is final and nothing is held.
        records = [dying, steady, late]
        assert all(r.state in {State.STOPPED, State.FAILED} for r in records)
        assert sup.runs == {}
        assert sup.capacity.used == 0
        assert sup.locks.snapshot() == {}
    await faults.gone(pids)


async def test_a_nested_spawn_failing_after_reservation_leaves_nothing_behind(faults) -> None:
    faults.agent("lead", tools=["read"], mode="fork", subagent_agents=["scout"])
    lead = faults.script(
        "lead",
        """
        turns:
          - steps:
              - tool: subagent
                args: {agent: scout, task: "look"}
              - reply: "{{last}}"
        """,
    )
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(model=faults.script("hang", HANG))) as sup:
            sup.paths.scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
            (sup.paths.scratch / "a2").write_text("in the way")  # a2 cannot be prepared
            [record] = await sup.spawn([SpawnRequest(task="t", agent="lead", model=lead)])
            [note] = await sup.wait([record.key])
            assert note["report"].startswith("subagent refused: spawn a2: could not prepare")
            assert sup.capacity.used == 1
            assert list(sup.registry.records) == [record.key]
            assert "a2" not in sup.runs
            pids = faults.tree(record.pid)
            [handoff] = await sup.stop([record.key])
            assert handoff["state"] == "stopped"
            await faults.ended(sup, record.key, state=State.STOPPED, pids=pids)


async def test_a_child_paused_before_its_hello_stays_paused_until_resumed(faults, tmp_path) -> None:
    # An interpreter that takes a second to start: the pause lands while the child is starting.
    python = tmp_path / "slow-python"
    python.write_text(f'#!/bin/sh\nsleep 1\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    script = faults.script("turn", 'turns:\n  - steps:\n      - reply: "first turn: {{task}}"\n')
    config = faults.config(
        sandbox="off", allow_unsandboxed=True, fork_server=False, python=str(python), model=script
    )
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="dropped", agent="scout")])
            before = record.state
            assert before is State.STARTING
            assert await sup.pause(record.key) == (record, True)
            assert record.state is State.PAUSED
            await sup.runs[record.key].connected.wait()
            await trio.sleep(0.2)  # the turn worker would have taken the task by now
            assert record.state is State.PAUSED
            assert record.turn == 0
            await sup.prompt(record.key, "go on")
            [note] = await sup.wait([record.key])
            assert note["report"] == "first turn: go on"
            await sup.stop([record.key])
