"""The integration queue end to end: four sandboxed workers held with ``stop --hold``, landed
one at a time by ``fleet land`` behind ``git apply --check`` and a sandboxed test gate."""

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Fleet, running_fleet

pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]

CHECK = 'if grep -q broken c.txt; then echo "c.txt is broken: FAILED"; exit 1; fi; echo ok\n'


def _worker(steps: list[dict[str, Any]]) -> str:
    return json.dumps({"turns": [{"steps": [*steps, {"reply": "## Summary\ndone"}]}]})


def _edit(path: str, old: str, new: str) -> dict[str, Any]:
    return {"tool": "edit", "args": {"path": path, "old_text": old, "new_text": new}}


def _write(path: str, content: str) -> dict[str, Any]:
    return {"tool": "write", "args": {"path": path, "content": content}}


def _parent_passes(repo: Path) -> bool:
    return (
        subprocess.run(["sh", "check.sh"], cwd=repo, capture_output=True, check=False).returncode
        == 0
    )


@pytest.fixture
def gated(tmp_path: Path):
    with running_fleet(tmp_path) as fleet:
        (fleet.home / "config.yaml").write_text("integration:\n  gate: sh check.sh\n")
        for name, text in {"a.txt": "one\n", "c.txt": "fine\n", "check.sh": CHECK}.items():
            (fleet.repo / name).write_text(text)
        for argv in (["git", "add", "-A"], ["git", "commit", "-qm", "gate"]):
            subprocess.run(argv, cwd=fleet.repo, env=fleet.env, check=True, capture_output=True)
        yield fleet


def test_good_changes_land_in_order_and_the_others_stay_held_with_why(gated: Fleet):
    fleet = gated
    changes = {
        "a1": [_edit("a.txt", "one", "one-a1")],
        "a2": [_edit("a.txt", "one", "one-a2")],  # conflicts with a1 once a1 landed
        "a3": [_write("c.txt", "broken\n")],  # breaks the gate
        "a4": [_write("d.txt", "four\n"), _write(".envrc", "export X=1\n")],
    }
    for key, steps in changes.items():
        # One at a time: two live workers may not own a.txt at once (ownership locks), and a
        # held change is not in the parent's tree, so a2 starts from the same a.txt as a1.
        model = fleet.script(key, _worker(steps))
        [agent] = fleet.json("spawn", "--agent", "worker", "--model", model, f"task {key}")[
            "agents"
        ]
        assert agent["key"] == key
        fleet.json("wait", key, "--timeout", "90", timeout=120)
        [handoff] = fleet.json("stop", key, "--hold")["handoffs"]
        assert handoff["changed"], handoff
    queue = fleet.json("queue")["queue"]
    assert [(e["key"], e["status"]) for e in queue] == [(k, "queued") for k in changes]
    assert [e["key"] for e in fleet.json("peek")["queue"]] == list(changes)

    first = fleet.json("land", timeout=120)["entry"]
    assert (first["key"], first["status"], first["landed"]) == ("a1", "landed", ["a.txt"])
    assert (fleet.repo / "a.txt").read_text() == "one-a1\n"
    assert _parent_passes(fleet.repo)

    second = fleet.json("land", code=1, timeout=120)["entry"]
    assert (second["key"], second["status"], second["conflicts"]) == ("a2", "held", ["a.txt"])
    assert "a.txt" in second["reason"]
    assert (fleet.repo / "a.txt").read_text() == "one-a1\n"

    third = fleet.json("land", code=1, timeout=120)["entry"]
    assert (third["key"], third["status"]) == ("a3", "held")
    assert "c.txt is broken: FAILED" in third["gate"]
    assert "exit 1" in third["reason"]
    assert (fleet.repo / "c.txt").read_text() == "fine\n"
    assert _parent_passes(fleet.repo)

    fourth = fleet.json("land", timeout=120)["entry"]
    assert (fourth["key"], fourth["status"], fourth["landed"]) == ("a4", "landed", ["d.txt"])
    assert [h["path"] for h in fourth["held_files"]] == [".envrc"]
    assert (fleet.repo / "d.txt").read_text() == "four\n"
    assert not (fleet.repo / ".envrc").exists()  # held-class: lands only by name
    assert _parent_passes(fleet.repo)

    assert fleet.json("land")["entry"] is None
    shown = {e["key"]: e["status"] for e in fleet.json("queue")["queue"]}
    assert shown == {"a1": "landed", "a2": "held", "a3": "held", "a4": "landed"}
    journal = fleet.home / "sessions" / "t" / "queue.jsonl"
    kinds = [json.loads(line)["kind"] for line in journal.read_text().splitlines()]
    assert set(kinds) == {"queue"}
    events = [json.loads(line) for line in fleet.run("events", "--json").stdout.splitlines()]
    landed = [(e["key"], e["status"]) for e in events if e["kind"] == "queue"]
    assert landed == [("a1", "landed"), ("a2", "held"), ("a3", "held"), ("a4", "landed")]


def test_land_without_a_gate_is_refused_in_one_line(fleet: Fleet):
    result = fleet.run("land")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("fleet land: no integration.gate is configured")


