"""Usage budgets through the real supervisor: real children, the scripted model and the
loopback model server reporting usage (issue 18, item 1).

Each scenario waits for the state it needs under a deadline and reads the notes without taking
them, so no ``wait`` is left to hang on a note another step consumed.
"""

import json
import sys
from typing import Any

import pytest
import trio

from orchestrator._errors import PolicyError, UsageError
from orchestrator._records import TERMINAL, ChildRecord, State
from orchestrator.core._journaling import NoJournal
from orchestrator.core._supervisor import SpawnRequest, Supervisor, open_supervisor
from orchestrator.spend._budgets import SOFT_STEER
from tests.fakes.model_server import ModelServer
from tests.faults.conftest import Faults

CEILING = 40


def budget_notes(sup: Supervisor, key: str) -> list[dict[str, Any]]:
    return [n for n in sup.notes.pending if n["key"] == key and "budget" in n]


async def settled_state(sup: Supervisor, key: str, states: frozenset[State]) -> None:
    """Until *key* is in one of *states* with nothing queued (the caller holds the deadline)."""
    record = sup.registry.find(key)
    await Faults.until(lambda: record.state in states and not record.queued)


READ = {"tool_calls": [{"name": "read", "arguments": {"path": "README.md"}}]}
STEER_LINE = f"Steer from parent: {SOFT_STEER}"


def steers_seen(request: Any) -> int:
    return sum(m.get("content") == STEER_LINE for m in request.body["messages"])


@pytest.mark.slow
async def test_the_soft_limit_steers_the_child_once_and_tells_the_parent(faults) -> None:
    async with ModelServer() as srv:
        # The first step's usage (100 in, 20 out) passes the soft limit; the second answer is
        # held a second, so the steer is in by the third request at the latest.
        srv.script("c1", [READ, {**READ, "delay": 1}, {"text": "done"}, {"text": "again"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        budget = {"child": {"soft_tokens": 100, "hard_tokens": 10_000}}
        with trio.fail_after(CEILING):
            async with open_supervisor(faults.config(model=model, budget=budget)) as sup:
                [record] = await sup.spawn([SpawnRequest(task="read")])
                await settled_state(sup, record.key, frozenset({State.IDLE}))
                [note] = budget_notes(sup, record.key)
                usage = sup.peek([record.key])["agents"][0]["usage"]
                # Once: a second turn past the soft limit neither steers nor notes again.
                await sup.prompt(record.key, "again")
                await settled_state(sup, record.key, frozenset({State.IDLE}))
                notes = budget_notes(sup, record.key)
                await sup.stop([record.key])
        requests = srv.requests("c1")
    # Steered once: in the conversation from the second or third request on, never twice.
    seen = [steers_seen(r) for r in requests]
    assert seen in ([0, 1, 1, 1], [0, 0, 1, 1]), seen
    assert (record.report, len(notes)) == ("again", 1)
    assert note["budget"]["scope"] == "child"
    assert note["budget"]["level"] == "soft"
    assert note["budget"]["line"] == "budget soft limit reached: 120 of 100 tokens"
    assert usage["reached"] == ["soft"]
    assert usage["budget"] == {"soft_tokens": 100, "hard_tokens": 10_000}
    assert (usage["input_tokens"], usage["output_tokens"]) == (300, 60)


async def test_the_hard_limit_stops_the_child_with_an_incomplete_handoff(faults) -> None:
    async with ModelServer() as srv:
        srv.script(
            "c1",
            [
                {"tool_calls": [{"name": "read", "arguments": {"path": "README.md"}}]},
                {"delay": 5, "text": "never reached"},
            ],
        )
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        budget = {"child": {"hard_tokens": 100}}
        with trio.fail_after(CEILING):
            # The builtin agent's openai model reports no cost: the price table prices it.
            prices = {"fake-model": {"input": 1, "output": 2}}
            config = faults.config(model=model, budget=budget, prices=prices)
            async with open_supervisor(config) as sup:
                [record] = await sup.spawn([SpawnRequest(task="read")])
                await settled_state(sup, record.key, TERMINAL)
                [handoff] = await sup.stop([record.key])
                report = sup.spend.report()
                notes = [n for n in sup.notes.pending if n["key"] == record.key]
    assert record.state is State.STOPPED
    assert handoff["incomplete"] == "budget spent: 120 of 100 tokens"
    assert any(n.get("incomplete") == handoff["incomplete"] for n in notes)
    [child] = [a for a in report["agents"] if a["key"] == record.key]
    # The model server's default usage (100 in, 20 out) in the backend's own fields.
    assert (child["input_tokens"], child["output_tokens"], child["tokens"]) == (100, 20, 120)
    assert child["model"] == "fake-model"
    assert child["cost_usd"] == pytest.approx((100 * 1 + 20 * 2) / 1e6)
    assert child["reached"] == ["hard", "soft"]


async def test_the_session_hard_limit_refuses_new_turns(faults) -> None:
    model = faults.script("one", 'turns:\n  - steps:\n      - reply: "{{task}} done and dusted"\n')
    budget = {"session": {"soft_tokens": 1, "hard_tokens": 3}}
    events = faults.scripts / "events.jsonl"
    # The budget event for people: a subagents.notify command gets the event JSON on stdin.
    write = f"import sys; open({str(events)!r}, 'a').write(sys.stdin.read().strip() + '\\n')"
    notify = {"command": [sys.executable, "-c", write], "events": ["budget"]}
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(model=model, budget=budget, notify=notify)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="a long enough task")])
            await settled_state(sup, record.key, frozenset({State.IDLE}))
            [note] = budget_notes(sup, record.key)
            assert note["budget"] == {
                "scope": "session",
                "level": "hard",
                "line": note["budget"]["line"],
            }
            assert note["budget"]["line"].startswith("session budget hard limit reached: ")
            await Faults.until(lambda: events.exists() and events.read_text().endswith("\n"))
            [event] = [json.loads(line) for line in events.read_text().splitlines() if line]
            assert (event["kind"], event["key"]) == ("budget", record.key)
            assert event["context"] == note["budget"]["line"]
            for attempt in (
                sup.spawn([SpawnRequest(task="more")]),
                sup.prompt(record.key, "more"),
                sup.ask(record.key, "how?"),
            ):
                with pytest.raises(PolicyError) as info:
                    await attempt
                message = str(info.value)
                assert "session budget spent (" in message
                assert "\n" not in message
            assert sup.spend.report()["session"]["reached"] == ["hard", "soft"]
            assert len(sup.registry.records) == 1
            await sup.stop([record.key])


