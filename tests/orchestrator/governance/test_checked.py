"""Checked results, pure: extraction of the last fenced json block, validation, the one
corrective steer, and schemas refused at spawn with one line."""

import json

import pytest

from orchestrator._errors import UsageError
from orchestrator.governance._checked import (
    ERROR_CAP,
    RESULT_CAP,
    RESULT_DEPTH,
    SCHEMA_CAP,
    CheckedResult,
    check_schema,
    extract,
    instruction,
    load_schema,
    validate,
)

FENCE = "```"
SCHEMA = {
    "type": "object",
    "required": ["files"],
    "properties": {
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["path"],
                "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
            },
        }
    },
}


def block(body: str, info: str = "json", fence: str = FENCE) -> str:
    return f"{fence}{info}\n{body}\n{fence}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no block at all", None),
        ("a python block\n" + block("x = 1", "python"), None),
        (block('{"a": 1}'), '{"a": 1}'),
        # Two blocks: the last one counts.
        (block('{"a": 1}') + "\nthen\n" + block('{"a": 2}'), '{"a": 2}'),
        # Tildes and an info string with more words; the tag is case-insensitive.
        (block("[1]", "JSON result", "~~~"), "[1]"),
        # A ```json shown inside a longer markdown fence is content, not a block.
        (block('{"a": 1}') + "\n" + block(block('{"a": 9}'), "markdown", "````"), '{"a": 1}'),
        # A closing fence must be at least as long as the opening one.
        ("````json\n[1]\n```\n[2]\n````", "[1]\n```\n[2]"),
        # An unclosed block runs to the end of the report.
        ("report\n```json\n[3]", "[3]"),
        ("```json\n\n```", ""),
        # Inline code is no fence.
        ("use ```json``` blocks", None),
    ],
)
def test_extract_finds_the_last_json_block(text, expected):
    assert extract(text) == expected


@pytest.mark.parametrize(
    ("report", "ok", "error"),
    [
        (block('{"files": [{"path": "a.py", "lines": 3}]}'), True, ""),
        ("done, no result", False, "the report has no fenced ```json block"),
        (block('{"files": [}'), False, "the last ```json block is not valid JSON: Expecting"),
        (block('{"files": NaN}'), False, "the last ```json block is not valid JSON: NaN is"),
        (block("{}"), False, "result invalid at /: 'files' is a required property"),
        (
            block('{"files": [{"path": "a"}, {"path": 7}]}'),
            False,
            "result invalid at /files/1/path: 7 is not of type 'string'",
        ),
        # Only the last block is judged: an earlier valid one does not save a bad last one.
        (
            block('{"files": []}') + "\n" + block('{"files": 1}'),
            False,
            "result invalid at /files: 1 is not of type 'array'",
        ),
    ],
)
def test_validate_names_the_error_and_the_path(report, ok, error):
    checked = validate(report, SCHEMA)
    assert checked.ok is ok
    assert checked.error.startswith(error), checked.error
    if ok:
        assert checked.value == {"files": [{"path": "a.py", "lines": 3}]}


def test_a_huge_result_block_is_refused_without_parsing():
    checked = validate(block("[" + "1," * RESULT_CAP + "1]"), {"type": "array"})
    assert not checked.ok
    assert "result cap" in checked.error


@pytest.mark.parametrize(
    ("depth", "error"),
    [
        (RESULT_DEPTH + 1, f"the result is nested deeper than {RESULT_DEPTH} levels"),
        (5000, "the last ```json block is not valid JSON: maximum recursion depth"),
    ],
)
def test_a_deeply_nested_result_is_refused_without_running_out_of_stack(depth, error):
    checked = validate(block("[" * depth + "]" * depth), {"items": {"$ref": "#"}})
    assert not checked.ok
    assert checked.error.startswith(error), checked.error


def test_a_result_at_the_depth_limit_validates():
    depth = RESULT_DEPTH
    checked = validate(block("[" * depth + "]" * depth), {"items": {"$ref": "#"}})
    assert checked.ok, checked.error


def test_a_ref_to_elsewhere_is_never_fetched_and_fails_at_once():
    verdict = CheckedResult({"$ref": "https://example.invalid/s.json"}).judge(block("{}"))
    assert not verdict.valid
    assert not verdict.steer  # no correction can help a schema that cannot validate
    assert verdict.error.startswith("the schema cannot be used")


def test_one_corrective_steer_then_failure():
    checked = CheckedResult(SCHEMA)
    first = checked.judge(block('{"files": "x"}'))
    assert (first.valid, first.error) == (False, "")
    assert "result invalid at /files: 'x' is not of type 'array'" in first.steer
    assert "\n" not in first.steer
    second = checked.judge("still nothing")
    assert (second.valid, second.steer) == (False, "")
    assert second.error == "the report has no fenced ```json block"


def test_a_valid_result_after_the_steer_is_kept_and_resets_the_correction():
    checked = CheckedResult(SCHEMA)
    assert checked.judge("no block").steer
    good = checked.judge(block('{"files": []}'))
    assert (good.valid, good.value) == (True, {"files": []})
    # The parent's next prompt has its own correction.
    assert checked.judge("no block").steer


def test_error_lines_are_capped_to_one_line():
    long = "x" * 5000
    checked = CheckedResult({"type": "object"})
    verdict = checked.judge(block(json.dumps(long)))
    assert long[:100] in verdict.steer  # the error is quoted, clipped
    assert len(verdict.steer) <= 2 * ERROR_CAP
    failed = checked.judge(block(json.dumps([long, "\n"])))
    assert len(failed.error) <= ERROR_CAP
    assert "\n" not in failed.error


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{not json", "s.json: not JSON: "),
        ("[1, 2]", "s.json: a JSON Schema must be a JSON object, not an array"),
        ('{"type": "nope"}', "s.json: not a valid JSON Schema at /type: 'nope' is not valid"),
        (
            '{"properties": {"a": {"minLength": -1}}}',
            "s.json: not a valid JSON Schema at /properties/a/minLength: -1",
        ),
        ('{"minimum": Infinity}', "s.json: not JSON: Infinity is not JSON"),
        ('{"$schema": 5}', "s.json: $schema must be a string naming a JSON Schema dialect"),
        ('{"$schema": "https://example.invalid/s"}', "s.json: unknown $schema dialect 'https:"),
        ('{"not": ' * 3000 + "{}" + "}" * 3000, "s.json: not JSON: maximum recursion depth"),
        ('{"not": ' * 600 + "{}" + "}" * 600, "s.json: nested too deeply to check"),
        (" " * (SCHEMA_CAP + 1), f"s.json: {SCHEMA_CAP + 1} bytes, over the 64 KiB schema cap"),
    ],
)
def test_a_bad_schema_is_refused_with_one_line(text, error):
    with pytest.raises(UsageError) as caught:
        load_schema(text, source="s.json")
    message = str(caught.value)
    assert message.startswith(error), message
    assert "\n" not in message
    assert len(message) < 400


def test_a_good_schema_loads_and_its_dialect_is_honoured():
    assert load_schema(json.dumps(SCHEMA).encode(), source="s.json") == SCHEMA
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "string"}]}
    assert check_schema(draft7) == draft7  # tuple-form items: valid in draft 7 only
    with pytest.raises(UsageError, match="not a valid JSON Schema"):
        check_schema({"items": [{"type": "string"}]})


def test_the_instruction_is_one_line_that_carries_the_schema():
    line = instruction(SCHEMA)
    assert "\n" not in line
    assert "```json" in line
    assert json.dumps(SCHEMA, separators=(",", ":"), sort_keys=True) in line
