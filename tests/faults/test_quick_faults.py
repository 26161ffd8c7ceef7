"""Fast real-child scenarios (not ``slow``): own-token redaction, a question's pause, ``ask``.

Each is a quicker twin of a slow scenario in this suite, so a bug in redaction or in the
question pause or in ``ask`` is caught by ``make test-fast`` too.
"""

import trio

from orchestrator._records import State
from orchestrator.core._supervisor import SpawnRequest, open_supervisor

CEILING = 30


async def test_a_childs_own_token_never_reaches_its_log_or_tail(faults) -> None:
    config = faults.rogue_config(record_output=True)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", name="rogue-leak")])
            token = sup.runs[record.key].token
            [note] = await sup.wait([record.key])  # it printed, then became the real child
            assert note["state"] == "idle"
            pids = faults.tree(record.pid)
            [handoff] = await sup.stop([record.key])
            await faults.ended(sup, record.key, state=State.STOPPED, pids=pids)
            data = (sup.paths.logs / f"{record.key}.log").read_bytes()
            tail = sup.logs(record.key)["tail"]
    assert token.encode() not in data
    assert token[:32].encode() not in data  # split across two writes: still caught whole
    assert token not in tail
    assert b"my token is [redacted] (leaked)" in data
    assert b"and again [redacted]" in data
    assert token not in str(handoff)


async def test_a_pending_question_pauses_both_budgets_through_the_supervisor(faults) -> None:
    asks = faults.script(
        "asks",
        """
        turns:
          - steps:
              - tool: ask_parent
                args: {question: "Which database?"}
              - reply: "using {{last}}"
        """,
    )
    config = faults.config(model=asks, idle_timeout_ms=300, max_total_ms=600)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="pick")])
            [note] = await sup.wait([record.key])
            assert note["question"]["text"] == "Which database?"
            await trio.sleep(1.3)  # both budgets would have run out twice over
            assert record.state is State.WAITING
            assert "failure" not in note
            sup.answer(note["question"]["id"], "postgres")
            [note] = await sup.wait([record.key])
            assert (note["state"], note["report"]) == ("idle", "using postgres")
            pids = faults.tree(record.pid)
            await sup.stop([record.key])
            await faults.ended(sup, record.key, state=State.STOPPED, pids=pids)


async def test_ask_pauses_a_working_child_answers_and_the_task_continues(faults) -> None:
    model = faults.script(
        "side",
        """
        turns:
          - steps:
              - say: "reading"
              - hang: true
          - steps:
              - reply: "resumed: {{task}}"
        side:
          - steps:
              - reply: "BTW: I am reading README.md"
        """,
    )
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(model=model)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="long task")])
            await faults.until(lambda: record.activity == "reading")
            assert await sup.ask(record.key, "what are you doing?") == "BTW: I am reading README.md"
            [note] = await sup.wait([record.key])
            assert note["state"] == "idle"
            assert note["report"].startswith("resumed: Continue the task")
            assert "long task" in note["report"]
            pids = faults.tree(record.pid)
            await sup.stop([record.key])
            await faults.ended(sup, record.key, state=State.STOPPED, pids=pids)
