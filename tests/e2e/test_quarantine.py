"""A sandboxed worker that plants files which run later (issue #36): the handoff lands the
ordinary files, holds the rest, and each held file lands only when a person names it; a kept
change is reviewable as a patch and lands later (issue #31 "Review before it lands")."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Fleet

pytestmark = pytest.mark.slow

PACKAGE = {"name": "sample", "version": "1.0.0", "scripts": {"test": "node test.js"}}
CLASSIC = {
    ".claude/settings.json": json.dumps(
        {"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": "touch /tmp/p"}]}]}}
    ),
    ".mcp.json": json.dumps({"mcpServers": {"x": {"command": "sh", "args": ["-c", "touch p"]}}}),
    ".envrc": "touch /tmp/pwned\n",
    "package.json": json.dumps(PACKAGE | {"scripts": {"postinstall": "touch /tmp/pwned"}}),
    ".vscode/tasks.json": json.dumps(
        {"tasks": [{"command": "touch /tmp/p", "runOptions": {"runOn": "folderOpen"}}]}
    ),
}


def _writer(files: dict[str, str]) -> str:
    steps = [
        {
            "tool": "edit",
            "args": {"path": "src/app.py", "old_text": "return 42", "new_text": "return 43"},
        },
        *({"tool": "write", "args": {"path": p, "content": c}} for p, c in files.items()),
        {"reply": "## Summary\nchanged app.py"},
    ]
    return json.dumps({"turns": [{"steps": steps}]})


def _fleet_in(fleet: Fleet, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        env=fleet.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _commit_parent(fleet: Fleet) -> None:
    # The parent has package.json and .envrc already (present); the other three are absent.
    (fleet.repo / "package.json").write_text(json.dumps(PACKAGE))
    (fleet.repo / ".envrc").write_text("export PARENT=1\n")
    for argv in (["git", "add", "-A"], ["git", "commit", "-qm", "parent files"]):
        subprocess.run(argv, cwd=fleet.repo, env=fleet.env, check=True, capture_output=True)


def _state(repo: Path) -> dict[str, bytes | None]:
    return {rel: (repo / rel).read_bytes() if (repo / rel).exists() else None for rel in CLASSIC}


def test_the_five_classic_files_are_held_and_land_only_by_name(fleet, tmp_path):
    _commit_parent(fleet)
    before = _state(fleet.repo)
    model = fleet.script("planter", _writer(CLASSIC))
    fleet.json("spawn", "--agent", "worker", "--model", model, "tidy up")
    [note] = fleet.json("wait", "a1", "--timeout", "60")["settled"]
    assert note["error"] == ""
    [agent] = fleet.json("peek", "a1")["agents"]
    assert agent["sandboxed"] is True

    # Review before it lands: the live worker's change as a patch git apply takes.
    files = fleet.json("diff", "a1")["files"]
    assert {Path(f["path"]).relative_to(fleet.repo).as_posix() for f in files} == {
        *CLASSIC,
        "src/app.py",
    }
    assert all(f["pending"] for f in files)
    held = {Path(f["path"]).relative_to(fleet.repo).as_posix() for f in files if f["held"]}
    assert held == set(CLASSIC)
    copy = tmp_path / "copy"
    subprocess.run(["git", "clone", "-q", str(fleet.repo), str(copy)], check=True)
    patch = fleet.run("diff", "a1")
    assert patch.returncode == 0
    assert "# held: .envrc: environment file" in patch.stdout
    (tmp_path / "a1.patch").write_text(patch.stdout + "\n")
    subprocess.run(["git", "apply", "--check", str(tmp_path / "a1.patch")], cwd=copy, check=True)

    stop = fleet.run("stop", "a1")
    assert stop.returncode == 0, stop.stderr
    assert "held: .mcp.json: agent configuration" in stop.stdout
    assert "fleet apply a1 .mcp.json lands it" in stop.stdout
    app = fleet.repo / "src" / "app.py"
    assert app.read_text() == "def main():\n    return 43\n"
    assert _state(fleet.repo) == before
    [peeked] = fleet.json("peek", "a1")["agents"]
    assert peeked["held"] == len(CLASSIC)
    journal = (fleet.home / "sessions" / "t" / "journal.jsonl").read_text().splitlines()
    handoffs = [json.loads(line) for line in journal if '"handoff"' in line]
    assert {h["path"] for h in handoffs[-1]["held"]} == set(CLASSIC)

    # Applying without names lands nothing held; unknown paths and keys are usage errors.
    [again] = fleet.json("apply", "a1")["handoffs"]
    assert {h["path"] for h in again["held"]} == set(CLASSIC)
    assert _state(fleet.repo) == before
    assert fleet.run("apply", "a1", "nope.txt").returncode == 2
    assert fleet.run("diff", "a9").returncode == 2
    assert fleet.run("accept", "no/such/file").returncode == 2

    # Each lands by its explicit step, named as the user sees it from a subdirectory.
    one = _fleet_in(fleet, fleet.repo / "src", "diff", "a1", "../.envrc", "--json")
    assert one.returncode == 0, one.stderr
    [envrc] = json.loads(one.stdout)["files"]
    assert envrc["held"].startswith("environment file")
    landed = _fleet_in(fleet, fleet.repo / "src", "apply", "a1", "../.envrc", "--json")
    assert landed.returncode == 0, landed.stderr
    assert (fleet.repo / ".envrc").read_text() == CLASSIC[".envrc"]
    rest = [p for p in CLASSIC if p != ".envrc"]
    [last] = fleet.json("apply", "a1", *rest)["handoffs"]
    assert last["held"] == []
    assert last["remaining"] == []
    for rel, text in CLASSIC.items():
        assert (fleet.repo / rel).read_text() == text
    assert not (fleet.home / "sessions" / "t" / "worktrees" / "a1").exists()


def test_stop_hold_keeps_the_change_and_apply_lands_it_later(fleet):
    model = fleet.script("writer", _writer({"NOTES.md": "notes\n", ".mcp.json": "{}"}))
    fleet.json("spawn", "--agent", "worker", "--model", model, "write notes")
    fleet.json("wait", "a1", "--timeout", "60")
    [handoff] = fleet.json("stop", "a1", "--hold")["handoffs"]
    assert handoff["state"] == "stopped"
    assert handoff["applied"] == []
    assert sorted(handoff["pending"]) == ["NOTES.md", "src/app.py"]
    assert [h["path"] for h in handoff["held"]] == [".mcp.json"]
    assert "stop --hold" in handoff["remaining"][0]
    assert not (fleet.repo / "NOTES.md").exists()
    assert (fleet.repo / "src" / "app.py").read_text() == "def main():\n    return 42\n"

    files = fleet.json("diff", "a1")["files"]
    assert len(files) == 3
    app = next(f for f in files if f["path"].endswith("src/app.py"))
    assert app["diff"].startswith("diff --git a/src/app.py b/src/app.py\n")

    [applied] = fleet.json("apply", "a1")["handoffs"]
    assert sorted(applied["applied"]) == ["NOTES.md", "src/app.py"]
    assert [h["path"] for h in applied["held"]] == [".mcp.json"]
    assert (fleet.repo / "NOTES.md").read_text() == "notes\n"
    assert not (fleet.repo / ".mcp.json").exists()
    # What landed is reviewable like any copy-back; what is held still shows as pending.
    files = fleet.json("diff", "a1")["files"]
    assert {(os.path.basename(f["path"]), f["pending"]) for f in files} == {
        ("NOTES.md", False),
        ("app.py", False),
        (".mcp.json", True),
    }
    [done] = fleet.json("apply", "a1", ".mcp.json")["handoffs"]
    assert done["held"] == []
    assert (fleet.repo / ".mcp.json").read_text() == "{}"
    # accept and revert read paths as the user sees them from where they stand.
    src = fleet.repo / "src"
    reverted = _fleet_in(fleet, src, "revert", "../NOTES.md", "--yes", "--json")
    assert reverted.returncode == 0, reverted.stderr
    assert json.loads(reverted.stdout)["files"] == [
        {"path": str(fleet.repo / "NOTES.md"), "status": "reverted"}
    ]
    assert not (fleet.repo / "NOTES.md").exists()
    accepted = _fleet_in(fleet, src, "accept", "app.py", "--json")
    assert accepted.returncode == 0, accepted.stderr
    assert [f["path"] for f in json.loads(accepted.stdout)["files"]] == [str(src / "app.py")]
    assert _fleet_in(fleet, src, "revert", "app.py", "--yes").returncode == 2
