"""A lost child comes back: the supervisor is SIGKILLed mid-turn, the next one lists the child
as ``lost``, and ``fleet revive`` starts it again with its key, name and conversation.

Driven through the real ``fleet`` CLI, the builtin agent talking to the loopback scripted model
server: two turns settle, the third stalls in its model call when ``fleet serve`` is killed.
The revived child's next request must carry the two earlier turns (restored from the
transcript it saved after each), and the restart line the child alone sees.
"""

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from child.backends._base import RESTARTED
from tests.fakes._agent_clis import NPM_BIN
from tests.fakes.model_server import ModelServer
from tests.faults.conftest import GIT_ENV

pytestmark = pytest.mark.slow


def _json(faults, *args: str, timeout: float = 60) -> dict[str, Any]:
    result = faults.cli(*args, "--json", timeout=timeout)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _until(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _kill_supervisor(faults) -> int:
    session = faults.home / "sessions" / "t"
    daemon = int((session / "supervisor.lock").read_text().strip())
    os.kill(daemon, signal.SIGKILL)
    _until(lambda: faults.processes() == [], timeout=15)
    return daemon


def _user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] in {"user", "assistant"}]


def test_a_revived_builtin_child_continues_its_conversation(faults) -> None:
    with ModelServer() as srv:
        srv.script(
            "c1",
            [
                {"text": "## Summary\nfirst"},
                {"text": "## Summary\nsecond"},
                {"stall": True, "text": "partial"},
                {"text": "## Summary\nafter the revive"},
            ],
        )
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        spawned = _json(
            faults, "spawn", "--model", model, "--name", "mapper", "--budget", "90000", "turn one"
        )
        assert spawned["agents"][0]["key"] == "a1"
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nfirst"
        _json(faults, "resume", "a1", "turn two")
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nsecond"
        _json(faults, "resume", "a1", "turn three")
        _until(lambda: len(srv.requests("c1")) == 3)
        daemon = _kill_supervisor(faults)

        first = faults.cli("peek", "--json")
        assert first.returncode == 0, first.stderr
        [warning] = first.stderr.strip().splitlines()
        assert f"(pid {daemon}) died" in warning
        assert "fleet revive a1 brings them back with their context" in warning
        [lost] = json.loads(first.stdout)["stale"]
        assert (lost["key"], lost["state"], lost["revivable"]) == ("a1", "lost", True)

        revived = _json(faults, "revive", "a1")
        assert revived["revived"][0]["key"] == "a1"
        assert revived["revived"][0]["name"] == "mapper"
        _until(lambda: _json(faults, "peek", "a1")["agents"][0]["state"] == "idle")
        # The budget it was spawned with comes back with it (budgets are docs/governance.md's).
        assert _json(faults, "usage", "a1")["agents"][0]["budget"] == {"hard_tokens": 90000}
        _json(faults, "resume", "a1", "turn four")
        [note] = _json(faults, "wait", "a1")["settled"]
        assert note["report"] == "## Summary\nafter the revive"

        fourth = srv.requests("c1")[3].body
        texts = _user_texts(fourth)
        assert texts[:4] == ["turn one", "## Summary\nfirst", "turn two", "## Summary\nsecond"]
        assert texts[4] == f"{RESTARTED}\nturn four"  # the lost third turn was never saved
        assert fourth["messages"][0]["role"] == "system"

        events = [json.loads(line) for line in faults.cli("events", "--json").stdout.splitlines()]
        kinds = [(e["key"], e["kind"]) for e in events]
        for expected in ("spawn", "resume", "settled", "lost", "revived"):
            assert ("a1", expected) in kinds, kinds
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        [lost_event] = [e for e in events if e["kind"] == "lost"]
        assert lost_event["was"] == "working"
        later = faults.cli("events", "--since", str(lost_event["seq"]), "--json").stdout
        assert json.loads(later.splitlines()[0])["seq"] == lost_event["seq"] + 1
        _json(faults, "stop", "a1")