async def test_a_spawn_may_lower_its_budget_but_never_raise_it(faults) -> None:
    model = faults.script("one", 'turns:\n  - steps:\n      - reply: "ok"\n')
    budget = {"child": {"soft_tokens": 800, "hard_tokens": 1000}}
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(model=model, budget=budget)) as sup:
            with pytest.raises(PolicyError) as info:
                await sup.spawn([SpawnRequest(task="t", budget={"hard_tokens": 5000})])
            assert str(info.value) == (
                "spawn scout: budget hard_tokens 5000 is above the configured 1000 "
                "(a spawn may lower a budget, never raise it)"
            )
            assert sup.registry.records == {}
            assert sup.capacity.used == 0
            [record] = await sup.spawn([SpawnRequest(task="t", budget={"hard_tokens": 500})])
            # The lowered hard is under the configured soft: that soft is dropped.
            assert sup.peek([record.key])["agents"][0]["usage"]["budget"] == {"hard_tokens": 500}
            await sup.stop([record.key])


LEAD = """
turns:
  - steps:
      - tool: subagent
        args: {agent: helper, task: "help"}
      - reply: "lead: {{last}}"
"""


async def test_a_nested_spawn_never_gets_more_than_its_parent_holds(faults) -> None:
    faults.agent("lead", tools=["read"], mode="fork", subagent_agents=["helper"])
    faults.agent("helper", tools=["read"], mode="scout", budget={"hard_tokens": 4000})
    helper = faults.script("helper", 'turns:\n  - steps:\n      - reply: "helped"\n')
    budget = {"child": {"hard_tokens": 10_000}}
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(model=helper, budget=budget)) as sup:
            [lead] = await sup.spawn(
                [
                    SpawnRequest(
                        task="delegate",
                        agent="lead",
                        model=faults.script("lead", LEAD),
                        budget={"hard_tokens": 300},
                    )
                ]
            )
            await settled_state(sup, lead.key, frozenset({State.IDLE}))
            assert lead.report == "lead: helped"
            limits = {k: a.limit.hard_tokens for k, a in sup.spend.ledger.accounts.items()}
            await sup.stop([lead.key])
    # The helper's definition says 4000, the configuration 10000: its parent holds 300.
    assert limits == {lead.key: 300, "a2": 300}


