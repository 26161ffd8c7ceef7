"""Coordination end to end through the real CLI: the paper, democracy rounds, the brief.

Children that use the paper need the ``discuss`` tool, which the bundled scout lacks; they come
from a user-scope definition (``FLEET_AGENTS_DIR``) in the test's own directory.
"""

import json
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

REQUEST = {
    "complexity": "super-complex",
    "justification": "The lock, the replay cache and reconnects interact; each fix broke another.",
    "issue": "Replayed requests run twice after a reconnect.",
    "failed_approaches": [
        {"approach": "A bigger replay cache", "evidence": "Duplicate in run 41, log line 88."},
        {"approach": "Per-owner locks", "evidence": "test_reconnect deadlocks at 30 s."},
    ],
    "options": [
        {"id": "A", "title": "Persist the cache", "tradeoffs": "A disk write per request."},
        {"id": "B", "title": "Idempotency keys", "tradeoffs": "A protocol change."},
    ],
}

TALKER = """---
name: talker
description: A read-only scout that uses the discussion paper.
tools: [read, discuss]
mode: scout
---
You talk on the paper.
"""


@pytest.fixture
def options(tmp_path):
    path = tmp_path / "round.json"
    path.write_text(json.dumps(REQUEST))
    return str(path)


def test_the_parent_asks_answers_and_lists_on_the_paper(fleet):
    assert fleet.json("discuss", "ask", "--to", "a1", "Which", "module?") == {
        "id": "d1",
        "text": "d1",
    }
    assert fleet.json("discuss", "ask", "Anyone on docs/?")["id"] == "d2"
    assert fleet.json("discuss", "answer", "d1", "ipc/_channel.py")["id"] == "d3"
    # Nothing new by others: the parent wrote everything.
    listed = fleet.json("discuss", "list")
    assert listed == {"entries": [], "omitted": 0, "latest": "d3", "text": listed["text"]}
    assert listed["text"] == "No new entries (latest d3)."
    reread = fleet.json("discuss", "list", "--since", "d0")
    assert [e["id"] for e in reread["entries"]] == ["d3", "d2", "d1"]
    assert reread["entries"][2] | {"at": 0} == {
        "id": "d1",
        "kind": "question",
        "author": "parent",
        "to": "a1",
        "question": None,
        "text": "Which module?",
        "at": 0,
    }
    thread = fleet.run("discuss", "list", "--question", "d1")
    assert thread.returncode == 0, thread.stderr
    assert thread.stdout.splitlines() == [
        "d1 parent asks a1: Which module?",
        "d3 parent answers d1: ipc/_channel.py",
    ]
    missing = fleet.run("discuss", "answer", "d9", "late", "--json")
    assert missing.returncode == 4
    assert json.loads(missing.stdout)["error"]["kind"] == "refused"
    assert missing.stderr.startswith(
        "fleet discuss: paper answer by parent: d9 is not on the paper"
    )


def test_two_children_talk_through_their_discuss_tool_and_the_parent_joins(fleet, tmp_path):
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "talker.md").write_text(TALKER)
    fleet.env["FLEET_AGENTS_DIR"] = str(agents)
    asker = fleet.script(
        "asker",
        """
        turns:
          - steps:
              - {tool: discuss, args: {op: ask, to: a2, text: "Which module owns retries?"}}
              - reply: "asked {{last}}"
          - steps:
              - {tool: discuss, args: {op: list}}
              - reply: "{{last}}"
        """,
    )
    answerer = fleet.script(
        "answerer",
        """
        turns:
          - steps:
              - {tool: discuss, args: {op: list}}
              - {tool: discuss, args: {op: answer, question: d1, text: "ipc/_channel.py"}}
              - reply: "saw: {{tool:discuss}}"
        """,
    )
    fleet.json("spawn", "--agent", "talker", "--model", asker, "ask a2")
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["report"] == "asked d1"
    fleet.json("spawn", "--agent", "talker", "--model", answerer, "answer a1")
    [note] = fleet.json("wait", "a2", "--timeout", "30")["settled"]
    # The answer's reply is its id: a2 had already read everything addressed to it.
    assert note["report"] == "saw: d2"
    assert fleet.json("discuss", "ask", "--to", "a1", "Is the cache shared?")["id"] == "d3"
    fleet.json("resume", "a1", "read the paper")
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["report"].splitlines() == [
        "d3 parent asks a1: Is the cache shared?",
        "d2 a2 answers d1: ipc/_channel.py",
    ]
    listed = fleet.json("discuss", "list")
    assert [(e["id"], e["author"]) for e in listed["entries"]] == [("d2", "a2"), ("d1", "a1")]
    assert listed["latest"] == "d3"


