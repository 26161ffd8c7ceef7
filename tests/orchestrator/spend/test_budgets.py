"""The supervisor's budgets acting on usage: who is steered, who is told, who is stopped
(the ledger's arithmetic is tests/orchestrator/spend/test_limits.py; real children under
budgets are tests/faults/test_budgets.py)."""

from unittest.mock import Mock

import attrs
import trio
import trio.testing

import ipc
from orchestrator._records import ChildRecord
from orchestrator.core._notes import Notes
from orchestrator.spend._budgets import SOFT_STEER, Budgets
from orchestrator.spend._limits import Limit, parse_policy


@attrs.define(eq=False)
class _Run:
    record: ChildRecord
    steers: list[str] = attrs.Factory(list)
    stops: list[str] = attrs.Factory(list)
    flags: list[str] = attrs.Factory(list)

    @property
    def key(self) -> str:
        return self.record.key

    def flag_usage(self, line: str) -> None:
        self.flags.append(line)

    async def steer(self, text: str) -> None:
        self.steers.append(text)

    async def stop_incomplete(self, reason: str) -> None:
        self.stops.append(reason)


def _run(key: str) -> _Run:
    record = ChildRecord(
        key=key, name=key, agent="scout", mode="scout", task="t", workspace="/w", backend="pi"
    )
    return _Run(record=record)


async def test_only_the_childs_own_soft_limit_steers_it(nursery) -> None:
    # The session's soft limit is the parent's business: it is told, no child is steered.
    policy = parse_policy({"session": {"soft_tokens": 100, "hard_tokens": 10_000}})
    notes = Notes()
    budgets = Budgets(policy=policy, nursery=nursery, notes=notes, notifier=Mock(), session="s")
    run = _run("a1")
    budgets.open(run.record, Limit(soft_tokens=500, hard_tokens=900))
    budgets.on_usage(run, ipc.Usage(tokens=150))  # the session's soft limit, not the child's
    await trio.testing.wait_all_tasks_blocked()
    assert run.steers == []
    assert [n["budget"]["scope"] for n in notes.pending] == ["session"]
    budgets.on_usage(run, ipc.Usage(tokens=600))  # now the child's own
    await trio.testing.wait_all_tasks_blocked()
    assert run.steers == [SOFT_STEER]
    assert [n["budget"]["scope"] for n in notes.pending] == ["session", "child"]
    budgets.on_usage(run, ipc.Usage(tokens=700))  # each level once
    await trio.testing.wait_all_tasks_blocked()
    assert run.steers == [SOFT_STEER]
    assert run.stops == []
    budgets.on_usage(run, ipc.Usage(tokens=950))
    await trio.testing.wait_all_tasks_blocked()
    assert run.stops == ["budget spent: 950 of 900 tokens"]
    assert run.steers == [SOFT_STEER]


async def test_a_nested_childs_soft_limit_steers_it_and_tells_the_parent_only_by_event(
    nursery,
) -> None:
    policy = parse_policy(None)
    notes, notifier = Notes(), Mock()
    budgets = Budgets(policy=policy, nursery=nursery, notes=notes, notifier=notifier, session="s")
    run = _run("a2")
    run.record.parent = "a1"
    budgets.open(run.record, Limit(soft_tokens=10, hard_tokens=1000))
    budgets.on_usage(run, ipc.Usage(tokens=20))
    await trio.testing.wait_all_tasks_blocked()
    assert run.steers == [SOFT_STEER]
    assert notes.pending == []  # its parent is a child, which its own budget governs
    assert notifier.emit.call_count == 1
