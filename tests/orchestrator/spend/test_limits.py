"""Budgets, prices and the ledger as tables: pure parts, no processes."""

from typing import Any

import attrs
import pytest

from orchestrator._errors import PolicyError, UsageError
from orchestrator._records import budget_from_text
from orchestrator.spend._ledger import Crossing, Ledger
from orchestrator.spend._limits import (
    Limit,
    Price,
    clamp,
    lower,
    parse_limit,
    parse_policy,
    resolve_limit,
)
from orchestrator.spend._metering import Metered


@attrs.frozen(kw_only=True)
class U:
    tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    model: str = ""
    cost_usd: float | None = None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, Limit()),
        ({}, Limit()),
        ({"hard_tokens": 100}, Limit(hard_tokens=100)),
        ({"soft_tokens": 80, "hard_tokens": 100}, Limit(soft_tokens=80, hard_tokens=100)),
        ({"soft_usd": 1, "hard_usd": 2.5}, Limit(soft_usd=1.0, hard_usd=2.5)),
        ({"hard_tokens": 0}, Limit(hard_tokens=0)),
        ({"hard_tokens": 100.0}, Limit(hard_tokens=100)),
    ],
)
def test_parse_limit_accepts(value: object, expected: Limit) -> None:
    assert parse_limit(value, "x") == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"hard": 5},
            (
                "x: unknown key 'hard' (one of soft_tokens, hard_tokens, soft_usd, hard_usd, "
                "soft_spawns, hard_spawns, soft_turns, hard_turns)"
            ),
        ),
        ({"hard_tokens": -1}, "x: hard_tokens -1 must be a finite number >= 0"),
        ({"hard_tokens": True}, "x: hard_tokens True must be a number"),
        ({"hard_usd": "2"}, "x: hard_usd '2' must be a number"),
        ({"hard_tokens": 1.5}, "x: hard_tokens 1.5 must be a whole number"),
        ({"hard_usd": float("inf")}, "x: hard_usd inf must be a finite number >= 0"),
        (
            {"soft_tokens": 100, "hard_tokens": 100},
            "x: soft_tokens 100 must be below hard_tokens 100",
        ),
        ({"soft_usd": 3, "hard_usd": 2}, "x: soft_usd 3 must be below hard_usd 2"),
        (
            [1],
            (
                "x must be a mapping of soft_tokens, hard_tokens, soft_usd, hard_usd, soft_spawns, "
                "hard_spawns, soft_turns, hard_turns"
            ),
        ),
    ],
)
def test_parse_limit_refuses_with_one_line(value: object, message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_limit(value, "x")
    assert str(info.value) == message
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5000", {"hard_tokens": 5000}),
        ("hard_tokens=500,soft_usd=0.5", {"hard_tokens": 500, "soft_usd": 0.5}),
        (" soft_tokens = 10 , hard_tokens=20 ", {"soft_tokens": 10, "hard_tokens": 20}),
    ],
)
def test_budget_from_text(text: str, expected: dict[str, float]) -> None:
    assert budget_from_text(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [("soft_tokens=1,hard", "must be KEY=NUMBER"), ("hard_tokens=lots", "is not a")],
)
def test_budget_from_text_refuses(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        budget_from_text(text)
    # the keys and their values are checked by the supervisor, as for every other client
    with pytest.raises(UsageError, match="unknown key 'hard'"):
        parse_limit(budget_from_text("hard=5"), "x")


CONF = Limit(soft_tokens=800, hard_tokens=1000, hard_usd=2.0)


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        (None, CONF),
        (Limit(), CONF),
        (Limit(hard_tokens=900), Limit(soft_tokens=800, hard_tokens=900, hard_usd=2.0)),
        # a lowered hard under the configured soft drops that soft
        (Limit(hard_tokens=500), Limit(hard_tokens=500, hard_usd=2.0)),
        (
            Limit(soft_tokens=100, hard_tokens=500),
            Limit(soft_tokens=100, hard_tokens=500, hard_usd=2.0),
        ),
        # a limit where none is configured is a lowering from "none"
        (Limit(soft_usd=1.0), Limit(soft_tokens=800, hard_tokens=1000, soft_usd=1.0, hard_usd=2.0)),
        (Limit(hard_tokens=1000), CONF),
    ],
)
def test_lower(requested: Limit | None, expected: Limit) -> None:
    assert lower(CONF, requested) == expected


