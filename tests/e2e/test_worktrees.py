"""Worktree children end to end: isolation, copy-back at stop, conflicts, review."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WRITER = """
turns:
  - steps:
      - tool: edit
        args: {path: src/app.py, old_text: "return 42", new_text: "return 43"}
      - tool: write
        args: {path: NOTES.md, content: "written by the worker\\n"}
      - reply: "## Summary\\nchanged app.py, added NOTES.md"
"""


def test_a_worker_writes_only_its_worktree_and_stop_copies_back(fleet):
    model = fleet.script("writer", WRITER)
    [agent] = fleet.json("spawn", "--agent", "worker", "--model", model, "bump the answer")[
        "agents"
    ]
    assert agent["mode"] == "worktree"
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["error"] == ""
    # Isolated until stop: the parent is untouched.
    assert (fleet.repo / "src" / "app.py").read_text() == "def main():\n    return 42\n"
    assert not (fleet.repo / "NOTES.md").exists()
    worktree = fleet.home / "sessions" / "t" / "worktrees" / "a1"
    assert (worktree / "NOTES.md").read_text() == "written by the worker\n"
    [handoff] = fleet.json("stop", "a1")["handoffs"]
    assert sorted(handoff["changed"]) == ["NOTES.md", "src/app.py"]
    assert sorted(handoff["applied"]) == ["NOTES.md", "src/app.py"]
    assert handoff["conflicts"] == []
    assert handoff["workspace"] == str(worktree)
    assert (fleet.repo / "src" / "app.py").read_text() == "def main():\n    return 43\n"
    assert (fleet.repo / "NOTES.md").read_text() == "written by the worker\n"
    assert not worktree.exists()

    files = fleet.json("diff", "a1")["files"]
    assert {f["path"] for f in files} == {
        str(fleet.repo / "NOTES.md"),
        str(fleet.repo / "src/app.py"),
    }
    app = next(f for f in files if f["path"].endswith("src/app.py"))
    assert "-    return 42" in app["diff"]
    assert "+    return 43" in app["diff"]

    result = fleet.run("revert", "a1", "--json")
    assert result.returncode == 2
    assert "--yes" in result.stderr
    reverted = fleet.json("revert", "a1", "--yes")["files"]
    assert {f["status"] for f in reverted} == {"reverted"}
    assert (fleet.repo / "src" / "app.py").read_text() == "def main():\n    return 42\n"
    assert not (fleet.repo / "NOTES.md").exists()
    assert fleet.json("diff")["files"] == []


def test_parent_drift_is_a_conflict_nothing_is_overwritten_and_stop_can_be_retried(fleet):
    model = fleet.script("writer", WRITER)
    fleet.json("spawn", "--agent", "worker", "--model", model, "bump the answer")
    fleet.json("wait", "a1", "--timeout", "30")
    app = fleet.repo / "src" / "app.py"
    app.write_text("def main():\n    return 99\n")
    result = fleet.run("stop", "a1", "--json")
    assert result.returncode == 1
    [handoff] = json.loads(result.stdout)["handoffs"]
    assert [c["path"] for c in handoff["conflicts"]] == ["src/app.py"]
    assert handoff["applied"] == []
    assert handoff["remaining"]
    assert app.read_text() == "def main():\n    return 99\n"
    assert not (fleet.repo / "NOTES.md").exists()
    worktree = Path(handoff["workspace"])
    assert (worktree / "NOTES.md").exists()

    app.write_text("def main():\n    return 42\n")  # the parent resolves the drift
    [handoff] = fleet.json("stop", "a1")["handoffs"]
    assert handoff["conflicts"] == []
    assert sorted(handoff["applied"]) == ["NOTES.md", "src/app.py"]
    assert app.read_text() == "def main():\n    return 43\n"
    assert not worktree.exists()


def test_discard_deletes_an_unresolved_worktree(fleet):
    model = fleet.script("writer", WRITER)
    fleet.json("spawn", "--agent", "worker", "--model", model, "bump")
    fleet.json("wait", "a1", "--timeout", "30")
    (fleet.repo / "src" / "app.py").write_text("drift\n")
    fleet.run("stop", "a1")
    worktree = fleet.home / "sessions" / "t" / "worktrees" / "a1"
    assert worktree.exists()
    assert fleet.json("discard", "a1") == {"key": "a1", "discarded": True}
    assert not worktree.exists()
    assert (fleet.repo / "src" / "app.py").read_text() == "drift\n"


def test_a_worker_cannot_write_outside_its_worktree(fleet):
    model = fleet.script(
        "escape",
        f"""
        turns:
          - steps:
              - tool: write
                args: {{path: "{fleet.repo}/src/evil.py", content: "x"}}
              - reply: "{{{{last}}}}"
        """,
    )
    fleet.json("spawn", "--agent", "worker", "--model", model, "escape")
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert "outside" in note["report"]
    assert not (fleet.repo / "src" / "evil.py").exists()
