"""The work list: rows from JSONL and CSV, the template filled per row, dedupe and max-items."""

import json

import pytest

from orchestrator._errors import UsageError
from orchestrator.batch import fill, parse_rows, placeholders, select_rows
from orchestrator.batch._outfile import reconcile_out
from orchestrator.durability import MapBook


def test_jsonl_and_csv_give_the_same_rows():
    jsonl = '{"path": "a.py", "n": "1"}\n\n{"path": "b.py", "n": "2"}\n'
    csv = "path,n\na.py,1\nb.py,2\n"
    assert (
        parse_rows(jsonl)
        == parse_rows(csv)
        == [
            {"path": "a.py", "n": "1"},
            {"path": "b.py", "n": "2"},
        ]
    )


@pytest.mark.parametrize(
    ("text", "fmt", "message"),
    [
        ('{"a": 1}\nnot json\n', None, "line 2 is not JSON"),
        ('{"a": 1}\n[1, 2]\n', None, "line 2 is not a JSON object"),
        ("a,b\n1,2,3\n", "csv", "line 2 has more fields than the header"),
        ("", "csv", "is empty"),
    ],
)
def test_a_bad_work_list_is_one_line_naming_the_line(text, fmt, message):
    with pytest.raises(UsageError, match=message):
        parse_rows(text, fmt=fmt)


def test_a_missing_column_names_the_column_and_the_row():
    rows = [{"path": "a.py"}, {"file": "b.py"}]
    with pytest.raises(UsageError) as caught:
        select_rows(rows, "review {path}")
    assert str(caught.value).startswith("map: row 2 has no column 'path'")
    assert "\n" not in str(caught.value)


def test_the_template_fills_strings_as_is_and_other_values_as_json():
    task = fill(
        "look at {path} for {issue} ({tags}) {{literal}}",
        {"path": "a.py", "issue": 7, "tags": ["x"]},
        1,
    )
    assert task == 'look at a.py for 7 (["x"]) {literal}'


@pytest.mark.parametrize("template", ["{a.b}", "{a[0]}", "{a!r}", "{a:>3}", "{", "{}"])
def test_a_placeholder_that_is_not_a_plain_column_is_refused(template):
    with pytest.raises(UsageError, match="template"):
        placeholders(template)


def test_dedupe_keeps_the_first_row_of_each_key_and_counts_the_repeats():
    rows = [{"f": f"file{i % 3}", "i": i} for i in range(10)]
    kept, dropped = select_rows(rows, "{f} {i}", dedupe_key="f")
    assert [(r.id, r.key, r.task) for r in kept] == [
        (1, "file0", "file0 0"),
        (2, "file1", "file1 1"),
        (3, "file2", "file2 2"),
    ]
    assert dropped == 7


def test_max_items_counts_rows_kept_after_dedupe():
    rows = [{"f": "same"}, {"f": "same"}, {"f": "b"}, {"f": "c"}]
    kept, dropped = select_rows(rows, "{f}", dedupe_key="f", max_items=2)
    assert [r.key for r in kept] == ["same", "b"]
    assert dropped == 1
    with pytest.raises(UsageError, match="max-items"):
        select_rows(rows, "{f}", max_items=0)


def test_without_a_dedupe_key_a_row_is_keyed_by_its_position():
    kept, dropped = select_rows([{"f": "x"}, {"f": "x"}], "{f}")
    assert [(r.id, r.key) for r in kept] == [(1, "1"), (2, "2")]
    assert dropped == 0


def test_a_row_without_the_dedupe_column_is_refused():
    with pytest.raises(UsageError, match="row 2 has no column 'f' \\(--dedupe-key\\)"):
        select_rows([{"f": 1}, {"g": 2}], "x", dedupe_key="f")


def test_a_resume_appends_to_the_out_file_only_the_outcomes_it_lacks(tmp_path):
    book = MapBook(tmp_path / "maps")
    book.begin(
        "m1", {"rows": [{"id": 1, "key": "a"}, {"id": 2, "key": "b"}, {"id": 3, "key": "c"}]}
    )
    book.finished("m1", 1, {"status": "done", "result": "r1"})
    book.finished("m1", 2, {"status": "done", "result": "r2"})
    out = tmp_path / "out.jsonl"
    # Row 1 reached the out file; the crash came after row 2's ledger record, mid-line.
    out.write_text(json.dumps({"map": "m1", "row": 1, "key": "a"}) + '\n{"map": "m1", "ro')
    reconcile_out(out, book.read("m1"))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(e["row"], e["key"]) for e in lines] == [(1, "a"), (2, "b")]
    assert lines[1]["result"] == "r2"