@pytest.mark.parametrize(
    ("requested", "message"),
    [
        (Limit(hard_tokens=1001), "spawn: budget hard_tokens 1001 is above the configured 1000"),
        (Limit(hard_usd=2.5), "spawn: budget hard_usd 2.5 is above the configured 2"),
        (Limit(soft_tokens=900), "spawn: budget soft_tokens 900 is above the configured 800"),
    ],
)
def test_lower_refuses_a_raise(requested: Limit, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        lower(CONF, requested)
    assert str(info.value).startswith(message)
    assert "never raise" in str(info.value)


def test_lower_refuses_an_explicit_soft_above_the_lowered_hard() -> None:
    with pytest.raises(UsageError, match="soft_tokens 700 must be below hard_tokens 600"):
        lower(CONF, Limit(soft_tokens=700, hard_tokens=600))


def test_clamp_never_raises() -> None:
    assert clamp(CONF, Limit(hard_tokens=5000)) == CONF
    assert clamp(CONF, Limit(hard_tokens=300)) == Limit(hard_tokens=300, hard_usd=2.0)
    assert clamp(Limit(), CONF) == CONF
    assert clamp(CONF, None) == CONF


POLICY = {
    "session": {"soft_tokens": 5000, "hard_tokens": 10000},
    "child": {"hard_tokens": 1000},
    "agents": {"worker": {"hard_tokens": 3000, "hard_usd": 1}},
}
PRICES = {"gpt-test": {"input": 1, "output": 2, "cache_read": 0.5, "cache_write": 4}}


def test_parse_policy_whole() -> None:
    policy = parse_policy(POLICY, PRICES)
    assert policy.session == Limit(soft_tokens=5000, hard_tokens=10000)
    assert policy.configured("scout") == Limit(hard_tokens=1000)
    assert policy.configured("worker") == Limit(hard_tokens=3000, hard_usd=1.0)
    assert policy.price_for("gpt-test") == Price(input=1, output=2, cache_read=0.5, cache_write=4)
    assert policy.price_for("openai/gpt-test") == policy.price_for("gpt-test")
    assert policy.price_for("other") is None
    assert parse_policy(None, None).session.empty


@pytest.mark.parametrize(
    ("budget", "prices", "message"),
    [
        (
            {"sesion": {}},
            None,
            "subagents.budget: unknown key 'sesion' (one of session, tree, child, agents)",
        ),
        ({"session": {"soft_usd": 9, "hard_usd": 1}}, None, "subagents.budget.session: soft_usd 9"),
        ({"agents": ["worker"]}, None, "subagents.budget.agents must be a mapping"),
        ({"agents": {"w": {"hard_tokens": -3}}}, None, "subagents.budget.agents.w: hard_tokens -3"),
        (None, {"m": {"inptu": 1}}, "subagents.prices.m: unknown key 'inptu'"),
        (None, {"m": {"input": -1}}, "subagents.prices.m: input -1 must be"),
        (None, ["m"], "subagents.prices must be a mapping"),
        ("lots", None, "subagents.budget must be a mapping"),
    ],
)
def test_parse_policy_refuses(budget: object, prices: object, message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_policy(budget, prices)
    assert str(info.value).startswith(message)


def test_resolve_limit_chain() -> None:
    policy = parse_policy(POLICY)
    # the definition's budget may only lower the configured one
    assert resolve_limit(policy, "worker", definition=Limit(hard_tokens=9000)) == Limit(
        hard_tokens=3000, hard_usd=1.0
    )
    assert resolve_limit(policy, "worker", definition=Limit(hard_tokens=2000)).hard_tokens == 2000
    with pytest.raises(PolicyError, match="spawn worker: budget hard_tokens 4000"):
        resolve_limit(policy, "worker", requested=Limit(hard_tokens=4000))
    # a nested child never gets more than its parent holds
    nested = resolve_limit(policy, "worker", parent=Limit(hard_tokens=500))
    assert nested == Limit(hard_tokens=500, hard_usd=1.0)


def _ledger(**kwargs: Any) -> Ledger:
    return Ledger(policy=parse_policy(kwargs.get("budget", POLICY), kwargs.get("prices", PRICES)))


def test_ledger_child_levels_each_once() -> None:
    ledger = _ledger()
    ledger.open("a1", "scout", Limit(soft_tokens=80, hard_tokens=100))
    assert ledger.record("a1", U(tokens=50)) == []
    assert ledger.record("a1", U(tokens=85)) == [
        Crossing(scope="child", level="soft", what="85 of 80 tokens")
    ]
    assert ledger.record("a1", U(tokens=90)) == []
    assert ledger.record("a1", U(tokens=120)) == [
        Crossing(scope="child", level="hard", what="120 of 100 tokens")
    ]
    assert ledger.record("a1", U(tokens=130)) == []
    assert ledger.record("zz", U(tokens=130)) == []  # an unknown child is ignored


def test_ledger_hard_at_once_implies_soft() -> None:
    ledger = _ledger()
    ledger.open("a1", "scout", Limit(soft_tokens=80, hard_tokens=100))
    assert [c.level for c in ledger.record("a1", U(tokens=500))] == ["hard"]
    assert ledger.accounts["a1"].reached == {"soft", "hard"}


def test_ledger_cost_reported_wins_else_priced_else_unknown() -> None:
    ledger = _ledger(budget=None)
    ledger.open("a1", "scout", Limit(hard_usd=10.0))
    ledger.record("a1", U(tokens=10, model="gpt-test", cost_usd=0.25))
    assert ledger.accounts["a1"].cost_usd == 0.25
    usage = U(
        tokens=3_000_000,
        input_tokens=1_000_000,
        output_tokens=1_000_000,
        cache_read_tokens=1_000_000,
        cache_write_tokens=0,
        model="gpt-test",
    )
    ledger.open("a2", "scout", Limit(soft_usd=3.0, hard_usd=4.0))
    assert ledger.record("a2", usage) == [
        Crossing(scope="child", level="soft", what="$3.5000 of $3")
    ]
    ledger.open("a3", "scout", Limit(hard_usd=0.0))
    assert ledger.record("a3", U(tokens=10**9, model="unpriced")) == []
    assert ledger.accounts["a3"].cost_usd is None


def test_ledger_session_and_report() -> None:
    ledger = _ledger(budget={"session": {"soft_tokens": 100, "hard_tokens": 200}})
    ledger.open("a1", "scout", Limit())
    ledger.open("a2", "worker", Limit())
    assert ledger.session_refusal() is None
    assert ledger.record("a1", U(tokens=120)) == [
        Crossing(scope="session", level="soft", what="120 of 100 tokens")
    ]
    assert ledger.record("a2", U(tokens=90, input_tokens=60, output_tokens=30)) == [
        Crossing(scope="session", level="hard", what="210 of 200 tokens")
    ]
    refusal = ledger.session_refusal()
    assert refusal is not None
    assert refusal.startswith("session budget spent (210 of 200 tokens): no new turns")
    report = ledger.report()
    assert set(report) == {"session", "trees", "agents", "definitions"}
    assert [a["key"] for a in report["agents"]] == ["a1", "a2"]
    assert report["agents"][1]["input_tokens"] == 60
    assert report["agents"][1]["agent"] == "worker"
    assert report["definitions"]["scout"]["tokens"] == 120
    assert [a["key"] for a in ledger.report(["a2"])["agents"]] == ["a2"]
    assert report["session"]["tokens"] == 210
    assert report["session"]["reached"] == ["hard", "soft"]
    assert report["session"]["budget"] == {"soft_tokens": 100, "hard_tokens": 200}


def test_a_report_never_lowers_what_was_spent() -> None:
    ledger = _ledger(budget=None)
    ledger.open("a1", "scout", Limit(hard_tokens=100, hard_usd=1.0))
    ledger.record("a1", U(tokens=90, input_tokens=80, cost_usd=0.9))
    # a hostile or confused child reports less: nothing is unspent
    assert ledger.record("a1", U(tokens=5, input_tokens=1, cost_usd=0.1)) == []
    account = ledger.accounts["a1"]
    assert (account.tokens, account.input_tokens, account.cost_usd) == (90, 80, 0.9)
    assert [c.level for c in ledger.record("a1", U(tokens=1, cost_usd=1.0))] == ["hard"]


def test_a_report_never_goes_negative_and_each_lie_is_flagged() -> None:
    ledger = _ledger(budget=None, prices={"m": {"input": 1.0}})
    ledger.open("a1", "scout", Limit(hard_usd=1.0))
    problems: list[str] = []
    for cost in (-997.0, float("nan"), float("-inf")):
        ledger.record("a1", U(tokens=-5, input_tokens=-1, model="m", cost_usd=cost), problems)
    account = ledger.accounts["a1"]
    assert (account.tokens, account.input_tokens, account.cost_usd) == (0, 0, 0.0)
    assert ledger.session()["cost_usd"] == 0.0
    assert "cost_usd -997.0 is negative: refused" in problems
    assert "cost_usd nan is not a number: refused" in problems
    assert "tokens -5 is not a whole number >= 0: counted as 0" in problems
    assert account.as_json()["flags"] == problems[:20]
    # a real spend after the lies still reaches the limit
    assert [c.level for c in ledger.record("a1", U(tokens=10, cost_usd=1.5))] == ["hard"]


def test_a_new_life_adds_and_a_restored_account_goes_on_from_the_journal() -> None:
    ledger = _ledger(budget=None, prices={"m": {"input": 1.0, "output": 1.0}})
    ledger.open("a1", "scout", Limit(hard_tokens=300))
    ledger.record("a1", U(tokens=120, input_tokens=100, output_tokens=20, model="m"))
    ledger.new_life("a1")  # woken: the new process reports from zero
    assert ledger.record("a1", U(tokens=120, input_tokens=100, output_tokens=20)) == []
    account = ledger.accounts["a1"]
    assert (account.tokens, account.input_tokens) == (240, 200)
    assert account.cost_usd == pytest.approx(240 / 1e6)
    spent = ledger.spent(account)
    # a supervisor restart: a new ledger restores it; the revived child's open keeps it
    again = _ledger(budget=None, prices={"m": {"input": 1.0, "output": 1.0}})
    again.restore("a1", spent, "scout")
    assert again.report()["session"]["tokens"] == 240
    again.open("a1", "scout", Limit(hard_tokens=300))
    crossings = again.record("a1", U(tokens=120, input_tokens=100, output_tokens=20))
    assert crossings == [Crossing(scope="child", level="hard", what="360 of 300 tokens")]
    assert again.accounts["a1"].cost_usd == pytest.approx(360 / 1e6)
    again.restore("a2", {"tokens": -5, "cost_usd": -1.0, "model": 3}, "scout")
    assert (again.accounts["a2"].tokens, again.accounts["a2"].cost_usd) == (0, None)


def test_fleet_usage_says_what_is_left_of_each_limit() -> None:
    ledger = _ledger(budget={"session": {"hard_tokens": 1000, "hard_usd": 1.0}})
    ledger.open("a1", "scout", Limit(soft_tokens=100, hard_tokens=300))
    ledger.record("a1", U(tokens=120, cost_usd=0.25))
    report = ledger.report()
    assert report["agents"][0]["left"] == {"soft_tokens": 0, "hard_tokens": 180}
    assert report["session"]["left"] == {"hard_tokens": 880, "hard_usd": 0.75}


def test_a_trees_spend_turns_and_members_survive_a_restart() -> None:
    budget = {"tree": {"hard_tokens": 100, "hard_turns": 5}}
    ledger = _ledger(budget=budget)
    ledger.open("a1", "lead", Limit())
    ledger.open("a2", "helper", Limit(), parent="a1")
    ledger.open("a3", "helper", Limit(), parent="a2")
    for key in ("a1", "a2", "a3", "a1"):
        ledger.count_turn(key)
    [crossing] = ledger.record("a3", U(tokens=150))
    assert (crossing.scope, crossing.level, crossing.tree) == ("tree", "hard", "a1")
    again = _ledger(budget=budget)  # a new supervisor, from the journal's usage records
    for key, account in ledger.accounts.items():
        again.restore(key, ledger.spent(account), account.agent)
    assert [again.tree_of(k) for k in ("a1", "a2", "a3")] == ["a1", "a1", "a1"]
    assert again.tree("a1") | {"cost_usd": None} == ledger.tree("a1") | {"cost_usd": None}
    assert again.tree("a1")["turns"] == 4
    assert again.tree_refusal("a2") == "tree a1 budget spent (150 of 100 tokens)"
    assert again.refuse_turn("a1") == "tree a1 budget spent: no new turns"
    assert (
        again.refuse_spawn("a3", 1) == "tree a1 budget spent (150 of 100 tokens): no new children"
    )
    again.open("b1", "lead", Limit())
    assert again.tree_refusal("b1") is None
    assert again.refuse_spawn("b1", 1) == ""


def test_a_trees_dollar_cap_counts_cache_reads_and_writes_as_priced() -> None:
    prices = {"m": {"input": 1, "output": 10, "cache_read": 0.1, "cache_write": 2}}
    ledger = _ledger(budget={"tree": {"soft_usd": 0.001, "hard_usd": 0.002}}, prices=prices)
    ledger.open("a1", "lead", Limit())
    ledger.open("a2", "helper", Limit(), parent="a1")
    ledger.open("b1", "lead", Limit())
    # 10000 cache reads at $0.1/M: $0.001, the soft cap, though no "fresh" token was billed.
    [soft] = ledger.meter("a2", Metered(cache_read_tokens=10_000, model="m"))
    assert (soft.scope, soft.level, soft.tree, soft.what) == (
        "tree",
        "soft",
        "a1",
        "$0.0010 of $0.001",
    )
    [hard] = ledger.meter("a1", Metered(cache_write_tokens=600, model="m"))
    assert (hard.level, hard.what) == ("hard", "$0.0022 of $0.002")
    assert ledger.tree_refusal("a2") == "tree a1 budget spent ($0.0022 of $0.002)"
    assert ledger.tree_refusal("b1") is None
    assert ledger.meter("b1", Metered(cache_read_tokens=9_000, model="m")) == []