@pytest.mark.slow
def test_fleet_usage_json_and_spawn_budget_through_the_cli(faults) -> None:
    (faults.home / "config.yaml").write_text(
        "subagents:\n"
        "  budget:\n"
        "    child: {hard_tokens: 10000}\n"
        "    session: {soft_usd: 1, hard_usd: 2, hard_spawns: 1}\n"
        "    tree: {hard_tokens: 100000, hard_turns: 3}\n"
        "  prices:\n"
        "    scripted: {input: 1, output: 2}\n"
    )
    model = faults.script("one", 'turns:\n  - steps:\n      - reply: "all done here"\n')
    raised = faults.cli("spawn", "--model", model, "--budget", "20000", "t")
    assert raised.returncode == 4, raised.stderr
    [line] = raised.stderr.strip().splitlines()
    assert "budget hard_tokens 20000 is above the configured 10000" in line
    spawned = faults.cli("spawn", "--json", "--wait", "--model", model, "--budget", "500", "t")
    assert spawned.returncode == 0, spawned.stderr
    done = faults.cli("usage", "--json")
    assert done.returncode == 0, done.stderr
    usage = json.loads(done.stdout)
    assert set(usage) == {"session", "trees", "agents", "definitions"}
    [child] = usage["agents"]
    assert set(child) >= {"key", "agent", "tokens", "cost_usd", "budget", "reached", "turns"}
    assert child["budget"] == {"hard_tokens": 500}
    assert child["tokens"] > 0
    assert usage["session"]["budget"] == {"soft_usd": 1.0, "hard_usd": 2.0, "hard_spawns": 1}
    assert (usage["session"]["spawns"], usage["session"]["left"]["hard_spawns"]) == (1, 0)
    [tree] = usage["trees"]
    assert (tree["key"], tree["members"], tree["turns"]) == (child["key"], [child["key"]], 1)
    assert tree["left"] == {"hard_tokens": 100000 - child["tokens"], "hard_turns": 2}
    # The session's spawn cap binds: one line, exit 4 (refused), nothing spawned.
    capped = faults.cli("spawn", "--model", model, "t")
    assert capped.returncode == 4, capped.stderr
    assert capped.stderr.strip().splitlines() == [
        "fleet spawn: session cap reached (1 of 1 spawns): no new children"
    ]
    assert usage["session"]["tokens"] == child["tokens"]
    assert usage["definitions"]["scout"]["children"] == 1
    human = faults.cli("usage")
    assert human.returncode == 0
    assert human.stdout.splitlines()[-1].startswith(f"session: {child['tokens']} tokens")
    assert human.stdout.splitlines()[-1].endswith("· left 0 spawns")
    assert f"tree {child['key']} (1 children): " in human.stdout
    peek = json.loads(faults.cli("peek", "--json", child["key"]).stdout)
    assert peek["agents"][0]["usage"]["budget"] == {"hard_tokens": 500}
    bad = faults.cli("usage", "--json", "nobody")
    assert bad.returncode != 0


async def test_a_bad_budget_configuration_refuses_to_start_in_one_line(faults) -> None:
    bad = {"child": {"soft_tokens": 9, "hard_tokens": 5}}
    with pytest.raises(UsageError) as info:
        async with open_supervisor(faults.config(budget=bad)):
            pass
    assert str(info.value) == "subagents.budget.child: soft_tokens 9 must be below hard_tokens 5"
    with pytest.raises(UsageError, match=r"^subagents.budget: unknown key 'childs'"):
        async with open_supervisor(faults.config(budget={"childs": {}})):
            pass


