"""The fleet end to end, driven through the CLI the way an LLM parent drives it.

Real supervisor daemon, real child processes, real sockets, real git repository.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
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


def _child_pid(fleet, key: str, within: float = 10.0) -> int:
    # Known by its run marker (its loadout and connection are inherited descriptors); a fork
    # of a fork server carries the server's environment and is known by its name, which it
    # takes a moment after the server has answered the spawn (under load, after the verb).
    deadline = time.monotonic() + within
    while True:
        for process in psutil.process_iter(["pid", "cmdline", "environ", "name"]):
            environ = process.info["environ"] or {}
            cmdline = process.info["cmdline"] or []
            if environ.get("FLEET_HOME") != str(fleet.home):
                continue
            if process.info["name"] == f"fleet {key}"[:15] or (
                environ.get("FLEET_RUN", "").startswith(f"t/{key}/")
                and cmdline[2:4] in (["-m", "child"], ["-m", "child._forkserver"])
            ):
                return process.pid
        if time.monotonic() > deadline:
            raise AssertionError(f"no process for {key}")
        time.sleep(0.05)


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


def test_wait_and_spawn_wait_exit_1_when_the_childs_turn_failed(fleet):
    # A model nothing listens on: the turn fails, the child stays idle with the error.
    dead = "openai:m@http://127.0.0.1:9/v1"
    result = fleet.run("spawn", "--model", dead, "--wait", "look", "--json", timeout=90)
    assert result.returncode == 1, (result.stdout, result.stderr)
    [note] = json.loads(result.stdout)["settled"]
    assert note["state"] == "idle"
    assert note["error"]
    result = fleet.run("wait", note["key"], "--timeout", "30")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "error: " in result.stdout
    fleet.json("stop", note["key"])


def test_spawn_exits_1_when_the_childs_cli_is_missing(tmp_path):
    from tests.e2e.conftest import running_fleet  # noqa: PLC0415

    with running_fleet(tmp_path, env={"FLEET_PI_BIN": str(tmp_path / "no-pi")}) as fleet:
        model = "openai:m@http://127.0.0.1:9/v1"
        result = fleet.run("spawn", "--backend", "pi", "--model", model, "look", "--json")
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert json.loads(result.stdout)["error"]["kind"] == "failed"
        [line] = result.stderr.splitlines()
        assert line.startswith("fleet spawn: backend pi: ")
        assert "no-pi is not on PATH" in line
        assert fleet.json("peek")["agents"] == []


def test_spawn_exits_1_when_a_worker_fails_at_launch(tmp_path):
    from tests.e2e.conftest import running_fleet  # noqa: PLC0415

    with running_fleet(tmp_path) as fleet:
        outside = tmp_path / "not-a-repo"
        outside.mkdir()
        model = fleet.script("fix", 'turns:\n  - steps:\n      - reply: "done"\n')
        argv = ["spawn", "--agent", "worker", "--model", model, "fix", "--json"]
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator", *argv],
            cwd=outside,
            env={**fleet.env, "FLEET_SESSION": "outside"},
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        try:
            assert result.returncode == 1, (result.stdout, result.stderr)
            data = json.loads(result.stdout)
            assert data["agents"][0]["state"] == "failed"
            assert "not a git repository" in data["agents"][0]["error"]
            [line] = result.stderr.splitlines()
            assert line.startswith("fleet spawn: a1 failed at launch: ")
        finally:
            subprocess.run(
                [sys.executable, "-m", "orchestrator", "serve", "--stop"],
                cwd=outside,
                env={**fleet.env, "FLEET_SESSION": "outside"},
                capture_output=True,
                timeout=90,
                check=False,
            )


def test_a_good_turn_after_a_failed_one_waits_with_exit_0(fleet):
    command = "sh -c 'read t; case \"$t\" in fail*) echo broke >&2; exit 3;; esac; echo fine'"
    fleet.json("spawn", "--agent", "worker", "--backend", "command", "--command", command, "fail")
    assert fleet.run("wait", "a1", "--timeout", "30").returncode == 1
    fleet.json("resume", "a1", "go")
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert (note["error"], note["report"].strip()) == ("", "fine")
    # The note is taken: a second wait reads the record, whose error is the last turn's.
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["error"] == ""
    fleet.json("stop", "a1")


def test_a_closed_pipe_ends_the_command_quietly(fleet):
    model = fleet.script("report", REPORT)

    def closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
        read, write = os.pipe()
        os.close(read)  # the reader (head -1) is gone before we write
        try:
            return subprocess.run(
                [sys.executable, "-m", "orchestrator", *args],
                cwd=fleet.repo,
                env=fleet.env,
                stdout=write,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            os.close(write)

    result = closed_pipe("spawn", "--model", model, "look")
    assert (result.returncode, result.stderr) == (141, "")
    # The spawn itself happened: the child is there and settles.
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["report"].startswith("## Summary")
    # The live view too: it ends at its first line instead of watching for nobody.
    result = closed_pipe("peek", "--watch")
    assert (result.returncode, result.stderr) == (141, "")
    fleet.json("stop", "a1")


def test_a_cli_child_reads_starting_pi_while_its_cli_boots(tmp_path):
    from tests.e2e.conftest import running_fleet  # noqa: PLC0415

    # A stand-in for Pi's slow start: its version probe takes 3 s, then it is too old to run.
    pi = tmp_path / "bin" / "pi"
    pi.parent.mkdir()
    pi.write_text("#!/bin/sh\nsleep 3\necho 0.0.1\n")
    pi.chmod(0o755)
    # Unsandboxed: the sandbox hides the test's temporary directory, where the stand-in lives.
    env = {"FLEET_PI_BIN": str(pi), "FLEET_SANDBOX": "off", "FLEET_ALLOW_UNSANDBOXED": "1"}
    with running_fleet(tmp_path, env=env) as fleet:
        fleet.json("spawn", "--backend", "pi", "--model", "openai:m@http://127.0.0.1:9/v1", "x")
        deadline, seen = time.monotonic() + 30, []
        while time.monotonic() < deadline:
            [agent] = fleet.json("peek", "a1")["agents"]
            seen.append((agent["state"], agent["activity"]))
            if agent["activity"] == "starting pi":
                break
            time.sleep(0.1)
        assert seen[-1] == ("working", "starting pi"), seen
        line = next(r for r in fleet.run("peek").stdout.splitlines() if r.startswith("a1"))
        assert line.split()[3:4] == ["working"]
        assert line.endswith("starting pi")
        result = fleet.run("wait", "a1", "--timeout", "30", "--json")
        assert result.returncode == 1
        [note] = json.loads(result.stdout)["settled"]
        assert "0.0.1" in note["error"]
        fleet.json("stop", "a1")


def test_fleet_agents_shows_the_import_warnings(fleet):
    claude = fleet.repo / ".claude" / "agents"
    claude.mkdir(parents=True)
    (claude / "differ.md").write_text(
        "---\nname: differ\ndescription: Reads diffs\ntools: Read, Bash(git diff:*)\n"
        "color: blue\n---\nRead the diff.\n"
    )
    listed = {a["name"]: a for a in fleet.json("agents", "--agent-dirs", "claude")["agents"]}
    differ = listed["differ"]
    assert differ["tools"] == ["read"]
    assert differ["path"] == str(claude / "differ.md")
    assert sorted(differ["warnings"]) == [
        (
            "dropped tool 'Bash(git diff:*)': fleet cannot enforce a restricted form, "
            "so 'Bash' is not given"
        ),
        "ignored front-matter key 'color'",
    ]
    assert listed["scout"]["warnings"] == []
    result = fleet.run("agents")
    assert result.returncode == 0
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: differ ({claude / 'differ.md'}): {w}" for w in differ["warnings"]
    ]


async def test_a_real_pi_child_reads_starting_pi_then_done(tmp_path):
    import trio  # noqa: PLC0415

    from tests.e2e.conftest import running_fleet  # noqa: PLC0415
    from tests.fakes._agent_clis import NPM_BIN  # noqa: PLC0415
    from tests.fakes.model_server import ModelServer  # noqa: PLC0415

    async with ModelServer() as srv:
        srv.script("c1", [{"text": "## Summary\nThe answer is 42."}])
        env = {"FLEET_PI_BIN": str(NPM_BIN / "pi")}
        with running_fleet(tmp_path, env=env) as fleet:
            model = f"openai:fake-model@{srv.base_url('c1')}/v1"
            spawn = ("spawn", "--backend", "pi", "--model", model, "find it")
            await trio.to_thread.run_sync(lambda: fleet.json(*spawn))
            seen: list[str] = []
            with trio.fail_after(90):
                while True:
                    peek = await trio.to_thread.run_sync(lambda: fleet.json("peek", "a1"))
                    [agent] = peek["agents"]
                    seen.append(agent["activity"])
                    if agent["state"] == "idle":
                        break
                    await trio.sleep(0.05)
            assert "starting pi" in seen, seen
            assert seen[-1] == "idle"
            text = await trio.to_thread.run_sync(lambda: fleet.run("peek").stdout)
            row = next(line for line in text.splitlines() if line.startswith("a1"))
            assert row.split()[3] == "done"
            await trio.to_thread.run_sync(lambda: fleet.json("stop", "a1"))


def test_a_repository_with_its_own_orchestrator_and_child_packages_runs_fleet_not_them(fleet):
    # The supervisor and every child start with the workspace as their cwd: Python must not
    # import the repository's own top-level packages of the same names in place of fleet's.
    for package in ("orchestrator", "child"):
        (fleet.repo / package).mkdir()
        (fleet.repo / package / "__init__.py").write_text("")
        (fleet.repo / package / "__main__.py").write_text("raise SystemExit(0)\n")
    model = fleet.script("report", REPORT)
    # Run as the installed `fleet` script is: its own directory, not the cwd, on sys.path.
    argv = [sys.executable, "-P", "-m", "orchestrator", "spawn", "--model", model, "--wait"]
    try:
        result = subprocess.run(
            [*argv, "--json", "alpha"],
            cwd=fleet.repo,
            env=fleet.env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    finally:  # the fixture's own `serve --stop` runs `python -m orchestrator` from the repo
        for package in ("orchestrator", "child"):
            shutil.rmtree(fleet.repo / package)
    assert result.returncode == 0, result.stderr
    [note] = json.loads(result.stdout)["settled"]
    assert note["report"].startswith("## Summary\nalpha -> ")


def test_spawn_role_runs_the_project_role_and_falls_back_on_a_429(fleet):
    from tests.fakes.model_server import ModelServer  # noqa: PLC0415

    with ModelServer() as srv:
        base = f"{srv.base_url('c1')}/v1"
        # The global role points nowhere; the project's wins per role.
        (fleet.home / "roles.yaml").write_text("roles: {worker: openai/m@http://127.0.0.1:9/v1}\n")
        (fleet.repo / ".fleet").mkdir(exist_ok=True)
        (fleet.repo / ".fleet" / "roles.yaml").write_text(
            f"roles:\n  worker:\n    model: openai/primary@{base}\n"
            f"    fallbacks: [openai/spare@{base}]\n"
        )
        srv.script("c1", [{"status": 429, "body": "slow down"}] * 3 + [{"text": "spared"}])
        result = fleet.run("spawn", "--role", "worker", "--wait", "go", "--json", timeout=90)
        assert result.returncode == 0, (result.stdout, result.stderr)
        [note] = json.loads(result.stdout)["settled"]
        [agent] = fleet.json("peek", note["key"])["agents"]
        handoff = fleet.json("stop", note["key"])
        models = [r.body["model"] for r in srv.requests("c1") if r.api is not None]
    assert note["report"] == "spared"
    assert models == ["primary"] * 3 + ["spare"]
    assert agent["models"] == [f"openai/primary@{base}", f"openai/spare@{base}"]
    assert json.dumps(handoff).count("openai/spare@") == 1
    bad = fleet.run("spawn", "--role", "nope", "x")
    assert bad.returncode == 2
    assert "no model role 'nope' is configured (known: worker)" in bad.stderr