def test_fleet_vote_seats_fresh_scouts_and_prints_the_majority(fleet, options):
    model = fleet.script(
        "vote-a",
        """
        turns:
          - steps:
              - reply: |
                  Persisting is simplest.
                  BALLOT {{nonce}} A the log shows the cache is lost on reconnect
        """,
    )
    fleet.json("spawn", "--model", fleet.script("idle", "turns: []\n"), "stand by")
    fleet.json("wait", "a1", "--timeout", "30")
    data = fleet.json("vote", "--options", options, "--model", model, "--voters", "3", timeout=120)
    assert data["round"] == "r1"
    assert (data["status"], data["winner"], data["invited"]) == ("winner", "A", 3)
    assert data["counts"] == {"A": 3}
    assert [b["status"] for b in data["ballots"]] == ["valid"] * 3
    assert data["ballots"][0]["rationale"] == "the log shows the cache is lost on reconnect"
    assert "leading" not in data
    # The round's scouts are gone; the parent's own child is untouched.
    assert [(a["key"], a["state"]) for a in fleet.json("peek")["agents"]] == [("a1", "idle")]
    human = fleet.run("vote", "--options", options, "--model", model, "--voters", "2")
    assert human.returncode == 0, human.stderr
    assert human.stdout.startswith("round r2: winner (A 2; 2 invited)\n")
    assert "Recommendation: A." in human.stdout


def test_a_second_vote_is_refused_and_an_abort_voids_the_first(fleet, options):
    hang = fleet.script("hang", "turns:\n  - steps:\n      - hang: true\n")
    argv = [sys.executable, "-m", "orchestrator", "vote", "--options", options, "--json"]
    fleet.json("peek")  # start the supervisor before the background vote needs it
    first = subprocess.Popen(
        [*argv, "--model", hang, "--voters", "2"],
        cwd=fleet.repo,
        env=fleet.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while len(fleet.json("peek")["agents"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        second = fleet.run("vote", "--options", options, "--model", hang, "--json")
        assert second.returncode == 4, second.stderr
        assert "round r1 is still running" in json.loads(second.stdout)["error"]["message"]
        aborted = fleet.json("vote", "--abort")
        assert aborted["status"] == "failed"
        assert aborted["ballots"] == []
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 1, err
    assert (
        json.loads(out)["reason"]
        == "round r1 was aborted; its ballots are void (start a new round)"
    )
    assert fleet.json("peek")["agents"] == []


def test_a_round_that_no_voter_answers_fails_with_exit_1(fleet, options):
    hang = fleet.script("hang", "turns:\n  - steps:\n      - hang: true\n")
    result = fleet.run(
        "vote", "--options", options, "--model", hang, "--voters", "2", "--deadline", "2", "--json"
    )
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["status"] == "failed"
    assert [b["status"] for b in data["ballots"]] == ["failed", "failed"]
    assert all("2 s deadline" in b["reason"] for b in data["ballots"])
    assert fleet.json("peek")["agents"] == []


def test_a_full_fleet_refuses_the_round_and_stops_no_one(fleet, options):
    hang = fleet.script("hang", "turns:\n  - steps:\n      - hang: true\n")
    fleet.json("spawn", "--model", hang, "--max-subagents", "2", "busy")
    fleet.json("spawn", "--agent", "worker", "--model", hang, "write")
    result = fleet.run("vote", "--options", options, "--model", hang, "--json")
    assert result.returncode == 4, result.stderr
    assert json.loads(result.stdout)["error"]["kind"] == "capacity"
    assert result.stderr.startswith("fleet vote: 2 fresh voter(s) need free slots")
    assert len(result.stderr.strip().splitlines()) == 1
    assert [a["state"] for a in fleet.json("peek")["agents"]] == ["working", "working"]


def test_fleet_brief_fits_2000_characters_and_names_every_child(fleet):
    model = fleet.script("idle", "turns: []\n")
    for task in ("one", "two", "three"):
        fleet.json("spawn", "--model", model, "--name", f"scout-{task}", task)
    fleet.json("wait", "a1", "a2", "a3", "--all", "--timeout", "30")
    text = fleet.json("brief")["text"]
    assert len(text) <= 2000
    assert text.startswith("You moderate a fleet: mode build, 3/4 children,")
    for key, name in (("a1", "scout-one"), ("a2", "scout-two"), ("a3", "scout-three")):
        assert f"\n- {key} {name} (scout, scout) idle — " in text
    assert "Do not poll: fleet wait" in text
    human = fleet.run("brief")
    assert human.returncode == 0
    assert human.stdout == text + "\n"
