"""A map's ledger: the spec first, each row's one final outcome, read back for a resume."""

import pytest

from orchestrator._errors import NotFound, UsageError
from orchestrator.durability import MapBook


def test_a_resume_sees_exactly_the_finished_rows(tmp_path):
    book = MapBook(tmp_path / "maps")
    map_id = book.new_id()
    assert map_id == "m1"
    book.begin(map_id, {"spec": {"template": "t"}, "rows": [{"id": 1}, {"id": 2}, {"id": 3}]})
    book.finished(map_id, 1, {"status": "done", "result": 1})
    book.finished(map_id, 3, {"status": "failed", "error": "boom"})
    state = MapBook(tmp_path / "maps").read(map_id)
    assert set(state.outcomes) == {1, 3}
    assert state.outcomes[3]["error"] == "boom"
    assert state.spec["rows"][1] == {"id": 2}
    assert book.new_id() == "m2"


def test_a_row_finished_twice_keeps_its_first_outcome(tmp_path):
    book = MapBook(tmp_path)
    book.begin("m1", {"rows": []})
    book.finished("m1", 1, {"status": "done", "result": "first"})
    book.finished("m1", 1, {"status": "done", "result": "second"})
    assert book.read("m1").outcomes[1]["result"] == "first"


def test_a_torn_last_line_is_no_outcome_and_is_cut_before_the_next(tmp_path):
    book = MapBook(tmp_path)
    book.begin("m1", {"rows": []})
    book.finished("m1", 1, {"status": "done"})
    with book.path("m1").open("ab") as handle:
        handle.write(b'{"v": 1, "seq": 3, "kind": "row", "row": 2, "sta')
    assert set(book.read("m1").outcomes) == {1}
    book.finished("m1", 2, {"status": "done"})
    assert set(MapBook(tmp_path).read("m1").outcomes) == {1, 2}


def test_an_existing_map_is_never_begun_again(tmp_path):
    book = MapBook(tmp_path)
    book.begin("m1", {"rows": []})
    with pytest.raises(FileExistsError):
        book.begin("m1", {"rows": []})


@pytest.mark.parametrize("bad", ["../x", "m", "mx", "1"])
def test_a_map_id_is_m_and_a_number(tmp_path, bad):
    with pytest.raises(UsageError, match="not a map id"):
        MapBook(tmp_path).path(bad)


def test_an_unknown_map_is_not_found(tmp_path):
    with pytest.raises(NotFound, match="no map m9"):
        MapBook(tmp_path).read("m9")
