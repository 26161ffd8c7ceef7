"""An agent definition's ``schema:`` field: inline, or a JSON file beside the definition;
a bad one fails the load with one line naming the field. The spawn's own schema wins."""

import json
from pathlib import Path

import pytest

from orchestrator._config import Config
from orchestrator._errors import UsageError
from orchestrator._records import ChildRecord, SpawnRequest
from orchestrator._schemafile import SCHEMA_CAP, read_schema_file
from orchestrator.core._notes import Notes
from orchestrator.core._plan import plan_spawn
from orchestrator.definitions import AgentDefinitionError, parse_agent

SCHEMA = {"type": "object", "required": ["ok"]}


def parse(tmp_path: Path, front: str):
    path = tmp_path / "checker.md"
    return parse_agent(f"---\n{front}\n---\nCheck it.\n", path=path, source="user")


def test_an_inline_schema_is_kept(tmp_path):
    definition = parse(tmp_path, f"description: d\nschema: {json.dumps(SCHEMA)}")
    assert definition.schema == SCHEMA


def test_a_schema_file_is_read_relative_to_the_definition(tmp_path):
    (tmp_path / "checker.schema.json").write_text(json.dumps(SCHEMA))
    definition = parse(tmp_path, "description: d\nschema: checker.schema.json")
    assert definition.schema == SCHEMA


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        ("missing.json", "No such file or directory"),
        ("{type: 5}", "not a valid JSON Schema at /type"),
        ("[1, 2]", "a JSON Schema must be a JSON object, not an array"),
    ],
)
def test_a_bad_schema_fails_the_load_naming_the_field(tmp_path, value, cause):
    with pytest.raises(AgentDefinitionError) as caught:
        parse(tmp_path, f"description: d\nschema: {value}")
    assert caught.value.field == "schema"
    assert cause in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_schema_file_over_the_cap_is_refused_unread(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(" " * (SCHEMA_CAP + 10) + "{}")
    with pytest.raises(UsageError, match=r"over the 64 KiB schema cap$"):
        read_schema_file(path)


def test_the_spawn_schema_wins_over_the_definition(tmp_path):
    definition = parse(tmp_path, f"description: d\nschema: {json.dumps(SCHEMA)}")
    config = Config(home=tmp_path / "home", session="t", workspace=tmp_path, model="openai:m")
    own = {"type": "array"}

    def plan(schema):
        request = SpawnRequest(task="t", agent="checker", schema=schema)
        return plan_spawn(
            request, definitions={"checker": definition}, config=config, workflow_mode="build"
        )

    assert plan(None).schema == SCHEMA
    assert plan(own).schema == own
    with pytest.raises(UsageError, match=r"^spawn: schema: not a valid JSON Schema at /type"):
        plan({"type": 5})


def test_only_a_checked_childs_note_and_handoff_carry_result():
    def record(schema):
        return ChildRecord(
            key="a1",
            name="n",
            agent="scout",
            mode="scout",
            task="t",
            workspace="/w",
            backend="builtin",
            schema=schema,
        )

    plain, checked = record(None), record(SCHEMA)
    checked.result = {"ok": True}
    assert "result" not in plain.handoff()
    assert checked.handoff()["result"] == {"ok": True}
    notes = Notes()
    notes.push(plain)
    notes.push(checked)
    assert ["result" in note for note in notes.take()] == [False, True]
