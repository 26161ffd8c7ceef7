"""Hibernation: idle children give their processes up, keep their context, and wake for a prompt.

Real builtin children against the loopback scripted model server, under a real supervisor with
``hibernate_after_s: 0`` and a live cap of 4: forty children each answer a first task and
hibernate (no process left), each is then asked a follow-up question, and each answers with its
own conversation (the model server sees each child's first turn in its second request). A
real Pi child, a real Claude Code child and a real Codex child, driven through the ``fleet``
CLI, hibernate and wake with their sessions (Codex resumes its thread).
"""

import contextlib
import json
import os
import re
import signal
import time
from typing import Any

import psutil
import pytest
import trio

import ipc
from orchestrator._errors import CapacityError, UsageError
from orchestrator._records import State
from orchestrator.core._supervisor import SpawnRequest, Supervisor, open_supervisor
from tests.fakes._agent_clis import NPM_BIN
from tests.fakes.model_server import ModelServer
from tests.faults.conftest import Faults, running

pytestmark = pytest.mark.slow

CHILDREN = 40
CAP = 4


def _texts(body: dict[str, object]) -> list[str]:
    messages = body["messages"]
    assert isinstance(messages, list)
    return [m["content"] for m in messages if m["role"] in {"user", "assistant"}]


async def _all_hibernated(sup: Supervisor, keys: list[str]) -> None:
    records = [sup.registry.records[key] for key in keys]
    await Faults.until(lambda: all(r.state is State.HIBERNATED for r in records))


