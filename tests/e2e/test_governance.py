"""Governance through the real CLI: workflow modes, nested spawn, ownership locks, reject log.

Agent definitions come from a user-scope directory (``FLEET_AGENTS_DIR``), which the supervisor
daemon loads in its default scope.
"""

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

HOLD = """
turns:
  - steps:
      - wait: 30
        until: steer
      - reply: "held until {{steer}}"
"""


def define(fleet, name: str, **front: object) -> None:
    directory = Path(fleet.env.setdefault("FLEET_AGENTS_DIR", str(fleet.scripts / "agents")))
    directory.mkdir(exist_ok=True)
    header = json.dumps({"name": name, "description": f"e2e agent {name}", **front})
    (directory / f"{name}.md").write_text(f"---\n{header}\n---\nYou are a test agent.\n")


def wait_for(fleet, predicate, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        peek: dict[str, Any] = fleet.json("peek")
        if predicate(peek) or time.monotonic() > deadline:
            return peek
        time.sleep(0.2)


def test_plan_mode_refuses_writers_with_exit_4_and_keeps_running_children(fleet):
    fleet.env["FLEET_REJECT_LOG"] = "1"
    define(fleet, "runner", backend="command", mode="fork", tools=["read"])
    hold = fleet.script("hold", HOLD)
    # A writer-capable child started in build mode ...
    (fleet.repo / "run.sh").write_text("sleep 2; echo ran\n")
    fleet.json("spawn", "run it", "--agent", "runner", "--command", "sh run.sh")
    fleet.json("spawn", "--model", hold, "--name", "early", "wait")
    assert fleet.json("mode", "plan") == {"mode": "plan"}
    assert fleet.json("mode") == {"mode": "plan"}

    refused = fleet.run("spawn", "--agent", "worker", "--model", hold, "change it", "--json")
    assert refused.returncode == 4, refused.stderr
    assert json.loads(refused.stdout)["error"]["kind"] == "policy"
    [line] = refused.stderr.splitlines()
    assert line.startswith("fleet spawn: spawn worker: tool ")
    assert "not allowed in plan mode" in line
    command = fleet.run("spawn", "--command", "true", "--backend", "command", "x", "--json")
    assert command.returncode == 4
    assert "command backend is not read-only, refused in plan mode" in command.stderr

    # ... survives the mode change, and read-only scouts still launch.
    late = fleet.json("spawn", "--model", hold, "--name", "late", "look")["agents"][0]
    modes = {a["name"]: a["workflow_mode"] for a in fleet.json("peek")["agents"]}
    assert modes == {"runner-1": "build", "early": "build", "late": "plan"}
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert (note["state"], note["report"]) == ("idle", "ran\n")
    fleet.json("steer", "early", "go")
    [note] = fleet.json("wait", "early", "--timeout", "30")["settled"]
    assert note["report"] == "held until go"
    assert late["key"] == "a3"

    rejected = fleet.home / "sessions" / "t" / "logs" / "rejected.jsonl"
    entries = [json.loads(line) for line in rejected.read_text().splitlines()]
    assert [(e["kind"], e["args"]["agents"]) for e in entries] == [
        ("policy", ["worker"]),
        ("policy", ["scout"]),
    ]


def test_a_nested_spawn_returns_only_the_grandchilds_report_to_its_caller(fleet):
    lead = fleet.script(
        "lead",
        """
        turns:
          - steps:
              - tool: subagent
                args: {agent: scout, task: "what is the answer?"}
              - reply: "lead heard: {{last}}"
          - steps:
              - tool: subagent
                args: {agent: worker, task: "not allowed"}
              - reply: "{{last}}"
        """,
    )
    define(fleet, "lead", mode="fork", tools=["read"], subagent_agents=["scout"], model=lead)
    scout = fleet.script(
        "scout",
        """
        turns:
          - steps:
              - tool: grep
                args: {pattern: "answer is"}
              - reply: "## Summary\\nIt is 42."
        """,
    )
    fleet.json("spawn", "--agent", "lead", "--default-model", scout, "delegate")
    settled = fleet.json("wait", "--timeout", "60")["settled"]
    assert [n["key"] for n in settled] == ["a1"]
    assert settled[0]["report"] == "lead heard: ## Summary\nIt is 42."
    assert [a["key"] for a in fleet.json("peek")["agents"]] == ["a1"]
    fleet.json("resume", "a1", "again")
    [note] = fleet.json("wait", "a1", "--timeout", "60")["settled"]
    assert note["report"] == (
        "subagent refused: subagent: worker is not in lead's subagent_agents allowlist (scout)"
    )


def test_overlapping_writers_the_second_is_refused_and_locks_show_in_peek(fleet):
    hold = fleet.script(
        "write-hold",
        """
        turns:
          - steps:
              - tool: write
                args: {path: src/owned.py, content: "x = 1\\n"}
              - wait: 30
                until: steer
              - reply: "done"
        """,
    )
    second = fleet.script(
        "write-tell",
        """
        turns:
          - steps:
              - tool: write
                args: {path: src/app.py, content: "y = 2\\n"}
              - reply: "{{last}}"
        """,
    )
    tools = ["read", "write"]
    define(fleet, "owner", mode="worktree", tools=tools, ownership=["src/**"], model=hold)
    define(fleet, "other", mode="worktree", tools=tools, ownership=["src/app.py"], model=second)
    fleet.json("spawn", "--agent", "owner", "first")
    peek = wait_for(fleet, lambda p: bool(p["locks"]))
    repo = fleet.repo.resolve()
    assert peek["locks"] == {"a1": [f"{repo}/src/**"]}
    fleet.json("spawn", "--agent", "other", "second")
    [note] = fleet.json("wait", "a2", "--timeout", "60")["settled"]
    assert note["report"].startswith(
        f"write refused: lock for a2: path {repo}/src/app.py is owned by a1 ({repo}/src/**)"
    )
    assert "\n" not in note["report"]
    fleet.json("stop", "a1", "a2")
    assert fleet.json("peek")["locks"] == {}
