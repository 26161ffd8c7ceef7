"""A child dies, hangs, never stops talking, or leaves a grandchild behind.

Each scenario checks the ending's invariants through ``faults.ended``: the terminal state, the
slot, lane and locks given back, the failure shown in exactly one ``wait`` note, no process left.
"""

import os
import signal
import time

import pytest
import trio

from orchestrator._records import State
from orchestrator.core._supervisor import SpawnRequest, open_supervisor

pytestmark = pytest.mark.slow

CEILING = 60

HANG = """
turns:
  - steps:
      - say: "working"
      - hang: true
"""

CHATTER = """
turns:
  - steps:
      - events: 100000
      - events: 100000000
"""


async def test_a_sigkilled_child_mid_turn_fails_as_killed(faults) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(model=faults.script("hang", HANG))) as sup:
            [record] = await sup.spawn([SpawnRequest(task="hang")])
            await faults.until(lambda: record.activity == "working")
            pids = faults.tree(record.pid)
            faults.child_process(record.key).send_signal(signal.SIGKILL)
            note = await faults.ended(sup, record.key, state=State.FAILED, kind="killed", pids=pids)
            assert "SIGKILL" in note["failure"]["error"]


async def test_a_stopped_child_is_killed_at_the_idle_budget(faults) -> None:
    config = faults.config(
        model=faults.script("chatter", CHATTER), idle_timeout_ms=1000, max_total_ms=60_000
    )
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="talk")])
            await faults.until(lambda: record.activity.startswith("event "))
            pids = faults.tree(record.pid)
            faults.child_process(record.key).send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            note = await faults.ended(sup, record.key, state=State.FAILED, kind="idle", pids=pids)
            assert note["failure"]["error"] == "idle budget of 1000 ms ran out"
            # Heartbeats came every 0.1 s until the stop; then the idle budget, then the kill
            # ladder (SIGTERM is held by a stopped process, so SIGKILL after the grace).
            elapsed = time.monotonic() - stopped
            assert 0.8 <= elapsed <= 1.0 + config.kill_grace + 0.3 + 2.0


async def test_a_child_streaming_events_forever_is_killed_at_max_total(faults) -> None:
    config = faults.config(
        model=faults.script("chatter", CHATTER), idle_timeout_ms=500, max_total_ms=2000
    )
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="talk")])
            await faults.until(lambda: record.state is State.WORKING and not record.queued)
            started = time.monotonic()
            pids = faults.tree(record.pid)
            note = await faults.ended(
                sup, record.key, state=State.FAILED, kind="max-total", pids=pids
            )
            assert note["failure"]["error"] == "max-total budget of 2000 ms ran out"
            assert time.monotonic() - started >= 1.9


async def test_a_pending_question_pauses_both_budgets(faults) -> None:
    asks = faults.script(
        "asks",
        """
        turns:
          - steps:
              - tool: ask_parent
                args: {question: "Which database?"}
              - reply: "using {{last}}"
          - steps:
              - hang: true
        """,
    )
    config = faults.config(model=asks, idle_timeout_ms=300, max_total_ms=600)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="pick")])
            [note] = await sup.wait([record.key])
            assert note["question"]["text"] == "Which database?"
            await trio.sleep(1.5)  # both budgets would have run out twice over
            assert record.state is State.WAITING
            sup.answer(note["question"]["id"], "postgres")
            [note] = await sup.wait([record.key])
            assert (note["state"], note["report"]) == ("idle", "using postgres")
            # The budgets count again in the next turn: a silent one hits the idle budget.
            await sup.prompt(record.key, "now hang")
            pids = faults.tree(record.pid)
            await faults.ended(sup, record.key, state=State.FAILED, kind="idle", pids=pids)


@pytest.mark.parametrize("sandbox", ["auto", "off"])
async def test_a_grandchild_holding_stdout_does_not_hold_up_stop(faults, sandbox: str) -> None:
    # Unsandboxed, the grandchild outlives the shell and leaves the process tree: only the
    # run's environment marker finds it. Sandboxed, it dies with the pid namespace too.
    config = faults.config(sandbox=sandbox, allow_unsandboxed=sandbox == "off")
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn(
                [
                    SpawnRequest(
                        task="background it",
                        backend="command",
                        command=("sh", "-c", "sleep 60 & echo done"),
                    )
                ]
            )
            # The command printed "done" and exited; its grandchild keeps the pipe open, so
            # the turn does not settle.
            await faults.until(lambda: record.activity.startswith("command "))
            await trio.sleep(0.5)
            assert record.state is State.WORKING
            pids = faults.marked(record.key)
            assert any("sleep" in " ".join(faults.cmdline(pid)) for pid in pids)
            started = time.monotonic()
            [handoff] = await sup.stop([record.key])
            assert time.monotonic() - started <= config.drain_timeout + config.kill_grace + 1.0
            assert handoff["state"] == "stopped"
            await faults.ended(sup, record.key, state=State.STOPPED, pids=pids)


async def test_a_sigkilled_child_leaves_the_rest_of_the_fleet_alone(faults) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(model=faults.script("hang", HANG))) as sup:
            victim, bystander = await sup.spawn(
                [SpawnRequest(task="one"), SpawnRequest(task="two")]
            )
            await faults.until(lambda: victim.activity == bystander.activity == "working")
            pids = faults.tree(victim.pid)
            os.kill(faults.child_process(victim.key).pid, signal.SIGKILL)
            await faults.ended(
                sup, victim.key, state=State.FAILED, kind="killed", pids=pids, capacity=1, working=1
            )
            assert bystander.state is State.WORKING
            assert faults.child_process(bystander.key).is_running()


async def test_a_killed_childs_escaped_grandchildren_are_found_and_killed(faults) -> None:
    # setsid + a subshell: the grandchild leaves the child's session and its process tree.
    escape = ("sh", "-c", "(setsid sleep 61 &); echo started; sleep 60")
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(sandbox="off", allow_unsandboxed=True)) as sup:
            [record] = await sup.spawn(
                [SpawnRequest(task="escape", backend="command", command=escape)]
            )
            await faults.until(
                lambda: any("61" in faults.cmdline(pid) for pid in faults.marked(record.key))
            )
            pids = faults.marked(record.key)
            assert record.pid is not None
            assert not set(pids) <= set(faults.tree(record.pid))  # escaped from the tree
            faults.child_process(record.key).send_signal(signal.SIGKILL)
            await faults.ended(sup, record.key, state=State.FAILED, kind="killed", pids=pids)
