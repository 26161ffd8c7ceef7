"""Which tools exist, and building a toolset from a loadout's names."""

import json

import pytest

from child.tools import ALL_TOOLS, MUTATING_TOOLS, ToolContext, build_tools


def test_all_tools_are_the_builtin_eight_and_mutating_ones_are_a_subset():
    assert {"read", "grep", "find", "ls", "edit", "write", "bash", "todo"} == ALL_TOOLS
    assert {"edit", "write", "bash"} == MUTATING_TOOLS
    assert MUTATING_TOOLS < ALL_TOOLS


def test_build_tools_creates_only_the_named_tools(tmp_path):
    tools = build_tools(["read", "grep", "todo"], ToolContext(workspace=tmp_path))
    assert set(tools) == {"read", "grep", "todo"}
    assert all(tool.name == name for name, tool in tools.items())


def test_every_tool_offers_a_json_object_schema_and_a_description(tmp_path):
    for name, tool in build_tools(ALL_TOOLS, ToolContext(workspace=tmp_path)).items():
        schema = json.loads(json.dumps(tool.parameters))
        assert schema["type"] == "object", name
        assert set(schema.get("required", [])) <= set(schema["properties"]), name
        assert len(tool.description) > 20, name


def test_each_build_gets_its_own_checklist(tmp_path):
    ctx = ToolContext(workspace=tmp_path)
    first, second = build_tools(["todo"], ctx)["todo"], build_tools(["todo"], ctx)["todo"]
    assert first.checklist is not second.checklist  # type: ignore[attr-defined]


def test_unknown_tool_is_a_one_line_value_error(tmp_path):
    with pytest.raises(ValueError, match=r"unknown tool 'shout'; use one of bash, edit") as info:
        build_tools(["read", "shout"], ToolContext(workspace=tmp_path))
    assert "\n" not in str(info.value)


def test_a_missing_workspace_fails_at_build_time(tmp_path):
    with pytest.raises(ValueError, match="is not a directory"):
        build_tools(["read"], ToolContext(workspace=tmp_path / "gone"))
