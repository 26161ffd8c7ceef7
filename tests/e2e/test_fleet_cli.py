"""The fleet end to end, driven through the CLI the way an LLM parent drives it.

Real supervisor daemon, real child processes, real sockets, real git repository.
"""

import json
import signal
import time

import psutil
import pytest

pytestmark = pytest.mark.slow

REPORT = """
turns:
  - steps:
      - tool: read
        args: {path: README.md}
      - reply: "## Summary\\n{{task}} -> {{last}}"
"""


def _until_working(fleet, key: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        [agent] = fleet.json("peek", key)["agents"]
        if agent["state"] == "working" and agent["activity"] == "working":  # prompt sent
            return
        time.sleep(0.05)
    raise AssertionError(f"{key} never started working")


def _child_pid(fleet, key: str) -> int:
    # Known by its run marker (its loadout and connection are inherited descriptors).
    for process in psutil.process_iter(["pid", "cmdline", "environ"]):
        environ = process.info["environ"] or {}
        cmdline = process.info["cmdline"] or []
        if (
            environ.get("FLEET_HOME") == str(fleet.home)
            and environ.get("FLEET_RUN", "").startswith(f"t/{key}/")
            and cmdline[2:4] in (["-m", "child"], ["-m", "child._forkserver"])
        ):
            return process.pid
    raise AssertionError(f"no process for {key}")


def test_three_scouts_in_parallel_return_only_final_text(fleet):
    model = fleet.script("report", REPORT)
    keys = []
    for task in ("alpha", "beta", "gamma"):
        data = fleet.json("spawn", "--model", model, task)
        keys.append(data["agents"][0]["key"])
        assert data["agents"][0]["agent"] == "scout"
    assert keys == ["a1", "a2", "a3"]
    settled = fleet.json("wait", *keys, "--all", "--timeout", "60")["settled"]
    reports = {n["key"]: n["report"] for n in settled}
    assert set(reports) == set(keys)
    for key, task in zip(keys, ("alpha", "beta", "gamma"), strict=True):
        assert reports[key].startswith(f"## Summary\n{task} -> ")
        assert "The answer is 42." in reports[key]
    peek = fleet.json("peek")
    assert {a["state"] for a in peek["agents"]} == {"idle"}
    handoffs = fleet.json("stop", "--all")["handoffs"]
    assert sorted(h["key"] for h in handoffs) == keys
    assert all(h["state"] == "stopped" for h in handoffs)
    assert fleet.json("peek")["agents"] == []


def test_steer_changes_a_scripted_childs_course(fleet):
    model = fleet.script(
        "steer",
        """
        turns:
          - steps:
              - wait: 30
                until: steer
              - branch:
                  steered: [{reply: "steered to {{steer}}"}]
                  default: [{reply: "never steered"}]
        """,
    )
    fleet.json("spawn", "--model", model, "work")
    assert fleet.json("steer", "a1", "the", "east")["key"] == "a1"
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["report"] == "steered to the east"


def test_pause_then_resume_keeps_the_same_child_and_context(fleet):
    model = fleet.script(
        "pause",
        """
        turns:
          - steps:
              - hang: true
          - steps:
              - reply: "second turn: {{task}}"
        """,
    )
    fleet.json("spawn", "--model", model, "first")
    pid = _child_pid(fleet, "a1")
    _until_working(fleet, "a1")  # its first turn has begun: the pause aborts it
    paused = fleet.json("pause", "a1")
    assert paused == {"key": "a1", "state": "paused", "settled": True}
    assert fleet.json("resume", "a1", "go", "on")["key"] == "a1"
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["report"] == "second turn: go on"
    assert _child_pid(fleet, "a1") == pid


def test_ask_answers_a_side_question_and_the_task_continues(fleet):
    model = fleet.script(
        "ask",
        """
        turns:
          - steps:
              - hang: true
          - steps:
              - reply: "resumed: {{task}}"
        side:
          - steps:
              - reply: "BTW: I am reading README.md"
        """,
    )
    fleet.json("spawn", "--model", model, "long task")
    # Asked before the prompt went out, the pause drops it and the resumed prompt would be
    # the script's first turn (the hang).
    _until_working(fleet, "a1")
    answer = fleet.json("ask", "a1", "what", "are", "you", "doing?")
    assert answer == {"key": "a1", "answer": "BTW: I am reading README.md"}
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["report"].startswith("resumed: Continue the task")
    assert "long task" in note["report"]


def test_a_child_question_is_answered_with_fleet_answer(fleet):
    model = fleet.script(
        "question",
        """
        turns:
          - steps:
              - tool: ask_parent
                args: {question: "Which database?"}
              - reply: "Using {{last}}"
        """,
    )
    # The bundled scout has no ask_parent tool in every scope; use the batch form to name it.
    fleet.json("spawn", "--model", model, "pick a db")
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["state"] == "waiting"
    assert note["question"] == {"id": "q1", "text": "Which database?"}
    assert fleet.json("answer", "q1", "postgres") == {"question": "q1", "key": "a1"}
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["report"] == "Using postgres"


def test_a_batch_over_the_cap_is_rejected_whole(fleet, tmp_path):
    model = fleet.script("report", REPORT)
    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps([{"task": f"t{i}", "model": model} for i in range(3)]))
    result = fleet.run("spawn", "--batch", str(batch), "--max-subagents", "2", "--json")
    assert result.returncode == 4, result.stderr
    assert json.loads(result.stdout)["error"]["kind"] == "capacity"
    assert result.stderr.startswith("fleet spawn: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert fleet.json("peek")["agents"] == []


def test_the_lane_queues_the_fourth_prompt_and_it_still_runs(fleet, tmp_path):
    model = fleet.script(
        "slow",
        """
        turns:
          - steps:
              - wait: 3
              - reply: "done {{task}}"
        """,
    )
    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps([{"task": f"t{i}", "model": model} for i in range(4)]))
    fleet.json("spawn", "--batch", str(batch))
    deadline = time.monotonic() + 10
    lane = {}
    while time.monotonic() < deadline:
        lane = fleet.json("peek")["lane"]
        if lane["working"] == 3 and lane["queued"] == 1:
            break
        time.sleep(0.2)
    assert lane == {"capacity": 3, "working": 3, "queued": 1}
    settled = fleet.json("wait", "a1", "a2", "a3", "a4", "--all", "--timeout", "60")["settled"]
    assert sorted(n["report"] for n in settled) == [f"done t{i}" for i in range(4)]