def test_a_revived_child_keeps_its_role_and_the_fallback_it_moved_to(faults) -> None:
    with ModelServer() as srv:
        base = srv.base_url("c1") + "/v1"
        (faults.home / "roles.yaml").write_text(
            f"roles:\n  worker:\n    model: openai/primary@{base}\n"
            f"    fallbacks: [openai/spare@{base}]\n"
        )
        limited = {"status": 429, "body": "rate limited"}  # thrice: the agent retries twice
        srv.script(
            "c1",
            [
                *[limited] * 3,
                {"text": "## Summary\non the spare"},
                {"stall": True, "text": "partial"},
                {"text": "## Summary\nafter the revive"},
            ],
        )
        _json(faults, "spawn", "--model", "@worker", "turn one")
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\non the spare"
        _json(faults, "resume", "a1", "turn two")
        _until(lambda: len(srv.requests("c1")) == 5)
        _kill_supervisor(faults)

        [lost] = _json(faults, "peek")["stale"]
        assert (lost["key"], lost["revivable"]) == ("a1", True), lost
        _json(faults, "resume", "a1", "turn three")  # revives the lost child first
        [note] = _json(faults, "wait", "a1")["settled"]
        assert note["report"] == "## Summary\nafter the revive"
        models = [r.body["model"] for r in srv.requests("c1")]
        assert models == ["primary"] * 3 + ["spare"] * 3  # no second trip through the primary
        [agent] = _json(faults, "peek", "a1")["agents"]
        assert agent["role"] == "worker"
        assert agent["models"] == [f"openai/primary@{base}", f"openai/spare@{base}"]
        events = [json.loads(line) for line in faults.cli("events", "--json").stdout.splitlines()]
        [moved] = [e for e in events if e["kind"] == "models"]
        assert moved["models"] == agent["models"]
        scratch = faults.home / "sessions" / "t" / "scratch" / "a1"
        assert (scratch / "transcript.json").is_file()
        _json(faults, "stop", "a1")
        assert not scratch.exists()  # handed off: its transcript is of no further use


