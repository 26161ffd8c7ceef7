"""fleet mcp's tool table: every rule in the schema, arguments checked before anything runs."""

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from orchestrator._errors import UsageError
from orchestrator.parents._tools import BUDGET_KEYS, BY_NAME, INSTRUCTIONS, MAX_DEPTH, TOOLS
from orchestrator.spend._limits import LIMIT_KEYS

ROOT = Path(__file__).resolve().parents[3]
#: DESIGN.md §13: fleet's tool schemas plus the server instructions, per parent request.
TOKEN_BUDGET = 1200
COMBINATORS = {"anyOf", "oneOf", "allOf", "not", "if", "then", "else"}


def tokens() -> float:
    listed = [tool.listing() for tool in TOOLS]
    return (len(json.dumps(listed, separators=(",", ":"))) + len(INSTRUCTIONS)) / 4


def test_the_tools_and_instructions_fit_the_token_budget():
    assert tokens() <= TOKEN_BUDGET


@pytest.mark.parametrize("tool", TOOLS, ids=lambda t: t.name)
def test_no_schema_leaves_a_rule_to_a_combinator_at_its_root(tool):
    # Claude Code drops a tool whose input schema has anyOf/oneOf/allOf at its root.
    schema = tool.input_schema
    assert schema["type"] == "object"
    assert not COMBINATORS & set(schema)
    assert schema["additionalProperties"] is False
    jsonschema.Draft202012Validator.check_schema(schema)
    for prop in schema["properties"].values():  # every leaf says its type (Codex infers none)
        assert "type" in prop, (tool.name, prop)


def test_one_child_and_a_batch_are_not_two_optional_siblings():
    spawn = BY_NAME["spawn"].input_schema
    assert spawn["required"] == ["task"]
    assert "tasks" not in spawn["properties"]
    with pytest.raises(UsageError) as refused:
        BY_NAME["spawn"].request({"task": "x", "tasks": [{"task": "y"}]})
    assert str(refused.value) == (
        "spawn: unknown argument tasks (allowed: task, agent, name, backend, model, budget, schema)"
    )


def test_a_misspelt_argument_is_refused_naming_it_and_the_allowed_ones():
    with pytest.raises(UsageError) as refused:
        BY_NAME["spawn"].request({"task": "x", "budjet": {"hard_tokens": 5}})
    message = str(refused.value)
    assert message.startswith("spawn: unknown argument budjet (allowed: task, ")
    assert "budget" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("name", "args", "says"),
    [
        ("spawn", {}, "'task' is a required property"),
        ("spawn", {"task": ""}, "task: '' should be non-empty"),
        ("control", {"action": "root", "agent": "a1", "text": "x"}, "action: 'root' is not one"),
        ("spawn", {"task": "x", "budget": {"hard_tokens": -1}}, "budget.hard_tokens: -1 is less"),
        ("wait", {"timeout": 500}, "timeout: 500 is greater than the maximum of 100"),
        ("wait", {"agents": "a1"}, "agents: 'a1' is not of type 'array'"),
        ("control", {"action": "steer", "agent": "a1"}, "'text' is a required property"),
        ("stop", {"agents": []}, "agents: [] should be non-empty"),
        ("report", {"agent": "a1", "offset": -2}, "offset: -2 is less than the minimum of 0"),
    ],
)
def test_schema_violations_are_one_line_usage_errors(name, args, says):
    with pytest.raises(UsageError) as refused:
        BY_NAME[name].request(args)
    message = str(refused.value)
    assert message.startswith(f"{name}: ")
    assert says in message
    assert "\n" not in message


def test_arguments_nested_too_deep_or_too_large_are_refused_before_the_schema():
    deep: object = "x"
    for _ in range(MAX_DEPTH + 1):
        deep = {"a": deep}
    with pytest.raises(UsageError, match=r"^spawn: arguments nested deeper than 24 levels$"):
        BY_NAME["spawn"].request({"task": "x", "schema": deep})
    with pytest.raises(UsageError, match=r"^spawn: arguments of \d+ bytes exceed 524288 "):
        BY_NAME["spawn"].request({"task": "x" * (600 * 1024)})


