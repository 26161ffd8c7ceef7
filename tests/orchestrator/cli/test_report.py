"""``fleet report`` pages a child's full report and transcript until it is discarded, and
``fleet wait --timeout`` exits 3 with each working child's progress row."""

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import running_fleet

pytestmark = pytest.mark.slow

LONG = """
turns:
  - steps:
      - tool: read
        args: {path: README.md}
      - reply: "## Summary\\n{{last}}\\nEND-OF-REPORT"
"""

HANG = """
turns:
  - steps:
      - tool: todo
        args:
          op: write
          items:
            - {id: one, text: "First"}
            - {id: two, text: "Second"}
      - tool: todo
        args: {op: start, id: one}
      - hang: true
"""


def test_a_long_report_is_clipped_in_wait_and_whole_in_report(tmp_path: Path) -> None:
    with running_fleet(tmp_path, prefix="flr-") as fleet:
        (fleet.repo / "README.md").write_text("line of the readme\n" * 2000)
        fleet.json("spawn", "--model", fleet.script("long", LONG), "read it")
        [note] = fleet.json("wait", "a1", "--timeout", "60")["settled"]
        assert note["clipped"] is True
        assert len(note["report"]) == 1200
        assert note["observed"]["clipped"] is True
        assert note["observed"]["report_chars"] > 30_000
        first = fleet.json("report", "a1")
        assert first["text"].startswith("## Summary\n")
        assert first["offset"] == 0
        assert first["next_offset"] == len(first["text"]) == 16_000
        pages, offset = [first["text"]], first["next_offset"]
        while offset is not None:
            page = fleet.json("report", "a1", "--offset", str(offset))
            pages.append(page["text"])
            offset = page["next_offset"]
        assert "".join(pages).endswith("END-OF-REPORT")
        assert len("".join(pages)) == first["total"]
        human = fleet.run("report", "a1")
        assert human.stdout.rstrip().endswith("(more: fleet report a1 --offset 16000)")

        fleet.json("stop", "a1")
        kept = fleet.json("report", "a1")
        assert kept["total"] == first["total"]
        transcript = fleet.json("report", "a1", "--transcript")
        assert "read it" in transcript["text"]  # the task, as the builtin agent kept it
        fleet.json("discard", "a1")
        gone = fleet.run("report", "a1", "--json")
        assert gone.returncode == 2, (gone.stdout, gone.stderr)
        assert json.loads(gone.stdout)["error"]["kind"] == "not-found"


def test_wait_timing_out_exits_3_with_progress_rows(tmp_path: Path) -> None:
    with running_fleet(tmp_path, prefix="flt-") as fleet:
        fleet.json("spawn", "--model", fleet.script("hang", HANG), "--name", "slow", "work")
        for _ in range(60):
            result = fleet.run("wait", "--timeout", "1", "--json")
            assert result.returncode == 3, (result.stdout, result.stderr)
            data = json.loads(result.stdout)
            if data["working"] and data["working"][0]["checklist"] == "0/2":
                break
        assert data["error"]["kind"] == "timeout"
        assert data["settled"] == []
        [row] = data["working"]
        assert (row["key"], row["name"], row["current"]) == ("a1", "slow", "First")
        assert row["age_s"] >= 1
        assert result.stderr.startswith("fleet wait: nothing settled within 1 s")
        human = fleet.run("wait", "--timeout", "0")
        assert human.returncode == 3
        assert human.stdout.startswith("a1 slow working 0/2")
        assert "(for " in human.stdout
        fleet.json("stop", "a1")


WORKER = """
turns:
  - steps:
      - tool: write
        args: {path: "src/app.py", content: "def main():\\n    return 43\\n\\n\\nmain()\\n"}
      - tool: write
        args: {path: "NOTES.md", content: "one\\ntwo\\n"}
      - reply: "## Summary\\nchanged app.py"
"""


def test_a_workers_note_says_which_files_it_changed_with_line_counts(tmp_path: Path) -> None:
    with running_fleet(tmp_path, prefix="flo-") as fleet:
        fleet.json("spawn", "--agent", "worker", "--model", fleet.script("w", WORKER), "fix")
        [note] = fleet.json("wait", "a1", "--timeout", "90", timeout=120)["settled"]
        observed = note["observed"]
        files = {f["path"]: f for f in observed["files"]}
        assert files["src/app.py"] == {
            "path": "src/app.py",
            "status": "modified",
            "added": 4,
            "removed": 1,
        }
        assert files["NOTES.md"] == {
            "path": "NOTES.md",
            "status": "added",
            "added": 2,
            "removed": 0,
        }
        assert [c["tool"] for c in observed["commands"]] == ["write", "write"]
        assert all(c["ok"] is True for c in observed["commands"])
        assert observed["duration_s"] >= 0
        fleet.json("stop", "a1")