async def test_a_nested_child_past_its_capped_budget_reports_incomplete_to_its_caller(
    faults,
) -> None:
    faults.agent("lead", tools=["read"], mode="fork", subagent_agents=["helper"])
    faults.agent("helper", tools=["read"], mode="scout", budget={"hard_tokens": 15})
    helper = faults.script(
        "helper",
        """
        turns:
          - steps:
              - tool: read
                args: {path: README.md}
              - tool: read
                args: {path: README.md}
              - wait: 10
              - reply: "never"
        """,
    )
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(model=helper)) as sup:
            # Nothing is configured: the helper's definition sets its budget.
            request = SpawnRequest(task="delegate", agent="lead", model=faults.script("lead", LEAD))
            [lead] = await sup.spawn([request])
            await settled_state(sup, lead.key, frozenset({State.IDLE}))
            helper_record = sup.registry.find("a2")
            await sup.stop([lead.key])
    assert helper_record.incomplete == "budget spent: 20 of 15 tokens"
    assert "a2 incomplete: budget spent: 20 of 15 tokens" in lead.report


WATCHES = """
turns:
  - steps:
      - tool: shell
        args: {action: start, command: "sleep 0.5; echo BUILD OK; exec sleep 60", watch: "OK$"}
      - reply: "first"
  - steps:
      - reply: "woken"
"""


@pytest.mark.slow
async def test_a_spent_session_starts_no_wake_turn(faults) -> None:
    faults.agent("runner", tools=["read", "bash"], mode="worktree")
    model = faults.script("watches", WATCHES)
    settings = {"sandbox": "off", "allow_unsandboxed": True}
    for budget, turns in ((None, 2), ({"session": {"hard_tokens": 5}}, 1)):
        with trio.fail_after(CEILING):
            async with open_supervisor(
                faults.config(model=model, budget=budget, **settings)
            ) as sup:
                [record] = await sup.spawn([SpawnRequest(task="build", agent="runner")])
                await settled_state(sup, record.key, frozenset({State.IDLE}))
                # The watch fires 0.5 s in: without a budget it wakes the child for a turn.
                with trio.move_on_after(3):
                    await Faults.until(
                        lambda: record.turn == 2 and record.state is State.IDLE  # noqa: B023
                    )
                assert (record.turn, record.state) == (turns, State.IDLE)
                await sup.stop([record.key])