async def test_forty_children_hibernate_and_each_answers_with_its_own_context(faults) -> None:
    async with ModelServer() as srv:
        for i in range(CHILDREN):
            srv.script(f"c{i}", [{"text": f"first {i}"}, {"text": f"answer {i}"}])
        config = faults.config(max_subagents=CAP, hibernate_after_s=0, lane=CAP)
        pids: list[int] = []
        keys: list[str] = []
        with trio.fail_after(90):
            async with open_supervisor(config) as sup:
                for batch in range(CHILDREN // CAP):
                    records = await sup.spawn(
                        [
                            SpawnRequest(
                                task=f"task {i}",
                                model=f"openai:fake-model@{srv.base_url(f'c{i}')}/v1",
                            )
                            for i in range(batch * CAP, (batch + 1) * CAP)
                        ]
                    )
                    batch_keys = [r.key for r in records]
                    pids += [sup.runs[key].launched.pid for key in batch_keys]  # type: ignore[union-attr]
                    keys += batch_keys
                    await _all_hibernated(sup, batch_keys)
                # No child process is left while they sleep; none counts against the cap.
                assert running(pids) == []
                peek = sup.peek()
                assert [a["state"] for a in peek["agents"]] == ["hibernated"] * CHILDREN
                assert (sup.capacity.used, sup.capacity.hibernated) == (0, CHILDREN)
                answers: dict[str, str] = {}

                async def ask(index: int, key: str) -> None:
                    answers[key] = await sup.ask(key, f"what was task {index}?")

                async with trio.open_nursery() as nursery:
                    for index, key in enumerate(keys):
                        nursery.start_soon(ask, index, key)
                assert answers == {key: f"answer {i}" for i, key in enumerate(keys)}
                await _all_hibernated(sup, keys)
                for key in keys:  # woken and asleep again: no process of any child is left
                    with pytest.raises(AssertionError, match="no process"):
                        faults.child_process(key)
                handoffs = await sup.stop(keys)
                assert [h["state"] for h in handoffs] == ["stopped"] * CHILDREN
                assert sup.registry.records == {}
                assert (sup.capacity.used, sup.capacity.hibernated) == (0, 0)
        for i in range(CHILDREN):
            first, second = srv.requests(f"c{i}")
            assert _texts(first.body) == [f"task {i}"]
            texts = _texts(second.body)
            assert texts[:2] == [f"task {i}", f"first {i}"], texts
            assert texts[-1].endswith(f"what was task {i}?")
    assert faults.processes() == []


async def test_a_prompt_wakes_a_hibernated_child_and_max_retained_bounds_spawns(faults) -> None:
    async with ModelServer() as srv:
        srv.script("c1", [{"text": "first"}, {"text": "second"}])
        srv.script("c2", [{"text": "other"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        config = faults.config(max_subagents=2, hibernate_after_s=0, max_retained=1)
        with trio.fail_after(60):
            async with open_supervisor(config) as sup:
                [record] = await sup.spawn([SpawnRequest(task="one", model=model, name="m")])
                await _all_hibernated(sup, [record.key])
                assert (await sup.wait([record.key]))[0]["report"] == "first"
                # Live and hibernated together are bounded by max_retained (here the cap, 2).
                other = f"openai:fake-model@{srv.base_url('c2')}/v1"
                with pytest.raises(CapacityError, match="max_retained 2"):
                    await sup.spawn([SpawnRequest(task="x", model=other)] * 2)
                with pytest.raises(UsageError, match="hibernated, not working"):
                    await sup.steer("m", "faster")
                with pytest.raises(UsageError, match="fleet resume or fleet ask wakes it"):
                    await sup.pause("m")
                await sup.prompt("m", "two")  # queued: it wakes in the background
                assert record.state is State.WORKING
                assert record.queued
                notes = await sup.wait([record.key])
                assert notes[0]["report"] == "second"
                await _all_hibernated(sup, [record.key])
                scratch = config.paths.scratch / record.key
                assert (scratch / "transcript.json").is_file()  # kept while it may wake
                [handoff] = await sup.stop(["m"])
                assert handoff["state"] == "stopped"
                assert not scratch.exists()  # handed off asleep: its transcript goes too
                assert sup.registry.records == {}
                assert sup.capacity.hibernated == 0
        second = srv.requests("c1")[1].body
        assert _texts(second)[:2] == ["one", "first"]
    assert faults.processes() == []


async def test_a_woken_child_gets_a_fresh_token_and_its_old_one_opens_nothing(faults) -> None:
    """A token is good for one launch: whatever kept the sleeping child's (a leaked loadout,
    a log line) cannot speak for the child woken in its place (issue 36)."""
    async with ModelServer() as srv:
        srv.script("c1", [{"text": "first"}, {"text": "second"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        config = faults.config(hibernate_after_s=0, reject_log=True)
        with trio.fail_after(60):
            async with open_supervisor(config) as sup:
                [record] = await sup.spawn([SpawnRequest(task="one", model=model)])
                old = sup.runs[record.key].token
                await _all_hibernated(sup, [record.key])
                assert (await sup.wait([record.key]))[0]["report"] == "first"
                await sup.prompt(record.key, "two")  # wakes it: a launch of its own
                [note] = await sup.wait([record.key])
                assert note["report"] == "second"
                new = sup.runs[record.key].token
                assert new != old
                assert sup.secrets.scrub(f"{old} {new}") == "[redacted] [redacted]"
                refused = sup.refusals.total
                with pytest.raises(ipc.HandshakeError):
                    await ipc.open_client(
                        config.paths.ipc_socket,
                        owner=record.key,
                        token=old,
                        hello=ipc.Hello(pid=os.getpid()),
                    )
                await Faults.until(lambda: sup.refusals.total == refused + 1)
                await sup.stop([record.key])
    assert faults.processes() == []


async def test_a_prompt_and_an_ask_while_it_falls_asleep_wake_it_again(faults) -> None:
    async with ModelServer() as srv:
        srv.script("c1", [{"text": "first"}, {"text": "second"}, {"text": "answer"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        with trio.fail_after(60):
            async with open_supervisor(faults.config()) as sup:  # hibernates only when told
                [record] = await sup.spawn([SpawnRequest(task="one", model=model)])
                assert (await sup.wait([record.key]))[0]["report"] == "first"
                run = sup.runs[record.key]
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sup.hibernation.hibernate, run)
                    await Faults.until(lambda: run.finishing)
                    assert sup.hibernation.asleep(record.key)  # shutting down, not yet asleep
                    await sup.prompt(record.key, "two")
                assert (await sup.wait([record.key]))[0]["report"] == "second"
                assert sup.runs[record.key] is not run
                await Faults.until(lambda: record.state is State.IDLE)
                run = sup.runs[record.key]
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sup.hibernation.hibernate, run)
                    await Faults.until(lambda: run.finishing)
                    answer = await sup.ask(record.key, "and now?")
                assert answer == "answer"
                assert sup.runs[record.key] is not run
                await sup.stop([record.key])
        assert len(srv.requests("c1")) == 3
    assert faults.processes() == []


VOTE = {
    "complexity": "super-complex",
    "justification": "Two fixes each broke the other; the scouts should weigh in.",
    "issue": "Replayed requests run twice after a reconnect.",
    "failed_approaches": [
        {"approach": "A bigger replay cache", "evidence": "Duplicate in run 41."},
        {"approach": "Per-owner locks", "evidence": "test_reconnect deadlocks."},
    ],
    "options": [
        {"id": "A", "title": "Persist the cache", "tradeoffs": "A disk write per request."},
        {"id": "B", "title": "Idempotency keys", "tradeoffs": "A protocol change."},
    ],
}


async def test_a_hibernated_scout_wakes_for_its_ballot(faults) -> None:
    # The scripted model's cursor lives in its process: a woken scout plays its first turn
    # again, so that turn is the ballot (its spawn task gets it with no nonce in it).
    ballot = "turns:\n  - steps:\n      - reply: BALLOT {{nonce}} A the log says so\n"
    model = faults.script("ballot", ballot)
    with trio.fail_after(60):
        async with open_supervisor(faults.config(hibernate_after_s=0)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="warm up", model=model)])
            await sup.wait([record.key])
            await _all_hibernated(sup, [record.key])
            outcome = await sup.democracy.vote(
                VOTE, agents=[record.key], voters=2, model=model, deadline=30
            )
            statuses = {b.voter: (b.status, b.option) for b in outcome.ballots}
            assert statuses[record.key] == ("valid", "A")
            assert (outcome.status, outcome.winner) == ("winner", "A")
            await _all_hibernated(sup, [record.key])  # asleep again after its ballot
            await sup.stop([record.key])
    assert faults.processes() == []


def _cli_json(faults, *args: str, timeout: float = 60) -> dict[str, Any]:
    result = faults.cli(*args, "--json", timeout=timeout)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _until(check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _runs_of(faults, key: str) -> list[int]:
    """Every process of *key*'s run: its fork (named for it) and its agent CLI (which names
    its scratch directory)."""
    pids = []
    for process in faults.processes():
        with contextlib.suppress(psutil.Error):
            mine = f"/scratch/{key}/" in " ".join(process.info["cmdline"] or [])
            if mine or process.name() == f"fleet {key}"[:15]:
                pids.append(process.pid)
    return pids


@pytest.mark.needs("pi")
def test_a_pi_child_hibernates_and_wakes_with_its_session(faults, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_PI_BIN", str(NPM_BIN / "pi"))
    (faults.home / "config.yaml").write_text("subagents:\n  hibernate_after_s: 0\n")
    with ModelServer() as srv:
        # The first answer waits until the test has seen the child and its pi at work: with no
        # idle time before hibernation, a fixed delay was a race the loaded CI machine lost.
        srv.script("c1", [{"hold": True, "text": "## Summary\nfirst"}, {"text": "it was turn one"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        _cli_json(faults, "spawn", "--backend", "pi", "--model", model, "turn one", timeout=90)
        try:
            _until(lambda: len(_runs_of(faults, "a1")) >= 2)  # the child and its pi, working
        finally:
            srv.release()
        assert _cli_json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nfirst"
        _until(lambda: _cli_json(faults, "peek", "a1")["agents"][0]["state"] == "hibernated")
        assert _runs_of(faults, "a1") == []  # no process of it is left while it sleeps
        answer = _cli_json(faults, "ask", "a1", "what was the first turn?", timeout=120)
        assert answer["answer"] == "it was turn one"
        texts = [str(m.get("content")) for m in srv.requests("c1")[-1].body["messages"]]
        joined = "\n".join(texts)
        for earlier in ("turn one", "## Summary\nfirst"):
            assert earlier in joined
        assert "what was the first turn?" in texts[-1]
        _until(lambda: _cli_json(faults, "peek", "a1")["agents"][0]["state"] == "hibernated")
        events = [json.loads(x) for x in faults.cli("events", "--json").stdout.splitlines()]
        kinds = [e["kind"] for e in events if e["key"] == "a1"]
        assert kinds.count("hibernate") == 2, kinds
        assert kinds.count("wake") == 1, kinds
        assert _cli_json(faults, "stop", "a1")["handoffs"][0]["state"] == "stopped"


def test_a_supervisor_that_dies_with_hibernated_children_leaves_them_revivable(faults) -> None:
    (faults.home / "config.yaml").write_text("subagents:\n  hibernate_after_s: 0\n")
    with ModelServer() as srv:
        srv.script("c1", [{"text": "first"}, {"text": "after the revive"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        _cli_json(faults, "spawn", "--model", model, "--name", "mapper", "turn one")
        assert _cli_json(faults, "wait", "a1")["settled"][0]["report"] == "first"
        _until(lambda: _cli_json(faults, "peek", "a1")["agents"][0]["state"] == "hibernated")
        human = faults.cli("peek")
        assert re.search(r"\na1\s+mapper\s+scout\s+hibernated\s", human.stdout), human.stdout
        session = faults.home / "sessions" / "t"
        os.kill(int((session / "supervisor.lock").read_text().strip()), signal.SIGKILL)
        _until(lambda: faults.processes() == [], timeout=15)
        [lost] = _cli_json(faults, "peek")["stale"]
        assert (lost["key"], lost["state"], lost["revivable"]) == ("a1", "lost", True)
        events = [json.loads(x) for x in faults.cli("events", "--json").stdout.splitlines()]
        [hibernated] = [e for e in events if e["kind"] == "hibernate"]
        [was] = [e["was"] for e in events if e["kind"] == "lost"]
        assert (hibernated["state"], was) == ("hibernated", "hibernated")
        _cli_json(faults, "resume", "a1", "turn two")  # revives the lost child first
        assert _cli_json(faults, "wait", "a1")["settled"][0]["report"] == "after the revive"
        texts = [str(m.get("content")) for m in srv.requests("c1")[-1].body["messages"]]
        assert texts[1:3] == ["turn one", "first"], texts
        _cli_json(faults, "stop", "a1")


@pytest.mark.needs("claude")
def test_a_claude_child_hibernates_and_wakes_with_its_session(faults, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_CLAUDE_BIN", str(NPM_BIN / "claude"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-scripted")
    (faults.home / "config.yaml").write_text("subagents:\n  hibernate_after_s: 0\n")
    with ModelServer() as srv:
        srv.script("c1", [{"text": "## Summary\nfirst"}, {"text": "## Summary\nsecond"}])
        model = f"anthropic:claude-fake@{srv.base_url('c1')}"
        _cli_json(faults, "spawn", "--backend", "claude", "--model", model, "turn one")
        assert _cli_json(faults, "wait", "a1")["settled"][0]["report"] == "## Summary\nfirst"
        _until(lambda: _cli_json(faults, "peek", "a1")["agents"][0]["state"] == "hibernated")
        assert _runs_of(faults, "a1") == []
        _cli_json(faults, "resume", "a1", "turn two", timeout=120)
        [note] = _cli_json(faults, "wait", "a1", timeout=120)["settled"]
        assert note["report"] == "## Summary\nsecond"
        last = [r for r in srv.requests("c1") if r.api][-1].body
        joined = "\n".join(_anthropic_texts(last))
        for earlier in ("turn one", "## Summary\nfirst", "turn two"):
            assert earlier in joined
        _cli_json(faults, "stop", "a1")


@pytest.mark.needs("codex")
def test_a_codex_child_hibernates_and_wakes_with_its_thread(faults, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_CODEX_BIN", str(NPM_BIN / "codex"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-scripted")
    (faults.home / "config.yaml").write_text("subagents:\n  hibernate_after_s: 0\n")
    with ModelServer() as srv:
        srv.script("c1", [{"text": "## Summary\nfirst"}, {"text": "## Summary\nsecond"}])
        model = f"openai:fake-model@{srv.base_url('c1')}/v1"
        _cli_json(faults, "spawn", "--backend", "codex", "--model", model, "turn one", timeout=90)
        [first] = _cli_json(faults, "wait", "a1", timeout=120)["settled"]
        assert first["report"] == "## Summary\nfirst"
        _until(lambda: _cli_json(faults, "peek", "a1")["agents"][0]["state"] == "hibernated")
        assert _runs_of(faults, "a1") == []  # neither the child nor its codex app-server
        _cli_json(faults, "resume", "a1", "turn two", timeout=120)
        [note] = _cli_json(faults, "wait", "a1", timeout=120)["settled"]
        assert note["report"] == "## Summary\nsecond"
        last = [r for r in srv.requests("c1") if r.api][-1].body
        joined = "\n".join(_responses_texts(last))
        for earlier in ("turn one", "## Summary\nfirst", "turn two"):
            assert earlier in joined  # the woken Codex resumed its thread, not a fresh one
        events = [json.loads(x) for x in faults.cli("events", "--json").stdout.splitlines()]
        resumes = {e["id"] for e in events if e["kind"] == "resume" and e["key"] == "a1"}
        assert len(resumes) == 1, resumes  # the same thread id before and after the wake
        scratch = faults.home / "sessions" / "t" / "scratch" / "a1"
        assert (scratch / "codex").is_dir()  # its CODEX_HOME, kept while it may wake
        _cli_json(faults, "stop", "a1")
        assert not scratch.exists()  # handed off: nothing can resume it, its store goes


def _responses_texts(body: dict[str, Any]) -> list[str]:
    """Every message's text in a Responses request (Codex resends the whole history)."""
    texts = []
    for item in body.get("input") or []:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list):
            texts.append("\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict)))
    return texts


def _anthropic_texts(body: dict[str, Any]) -> list[str]:
    texts = []
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
        texts.append(str(content))
    return texts