def test_discarding_a_lost_child_deletes_its_scratch_and_it_cannot_be_revived(faults) -> None:
    with ModelServer() as srv:
        srv.script("c1", [{"text": "## Summary\nfirst"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        _json(faults, "spawn", "--model", model, "turn one")
        _json(faults, "wait", "a1")
        _kill_supervisor(faults)
        scratch = faults.home / "sessions" / "t" / "scratch" / "a1"
        assert (scratch / "transcript.json").is_file()  # kept: a1 is lost, and revivable
        assert _json(faults, "discard", "a1")["discarded"] is True
        assert not scratch.exists()
        assert not (faults.home / "sessions" / "t" / "kept" / "a1").exists()  # nor its copy
        gone = faults.cli("revive", "a1")
        assert gone.returncode != 0
        assert _json(faults, "peek")["stale"] == []


def test_a_revive_that_cannot_happen_says_why_in_one_line(faults) -> None:
    with ModelServer() as srv:
        srv.script("c1", [{"stall": True, "text": "partial"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        _json(faults, "spawn", "--model", model, "turn one")
        _until(lambda: len(srv.requests("c1")) == 1)
        _kill_supervisor(faults)
        first = _json(faults, "peek")
        [lost] = first["stale"]
        assert (lost["state"], lost["revivable"]) == ("lost", False)
        assert "transcript" in lost["revive"]
        refused = faults.cli("revive", "a1")
        assert refused.returncode == 4
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith("fleet revive: a1: its transcript ")
        assert line.endswith(" is gone; it cannot be revived")
        unknown = faults.cli("revive", "a7")
        assert unknown.returncode == 2
        assert unknown.stderr.startswith("fleet revive: no lost child 'a7' (see the stale list")


def _git(cwd, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    result = subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, env=env, check=True
    )
    return result.stdout.strip()


def _write(text: str) -> dict[str, Any]:
    call = {"name": "write", "arguments": {"path": "src/app.py", "content": text}}
    return {"tool_calls": [call]}


def test_a_revived_worker_gets_its_worktree_and_locks_back_or_one_line_why_not(faults) -> None:
    session = faults.home / "sessions" / "t"
    with ModelServer() as srv:
        srv.script("c1", [_write("A = 1\n"), {"text": "## Summary\nwrote"}, {"stall": True}])
        srv.script("c2", [_write("B = 2\n"), {"text": "## Summary\nmine"}])
        srv.script("c3", [{"text": "## Summary\nback"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        _json(faults, "spawn", "--agent", "worker", "--model", model, "change it")
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nwrote"
        _until(lambda: b'"locks"' in (session / "journal.jsonl").read_bytes())
        _json(faults, "resume", "a1", "more")
        _until(lambda: len(srv.requests("c1")) == 3)
        _kill_supervisor(faults)
        worktree = session / "worktrees" / "a1"
        assert (worktree / "src" / "app.py").read_text() == "A = 1\n"

        # Meanwhile a new worker (a2: keys go on) takes the path a1 owned.
        model2 = f"openai:fake-model@{srv.base_url('c2')}/v1"
        spawned = _json(faults, "spawn", "--agent", "worker", "--model", model2, "mine")
        assert spawned["agents"][0]["key"] == "a2"
        _json(faults, "wait", "a2")
        taken = faults.cli("revive", "a1")
        assert taken.returncode == 4
        [line] = taken.stderr.strip().splitlines()
        app = faults.repo / "src" / "app.py"
        assert line == (
            f"fleet revive: a1: its ownership of {app} is now held by a2; stop a2 (or wait for "
            "it) and revive again"
        )
        assert _json(faults, "peek", "--locks")["locks"] == {"a2": [str(app)]}  # nothing taken
        _json(faults, "stop", "a2")

        # The worktree drifted from its snapshot: refused, and it stays as it is.
        commit = _git(worktree, "rev-parse", "HEAD")
        _git(worktree, "commit", "-q", "--allow-empty", "-m", "drift")
        drifted = faults.cli("revive", "a1")
        assert drifted.returncode == 4
        [line] = drifted.stderr.strip().splitlines()
        assert line.startswith(f"fleet revive: a1: its worktree {worktree} drifted (HEAD ")
        assert f"its snapshot was {commit[:12]}); fleet stop a1 copies its changes back" in line
        _git(worktree, "reset", "-q", "--soft", commit)

        # Back as it was: the same worktree, its change in it, its lock held again.
        srv.script("c1", [{"text": "## Summary\nback"}])
        assert _json(faults, "revive", "a1")["revived"][0]["key"] == "a1"
        assert _json(faults, "peek", "--locks")["locks"] == {"a1": [str(app)]}
        assert (worktree / "src" / "app.py").read_text() == "A = 1\n"
        _until(lambda: _json(faults, "peek", "a1")["agents"][0]["state"] == "idle")
        _json(faults, "discard", "a1")


def test_a_torn_journal_line_is_one_warning_and_resume_revives_a_lost_child(faults) -> None:
    session = faults.home / "sessions" / "t"
    with ModelServer() as srv:
        srv.script("c1", [{"text": "## Summary\nfirst"}, {"text": "## Summary\nsecond"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        _json(faults, "spawn", "--model", model, "turn one")
        _json(faults, "wait", "a1")
        _kill_supervisor(faults)
        with (session / "journal.jsonl").open("ab") as journal:
            journal.write(b'{"v": 2, "seq": 90, "at": 1, "kind": "hibernated", "key": "a1"}\n')
            journal.write(b'{"v": 1, "seq": 91, "at": 1, "kind": "sta')
        first = faults.cli("peek", "--json")
        lines = first.stderr.strip().splitlines()
        assert len(lines) == 3, lines
        assert any("are journal v2, newer than this fleet reads (v1)" in x for x in lines)
        assert any("the last line is torn (41 bytes" in x for x in lines)
        # `resume` on a lost child (named by its name here) revives it first: its context is
        # there.
        _json(faults, "resume", "scout-1", "turn two")
        [note] = _json(faults, "wait", "a1")["settled"]
        assert note["report"] == "## Summary\nsecond"
        texts = _user_texts(srv.requests("c1")[1].body)
        assert texts == ["turn one", "## Summary\nfirst", f"{RESTARTED}\nturn two"]
        assert b'"hibernated"' in (session / "journal.jsonl").read_bytes()  # kept for later
        _json(faults, "stop", "a1")


def _texts(body: dict[str, Any]) -> list[str]:
    """Every message's text, in order (Anthropic content blocks flattened)."""
    texts = []
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
        texts.append(str(content))
    return texts


@pytest.mark.needs("claude")
def test_a_revived_claude_child_resumes_its_session(faults, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_CLAUDE_BIN", str(NPM_BIN / "claude"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-scripted")
    with ModelServer() as srv:
        srv.script(
            "c1",
            [
                {"text": "## Summary\nfirst"},
                {"text": "## Summary\nsecond"},
                {"stall": True, "text": "partial"},
                {"text": "## Summary\nafter the revive"},
            ],
        )
        model = f"anthropic:claude-fake@{srv.base_url('c1')}"
        _json(faults, "spawn", "--backend", "claude", "--model", model, "turn one")
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nfirst"
        _json(faults, "resume", "a1", "turn two")
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nsecond"
        _json(faults, "resume", "a1", "turn three")
        _until(lambda: len([r for r in srv.requests("c1") if r.api]) == 3, timeout=60)
        _kill_supervisor(faults)

        [lost] = _json(faults, "peek")["stale"]
        assert (lost["state"], lost["revivable"]) == ("lost", True), lost
        events = [json.loads(x) for x in faults.cli("events", "--json").stdout.splitlines()]
        [spawn] = [e for e in events if e["kind"] == "spawn"]
        [resume] = [e for e in events if e["kind"] == "resume"]
        assert resume["seq"] == spawn["seq"] + 1  # before the first prompt was sent
        assert resume["backend"] == "claude"

        _json(faults, "resume", "a1", "turn four", timeout=120)
        [note] = _json(faults, "wait", "a1")["settled"]
        assert note["report"] == "## Summary\nafter the revive"
        last = [r for r in srv.requests("c1") if r.api][-1].body
        joined = "\n".join(_texts(last))
        for earlier in ("turn one", "## Summary\nfirst", "turn two", "## Summary\nsecond"):
            assert earlier in joined
        assert f"{RESTARTED}\nturn four" in _texts(last)[-1]
        _json(faults, "stop", "a1")


@pytest.mark.needs("pi")
def test_a_revived_pi_child_continues_its_session_file(faults, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_PI_BIN", str(NPM_BIN / "pi"))
    with ModelServer() as srv:
        srv.script(
            "c1",
            [
                {"text": "## Summary\nfirst"},
                {"text": "## Summary\nsecond"},
                {"stall": True, "text": "partial"},
                {"text": "## Summary\nafter the revive"},
            ],
        )
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        _json(faults, "spawn", "--backend", "pi", "--model", model, "turn one", timeout=90)
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nfirst"
        _json(faults, "resume", "a1", "turn two")
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nsecond"
        _json(faults, "resume", "a1", "turn three")
        _until(lambda: len([r for r in srv.requests("c1") if r.api]) == 3, timeout=60)
        _kill_supervisor(faults)

        [lost] = _json(faults, "peek")["stale"]
        assert (lost["state"], lost["revivable"]) == ("lost", True), lost
        _json(faults, "resume", "a1", "turn four", timeout=120)
        [note] = _json(faults, "wait", "a1", timeout=120)["settled"]
        assert note["report"] == "## Summary\nafter the revive"
        last = [r for r in srv.requests("c1") if r.api][-1].body
        texts = _texts(last)
        joined = "\n".join(texts)
        for earlier in ("turn one", "## Summary\nfirst", "turn two", "## Summary\nsecond"):
            assert earlier in joined
        assert f"{RESTARTED}\nturn four" in texts[-1]
        _json(faults, "stop", "a1")


def _input_texts(body: dict[str, Any]) -> list[str]:
    """Every message's text in a Responses request (Codex resends the whole history)."""
    texts = []
    for item in body.get("input") or []:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list):
            texts.append("\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict)))
    return texts


@pytest.mark.needs("codex")
def test_a_revived_codex_child_resumes_its_thread(faults, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_CODEX_BIN", str(NPM_BIN / "codex"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-scripted")
    with ModelServer() as srv:
        srv.script(
            "c1",
            [
                {"text": "## Summary\nfirst"},
                {"text": "## Summary\nsecond"},
                {"stall": True, "text": "partial"},
                {"text": "## Summary\nafter the revive"},
            ],
        )
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        _json(faults, "spawn", "--backend", "codex", "--model", model, "turn one", timeout=90)
        assert _json(faults, "wait", "a1", timeout=120)["settled"][0]["report"] == (
            "## Summary\nfirst"
        )
        _json(faults, "resume", "a1", "turn two")
        assert _json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nsecond"
        _json(faults, "resume", "a1", "turn three")
        _until(lambda: len([r for r in srv.requests("c1") if r.api]) == 3, timeout=60)
        _kill_supervisor(faults)

        [lost] = _json(faults, "peek")["stale"]
        assert (lost["state"], lost["revivable"]) == ("lost", True), lost
        events = [json.loads(x) for x in faults.cli("events", "--json").stdout.splitlines()]
        [resume] = [e for e in events if e["kind"] == "resume"]
        first_turn = next(e for e in events if e["kind"] == "settled")
        assert resume["seq"] < first_turn["seq"]  # known before the first turn ended
        _json(faults, "resume", "a1", "turn four", timeout=120)
        [note] = _json(faults, "wait", "a1", timeout=120)["settled"]
        assert note["report"] == "## Summary\nafter the revive"
        last = [r for r in srv.requests("c1") if r.api][-1].body
        joined = "\n".join(_input_texts(last))
        for earlier in ("turn one", "## Summary\nfirst", "turn two", "## Summary\nsecond"):
            assert earlier in joined
        assert f"{RESTARTED}\nturn four" in _input_texts(last)[-1]
        _json(faults, "stop", "a1")


REPORT = """
turns:
  - steps:
      - reply: "## Summary\\ndone"
"""


def test_events_follow_prints_each_record_as_it_is_written_and_a_clean_stop_loses_none(
    faults,
) -> None:
    model = faults.script("report", REPORT)
    _json(faults, "spawn", "--model", model, "one")
    _json(faults, "wait", "a1")
    env = {**os.environ, **GIT_ENV, "FLEET_HOME": str(faults.home), "FLEET_SESSION": "t"}
    argv = [sys.executable, "-m", "orchestrator", "events", "--follow", "--json"]
    with subprocess.Popen(
        argv, cwd=faults.repo, env=env, stdout=subprocess.PIPE, text=True
    ) as follower:
        try:
            assert follower.stdout is not None
            seen = [json.loads(follower.stdout.readline()) for _ in range(3)]
            assert [e["seq"] for e in seen] == [1, 2, 3]  # the journal so far, oldest first
            _json(faults, "stop", "a1")
            while True:  # then each new record as it is written
                event = json.loads(follower.stdout.readline())
                if event["kind"] == "handoff":
                    break
            assert (event["key"], event["state"]) == ("a1", "stopped")
            assert event["last"] == "## Summary\ndone"
        finally:
            follower.kill()
    stopped = faults.cli("serve", "--stop")
    assert stopped.returncode == 0, stopped.stderr
    again = faults.cli("peek", "--json")
    assert again.stderr == ""  # a clean stop leaves nothing lost
    assert json.loads(again.stdout)["stale"] == []