def test_each_tool_becomes_its_control_request():
    assert BY_NAME["spawn"].request({"task": "t", "agent": "worker"}) == (
        "spawn",
        {"requests": [{"agent": "worker", "task": "t"}]},
    )
    assert BY_NAME["spawn"].request({"task": "t"})[1]["requests"][0]["agent"] == "scout"
    assert BY_NAME["wait"].request({}) == (
        "wait",
        {"agents": [], "all": False, "timeout": 50.0, "progress": True},
    )
    assert BY_NAME["stop"].request({"agents": ["*"]}) == ("stop", {"agents": [], "all": True})
    assert BY_NAME["stop"].request({"agents": ["a1"]}) == ("stop", {"agents": ["a1"]})
    assert BY_NAME["stop"].request({"agents": ["a1"], "hold": True}) == (
        "stop",
        {"agents": ["a1"], "hold": True},
    )
    assert BY_NAME["apply"].request({"agent": "a1", "paths": [".envrc"]}) == (
        "apply",
        {"agent": "a1", "paths": [".envrc"]},
    )
    assert BY_NAME["control"].request({"action": "answer", "agent": "q2", "text": "sqlite"}) == (
        "answer",
        {"question": "q2", "text": "sqlite"},
    )
    assert BY_NAME["control"].request({"action": "resume", "agent": "a1", "text": "go"}) == (
        "resume",
        {"agent": "a1", "text": "go"},
    )
    assert BY_NAME["paper"].request({"text": "yes", "reply_to": "d3"}) == (
        "discuss",
        {"action": "answer", "question": "d3", "text": "yes"},
    )
    assert BY_NAME["paper"].request({"text": "who?", "to": "a2"}) == (
        "discuss",
        {"action": "ask", "text": "who?", "to": "a2"},
    )
    assert BY_NAME["info"].request({"topic": "paper", "since": "d2"}) == (
        "discuss",
        {"action": "list", "since": "d2"},
    )
    assert BY_NAME["info"].request({"topic": "mode", "set": "plan"}) == ("mode", {"name": "plan"})
    assert BY_NAME["info"].request({"topic": "brief", "set": "plan"}) == ("brief", {})
    assert BY_NAME["review"].request({"action": "diff", "context": 1}) == (
        "diff",
        {"targets": [], "context": 1},
    )
    assert BY_NAME["report"].request({"agent": "a1"}) == (
        "report",
        {"agent": "a1", "part": "report", "offset": 0},
    )


@pytest.mark.parametrize("tool", TOOLS, ids=lambda t: t.name)
def test_a_caller_that_fills_every_field_is_never_refused_for_filling_them(tool):
    """A parent model that fills every field the schema lists gets through the schema."""
    sample = {
        "string": "a1",
        "boolean": True,
        "number": 5,
        "integer": 1,
        "array": ["a1"],
        "object": {},
    }
    args = {}
    for name, prop in tool.input_schema["properties"].items():
        args[name] = prop["enum"][0] if "enum" in prop else sample[prop["type"]]
    tool.request(args)


def test_the_benchmark_prints_each_parents_figure_as_one_json_line():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "parent_tools.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "parent_tools"
    assert result["ok"] is True
    for parent in ("claude", "codex", "gemini", "opencode"):
        figure = result["parents"][parent]
        assert figure["tools"] == len(TOOLS)
        assert figure["tokens"] <= TOKEN_BUDGET
        assert figure["requests_per_task"] is None  # measured with the real parent CLIs
    assert result["parents"]["pi"]["tools"] >= 1


def test_a_spawn_budget_takes_every_limit_the_supervisor_knows():
    # The parent's schema and the supervisor's limits agree: a cap on spawns or turns (or a
    # soft one) passes the schema and reaches the supervisor, which checks the values.
    assert sorted(BUDGET_KEYS) == sorted(LIMIT_KEYS)
    spawn = next(tool for tool in TOOLS if tool.name == "spawn")
    budget = spawn.listing()["inputSchema"]["properties"]["budget"]
    assert sorted(budget["properties"]) == sorted(LIMIT_KEYS)