def test_the_gate_runs_sandboxed_it_cannot_write_the_parent_or_reach_the_state_dir(
    tmp_path: Path,
):
    # A worker's change is the code the gate runs: a hostile one rewrites check.sh.
    with running_fleet(tmp_path) as fleet:
        escape = fleet.repo / "escaped"
        probe = (
            f"echo x > {escape} 2>/dev/null && echo WROTE-PARENT; "
            f"ls {fleet.home} >/dev/null 2>&1 && ls {fleet.home}/sessions/t | grep -q control "
            "&& echo SAW-STATE; exit 1\n"
        )
        (fleet.home / "config.yaml").write_text("integration:\n  gate: sh check.sh\n")
        (fleet.repo / "check.sh").write_text("exit 0\n")
        for argv in (["git", "add", "-A"], ["git", "commit", "-qm", "gate"]):
            subprocess.run(argv, cwd=fleet.repo, env=fleet.env, check=True, capture_output=True)
        model = fleet.script("w", _worker([_write("check.sh", probe)]))
        fleet.json("spawn", "--agent", "worker", "--model", model, "rewrite the check")
        fleet.json("wait", "a1", "--timeout", "90", timeout=120)
        fleet.json("stop", "a1", "--hold")
        entry = fleet.json("land", code=1, timeout=120)["entry"]
        assert entry["status"] == "held"
        assert "WROTE-PARENT" not in entry["gate"]
        assert "SAW-STATE" not in entry["gate"]
        assert not escape.exists()
        assert (fleet.repo / "check.sh").read_text() == "exit 0\n"


def test_with_integration_auto_a_held_change_lands_without_fleet_land(tmp_path: Path):
    with running_fleet(tmp_path) as fleet:
        (fleet.home / "config.yaml").write_text(
            "integration:\n  gate: sh check.sh\n  auto: true\n  timeout: 120\n"
        )
        for name, text in {"a.txt": "one\n", "c.txt": "fine\n", "check.sh": CHECK}.items():
            (fleet.repo / name).write_text(text)
        for argv in (["git", "add", "-A"], ["git", "commit", "-qm", "gate"]):
            subprocess.run(argv, cwd=fleet.repo, env=fleet.env, check=True, capture_output=True)
        for key, steps in {
            "a1": [_edit("a.txt", "one", "one-a1")],
            "a2": [_write("c.txt", "broken\n")],
        }.items():
            model = fleet.script(key, _worker(steps))
            fleet.json("spawn", "--agent", "worker", "--model", model, f"task {key}")
            fleet.json("wait", key, "--timeout", "90", timeout=120)
            fleet.json("stop", key, "--hold")
        deadline = time.monotonic() + 90
        shown: dict[str, str] = {}
        while time.monotonic() < deadline:
            shown = {e["key"]: e["status"] for e in fleet.json("queue")["queue"]}
            if shown == {"a1": "landed", "a2": "held"}:
                break
            time.sleep(0.5)
        assert shown == {"a1": "landed", "a2": "held"}
        assert (fleet.repo / "a.txt").read_text() == "one-a1\n"
        assert (fleet.repo / "c.txt").read_text() == "fine\n"
        assert _parent_passes(fleet.repo)
        held = {e["key"]: e for e in fleet.json("peek")["queue"]}["a2"]
        assert "c.txt is broken: FAILED" in held["gate"]


def test_land_resolve_hands_a_conflict_to_a_resolver_whose_change_lands_behind_the_gate(
    tmp_path: Path,
):
    resolver = [
        _write("a.txt", "one-a1-a2\n"),
        {"reply": "## Summary\nresolved: {{task}}"},
    ]
    with running_fleet(tmp_path) as fleet:
        model = fleet.script("resolver", json.dumps({"turns": [{"steps": resolver}]}))
        (fleet.home / "config.yaml").write_text(
            f"subagents:\n  model: '{model}'\nintegration:\n  gate: sh check.sh\n"
        )
        for name, text in {"a.txt": "one\n", "c.txt": "fine\n", "check.sh": CHECK}.items():
            (fleet.repo / name).write_text(text)
        for argv in (["git", "add", "-A"], ["git", "commit", "-qm", "gate"]):
            subprocess.run(argv, cwd=fleet.repo, env=fleet.env, check=True, capture_output=True)
        for key, steps in {
            "a1": [_edit("a.txt", "one", "one-a1")],
            "a2": [_edit("a.txt", "one", "one-a2")],
        }.items():
            script = fleet.script(key, _worker(steps))
            fleet.json("spawn", "--agent", "worker", "--model", script, f"task {key}")
            fleet.json("wait", key, "--timeout", "90", timeout=120)
            fleet.json("stop", key, "--hold")
        assert fleet.json("land", timeout=120)["entry"]["status"] == "landed"  # a1
        held = fleet.json("land", "--resolve", code=1, timeout=120)
        assert (held["entry"]["key"], held["entry"]["status"]) == ("a2", "held")
        fixer = held["resolver"]
        assert fixer == "a3"
        done = fleet.json("wait", fixer, "--timeout", "90", timeout=120)
        summary = json.dumps(done)
        # The resolver's task carried the failure and the held change's patch.
        assert "conflict with the parent" in summary
        assert "a.txt" in summary
        assert "+one-a2" in summary
        assert (fleet.repo / "a.txt").read_text() == "one-a1\n"  # nothing landed yet
        fleet.json("stop", fixer, "--hold")
        queued = {e["key"]: e["status"] for e in fleet.json("queue")["queue"]}
        assert queued == {"a1": "landed", "a2": "held", "a3": "queued"}
        entry = fleet.json("land", timeout=120)["entry"]
        assert (entry["key"], entry["status"], entry["landed"]) == ("a3", "landed", ["a.txt"])
        assert (fleet.repo / "a.txt").read_text() == "one-a1-a2\n"
        assert _parent_passes(fleet.repo)