def test_a_sigkilled_child_is_reported_failed_with_its_classified_error(fleet):
    model = fleet.script("hang", "turns:\n  - steps:\n      - hang: true\n")
    fleet.json("spawn", "--model", model, "hang")
    pid = _child_pid(fleet, "a1")
    time.sleep(0.5)
    psutil.Process(pid).send_signal(signal.SIGKILL)
    result = fleet.run("wait", "a1", "--timeout", "30", "--json")
    assert result.returncode == 1
    [note] = json.loads(result.stdout)["settled"]
    assert note["state"] == "failed"
    assert note["failure"]["kind"] == "killed"
    assert "SIGKILL" in note["failure"]["error"]
    assert note["failure"]["log"].endswith("a1.log")
    peek = fleet.json("peek")
    assert peek["agents"] == []
    assert peek["lane"]["working"] == 0


def test_stop_returns_the_handoff(fleet):
    model = fleet.script("report", REPORT)
    fleet.json("spawn", "--model", model, "--name", "reader", "look")
    fleet.json("wait", "reader", "--timeout", "30")
    [handoff] = fleet.json("stop", "reader")["handoffs"]
    assert handoff["key"] == "a1"
    assert handoff["name"] == "reader"
    assert handoff["state"] == "stopped"
    assert handoff["task"] == "look"
    assert handoff["workspace"] == str(fleet.repo)
    assert handoff["last"].startswith("## Summary\nlook -> ")
    assert handoff["error"] == ""
    assert set(handoff) >= {"changed", "applied", "remaining", "conflicts"}


def test_errors_are_one_line_with_exit_codes(fleet):
    result = fleet.run("steer", "a9", "x", "--json")
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["kind"] == "not-found"
    assert result.stderr.count("\n") == 1
    result = fleet.run("spawn", "--model", "scripted:/nope.yaml", "x")
    assert result.returncode == 2
    assert "does not exist" in result.stderr


def test_agent_dirs_bring_claude_code_agents_to_listing_and_spawn(fleet):
    claude = fleet.repo / ".claude" / "agents"
    claude.mkdir(parents=True)
    (claude / "reviewer.md").write_text(
        "---\nname: reviewer\ndescription: Reviews diffs\ntools: Read, Grep\n---\nReview.\n"
    )
    names = {a["name"]: a for a in fleet.json("agents")["agents"]}
    assert "reviewer" not in names
    listed = {a["name"]: a for a in fleet.json("agents", "--agent-dirs", "claude")["agents"]}
    assert listed["reviewer"]["source"] == "claude"
    assert listed["reviewer"]["tools"] == ["read", "grep"]
    # The running supervisor keeps the directories for later commands, spawns included.
    model = fleet.script("r", REPORT)
    data = fleet.json("spawn", "--agent", "reviewer", "--model", model, "look")
    [key] = [a["key"] for a in data["agents"]]
    [note] = fleet.json("wait", key, "--timeout", "30")["settled"]
    assert "look -> " in note["report"]
    fleet.json("stop", key)
