"""The supervisor's budgets acting on usage: who is steered, who is told, who is stopped
(the ledger's arithmetic is tests/orchestrator/spend/test_limits.py; real children under
budgets are tests/faults/test_budgets.py)."""

import json
from unittest.mock import Mock

import attrs
import pytest
import trio
import trio.testing

import ipc
from ipc._types import PROTOCOL_VERSION
from orchestrator._errors import PolicyError
from orchestrator._records import ChildRecord
from orchestrator.core._notes import Notes
from orchestrator.spend._budgets import SOFT_STEER, Budgets
from orchestrator.spend._limits import Limit, parse_policy
from orchestrator.spend._metering import Metered


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


def _tree(budgets: Budgets, runs: dict[str, _Run], key: str, parent: str | None) -> _Run:
    run = _run(key)
    if parent is not None:
        run.record.parent = parent
        run.record.depth = runs[parent].record.depth + 1
    budgets.check_spawn(1, parent)
    budgets.open(
        run.record, budgets.limit_for("scout", definition=None, requested=None, parent=parent)
    )
    runs[key] = run
    return run


async def test_a_tree_cap_stops_only_that_trees_children(nursery) -> None:
    """#37 item 3: two trees (a1 > a2 > a3, b1 > b2); a2's bill passes the tree's soft cap
    (a1, a2, a3 steered), a3's its hard cap: the gateway refuses a1, a2 and a3 and each is
    stopped incomplete, the deepest first; b1 and b2 are neither steered nor refused."""
    policy = parse_policy({"tree": {"soft_tokens": 200, "hard_tokens": 300}})
    runs: dict[str, _Run] = {}
    notes = Notes()
    budgets = Budgets(
        policy=policy, nursery=nursery, notes=notes, notifier=Mock(), session="s", runs=runs
    )
    a1, b1 = _tree(budgets, runs, "a1", None), _tree(budgets, runs, "b1", None)
    a2, b2 = _tree(budgets, runs, "a2", "a1"), _tree(budgets, runs, "b2", "b1")
    a3 = _tree(budgets, runs, "a3", "a2")
    budgets.on_metered(b2, Metered(input_tokens=250))  # b's own tree: its soft cap
    budgets.on_metered(a2, Metered(input_tokens=150, output_tokens=100))
    await trio.testing.wait_all_tasks_blocked()
    assert [r.steers for r in (a1, a2, a3)] == [[SOFT_STEER]] * 3
    assert b1.steers == b2.steers == [SOFT_STEER]
    b1.steers.clear()
    b2.steers.clear()
    assert budgets.refusal("a3") is None
    budgets.on_metered(a3, Metered(output_tokens=60, cache_read_tokens=10))  # cache reads count
    await trio.testing.wait_all_tasks_blocked()
    reason = "tree budget spent: 320 of 300 tokens"
    assert [r.stops for r in (a3, a2, a1)] == [[reason]] * 3
    for key in ("a1", "a2", "a3"):
        assert budgets.refusal(key) == (
            "fleet: tree a1 budget spent (320 of 300 tokens): no more model requests"
        )
    assert (budgets.refusal("b1"), budgets.refusal("b2")) == (None, None)
    assert (b1.stops, b2.stops, b1.steers, b2.steers) == ([], [], [], [])
    lines = [n["budget"]["line"] for n in notes.pending if n["key"] == "a1"]
    assert lines == [
        "tree budget soft limit reached: 250 of 200 tokens",
        "tree budget hard limit reached: 320 of 300 tokens",
    ]
    # The spent tree starts nothing more: no turn, no nested spawn; the other tree may.
    with pytest.raises(PolicyError, match=r"^prompt a1: tree a1 budget spent: no new turns$"):
        budgets.check_turn("prompt a1", "a1")
    with pytest.raises(PolicyError, match=r"^spawn: tree a1 budget spent \(320 of 300 tokens\)"):
        budgets.check_spawn(1, "a3")
    budgets.check_turn("prompt b1", "b1")
    budgets.check_spawn(1, "b2")
    report = budgets.report()
    trees = {t["key"]: t for t in report["trees"]}
    assert trees["a1"]["members"] == ["a1", "a2", "a3"]
    assert (trees["a1"]["tokens"], trees["a1"]["spawns"], trees["a1"]["turns"]) == (320, 2, 3)
    assert trees["a1"]["left"] == {"soft_tokens": 0, "hard_tokens": 0}
    assert trees["a1"]["reached"] == ["hard", "soft"]
    assert trees["b1"]["left"] == {"soft_tokens": 0, "hard_tokens": 50}
    assert trees["b1"]["turns"] == 3  # b1's task, b2's task, the prompt just admitted