async def test_a_model_reporting_a_negative_cost_unspends_nothing(faults) -> None:
    """A hostile model answers with ``usage.cost`` -997: the cost is refused, the tokens are
    priced, and the hard USD limit still stops the child (#36: it drove the spend to -997)."""
    async with ModelServer() as srv:
        hostile = {"usage": {"input_tokens": 100, "output_tokens": 20, "cost": -997.0}}
        srv.script("c1", [{**READ, **hostile}, {"delay": 5, "text": "never reached"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        prices = {"fake-model": {"input": 100, "output": 100}}  # 120 tokens: $0.012
        config = faults.config(model=model, budget={"child": {"hard_usd": 0.01}}, prices=prices)
        with trio.fail_after(CEILING):
            async with open_supervisor(config) as sup:
                [record] = await sup.spawn([SpawnRequest(task="read")])
                await settled_state(sup, record.key, TERMINAL)
                [handoff] = await sup.stop([record.key])
                report = sup.spend.report()
    assert handoff["incomplete"] == "budget spent: $0.0120 of $0.01"
    [child] = report["agents"]
    assert child["cost_usd"] == pytest.approx(0.012)
    assert report["session"]["cost_usd"] == pytest.approx(0.012)


async def test_a_child_reporting_negative_usage_is_clamped_and_flagged(faults) -> None:
    """A rogue child sends usage with negative counts and negative costs: nothing
    in the ledger goes below what was spent or below zero, and each lie is flagged."""
    prices = {"fake-model": {"input": 1, "output": 1}}
    config = faults.rogue_config(reject_log=True, prices=prices)
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", name="rogue-unspend")])
            await Faults.until(lambda: len(sup.spend.report()["agents"][0].get("flags", [])) >= 4)
            report = sup.spend.report()
            peeked = sup.peek([record.key])["agents"][0]
            await sup.stop([record.key])
        log = (sup.paths.logs / f"{record.key}.log").read_text()
        rejects = (sup.paths.logs / "rejected.jsonl").read_text()
    [child] = report["agents"]
    assert (child["tokens"], child["input_tokens"], child["output_tokens"]) == (120, 100, 20)
    assert child["cost_usd"] == pytest.approx(120 / 1e6)
    assert report["session"]["cost_usd"] == pytest.approx(120 / 1e6)
    assert report["session"]["tokens"] == 120
    assert child["flags"] == [
        "tokens -5000 is not a whole number >= 0: counted as 0",
        "input_tokens -1 is not a whole number >= 0: counted as 0",
        "cost_usd -997.0 is negative: refused",
        "cost_usd -1e-09 is negative: refused",
    ]
    assert peeked["usage"]["tokens"] == 120
    assert peeked["usage"]["cost_usd"] == pytest.approx(120 / 1e6)
    assert "usage report flagged: cost_usd -997.0 is negative: refused" in log
    assert '"kind": "usage"' in rejects


class _Recorder(NoJournal):
    """A journal that keeps, in order, each settle and each change of a child's models."""

    def __init__(self) -> None:
        self.facts: list[tuple[str, Any]] = []

    def changed(self, record: ChildRecord) -> None:
        if not self.facts or self.facts[-1] != ("models", list(record.models)):
            self.facts.append(("models", list(record.models)))

    def settled(self, record: ChildRecord, *, report: str, error: str) -> None:
        self.facts.append(("settled", report))


async def test_the_move_to_a_fallback_is_journaled_before_its_turn_settles(faults) -> None:
    """#37 item 5: journaled after the settle note, a supervisor killed right then revived the
    child on the rate-limited primary."""
    async with ModelServer() as srv:
        base = srv.base_url("c1") + "/v1"
        (faults.home / "roles.yaml").write_text(
            f"roles:\n  worker:\n    model: openai/primary@{base}\n"
            f"    fallbacks: [openai/spare@{base}]\n"
        )
        srv.script("c1", [*[{"status": 429, "body": "rate limited"}] * 3, {"text": "spare"}])
        with trio.fail_after(CEILING):
            async with open_supervisor(faults.config()) as sup:
                sup.journal = recorder = _Recorder()
                [record] = await sup.spawn([SpawnRequest(task="go", role="worker")])
                await settled_state(sup, record.key, frozenset({State.IDLE}))
                await sup.stop([record.key])
        messages = srv.requests("c1")[3].body["messages"]
    both = [f"openai/primary@{base}", f"openai/spare@{base}"]
    moved = recorder.facts.index(("models", both))
    assert moved < recorder.facts.index(("settled", "spare")), recorder.facts
    assert [m["content"] for m in messages if m["role"] == "user"] == ["go"]  # sent once


TWICE = """
turns:
  - steps:
      - tool: subagent
        args: {agent: helper, task: "help"}
      - tool: subagent
        args: {agent: helper, task: "help again"}
      - reply: "lead: {{last}}"
  - steps:
      - reply: "second turn"
"""


async def test_a_trees_spawn_and_turn_caps_refuse_a_nested_spawn_and_a_prompt(faults) -> None:
    """#37 item 3: a tree may spawn one nested child and take three turns. The lead's second
    ``subagent`` call is refused (its tool result says why, the helper never starts); the
    lead's second turn is the tree's third (lead, helper, prompt); a fourth is refused."""
    faults.agent("lead", tools=["read"], mode="fork", subagent_agents=["helper"])
    faults.agent("helper", tools=["read"], mode="scout")
    helper = faults.script("helper", 'turns:\n  - steps:\n      - reply: "helped"\n')
    budget = {"tree": {"hard_spawns": 1, "hard_turns": 3}}
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(model=helper, budget=budget)) as sup:
            request = SpawnRequest(task="delegate", agent="lead", model=faults.script("l", TWICE))
            [lead] = await sup.spawn([request])
            await settled_state(sup, lead.key, frozenset({State.IDLE}))
            first = lead.report
            await sup.prompt(lead.key, "again")
            await settled_state(sup, lead.key, frozenset({State.IDLE}))
            with pytest.raises(PolicyError) as info:
                await sup.prompt(lead.key, "and again")
            report = sup.spend.report()
            await sup.stop([lead.key])
    assert first == (
        f"lead: subagent refused: spawn: tree {lead.key} cap reached (1 of 1 spawns): "
        "no new children"
    )
    assert lead.report == "second turn"
    assert str(info.value) == (
        f"prompt {lead.key}: tree {lead.key} turn cap reached (3 of 3 turns): no new turns"
    )
    [tree] = report["trees"]
    assert (len(tree["members"]), tree["spawns"], tree["turns"]) == (2, 1, 3)
    assert tree["left"] == {"hard_spawns": 0, "hard_turns": 0}