async def test_hard_spawn_and_turn_caps_refuse_in_one_line(nursery) -> None:
    policy = parse_policy(
        {
            "session": {"hard_spawns": 4},
            "tree": {"soft_spawns": 1, "hard_spawns": 2, "hard_turns": 4},
            "child": {"hard_turns": 2},
        }
    )
    runs: dict[str, _Run] = {}
    notes = Notes()
    budgets = Budgets(
        policy=policy, nursery=nursery, notes=notes, notifier=Mock(), session="s", runs=runs
    )
    with pytest.raises(PolicyError) as info:
        budgets.check_spawn(5, None)
    assert str(info.value) == (
        "spawn: session cap reached (0 of 4 spawns (+5 asked)): no new children"
    )
    a1 = _tree(budgets, runs, "a1", None)
    _tree(budgets, runs, "a2", "a1")
    await trio.testing.wait_all_tasks_blocked()
    assert a1.steers == [SOFT_STEER]  # the tree's soft spawn cap
    assert (a1.record.usage["spawns"], a1.record.usage["turns"]) == (1, 1)  # in peek
    assert [n["budget"]["line"] for n in notes.pending] == [
        "tree budget soft limit reached: 1 of 1 spawns"
    ]
    _tree(budgets, runs, "a3", "a2")
    with pytest.raises(PolicyError) as info:
        budgets.check_spawn(1, "a3")
    assert str(info.value) == "spawn: tree a1 cap reached (2 of 2 spawns): no new children"
    budgets.check_turn("prompt a1", "a1")  # a1's second turn, the tree's fourth
    with pytest.raises(PolicyError) as info:
        budgets.check_turn("prompt a2", "a2")
    assert str(info.value) == "prompt a2: tree a1 turn cap reached (4 of 4 turns): no new turns"
    b1 = _tree(budgets, runs, "b1", None)
    budgets.check_turn("prompt b1", "b1")
    with pytest.raises(PolicyError) as info:
        budgets.check_turn("ask b1", "b1")
    assert str(info.value) == "ask b1: b1 turn cap reached (2 of 2 turns): no new turns"
    assert budgets.report()["session"]["left"] == {"hard_spawns": 0}
    with pytest.raises(PolicyError, match=r"^spawn: session cap reached \(4 of 4 spawns\)"):
        budgets.check_spawn(1, None)
    assert b1.stops == []


async def test_a_hostile_child_cannot_raise_its_own_cap(nursery) -> None:
    """A child's nested spawn carries no budget on the wire (a frame that adds one is refused
    whole), and whatever a spawn asks its grandchild's limit is capped by what the caller
    holds; the tree's and the session's caps come from the configuration only."""
    envelope = ipc.Envelope(
        v=PROTOCOL_VERSION,
        token="t",  # noqa: S106 - a test frame
        owner="a1",
        corr="1",
        kind="request",
        type="spawn",
        body=ipc.Spawn(agent="helper", task="t"),
    )
    frame = json.loads(ipc.encode_envelope(envelope))
    frame["body"]["budget"] = {"hard_tokens": 10**9}
    with pytest.raises(ipc.SchemaError, match="budget"):
        ipc.decode_envelope(json.dumps(frame).encode())
    policy = parse_policy(
        {"child": {"hard_tokens": 1000, "hard_turns": 5}, "tree": {"hard_spawns": 1}}
    )
    runs: dict[str, _Run] = {}
    budgets = Budgets(
        policy=policy, nursery=nursery, notes=Notes(), notifier=Mock(), session="s", runs=runs
    )
    lead = _run("a1")
    budgets.open(
        lead.record,
        budgets.limit_for(
            "scout", definition=None, requested={"hard_tokens": 100, "hard_turns": 2}, parent=None
        ),
    )
    runs["a1"] = lead
    with pytest.raises(PolicyError, match="above the configured 1000"):
        budgets.limit_for("scout", definition=None, requested={"hard_tokens": 5000}, parent="a1")
    asked = budgets.limit_for(
        "scout", definition=None, requested={"hard_tokens": 500, "hard_turns": 4}, parent="a1"
    )
    assert (asked.hard_tokens, asked.hard_turns) == (100, 2)  # clamped to what a1 holds
    budgets.check_spawn(1, "a1")
    helper = _run("a2")
    helper.record.parent = "a1"
    budgets.open(helper.record, asked)
    with pytest.raises(PolicyError, match=r"^spawn: tree a1 cap reached \(1 of 1 spawns\)"):
        budgets.check_spawn(1, "a2")  # a grandchild spawning on its own tree's account
