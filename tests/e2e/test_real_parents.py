"""Five real parents delegate real work through what ``fleet install <parent>`` wrote.

For Claude Code, Codex, Gemini CLI, opencode and Pi: a git repository with a failing test; the
parent CLI runs against a loopback *parent model* (:class:`tests.fakes.parent_model.ParentModel`)
that reads the tools the CLI offers and calls fleet's by name. Two scripted scouts map the code
in parallel, a scripted worker fixes the bug and runs the test with its shell inside its
sandbox, the parent stops it (the change lands in its checkout) and reads the diff, and then the
test passes in the parent's checkout; nothing fleet started is left running once the parent
exits (the supervisor its MCP server started ends after a short grace). Each parent runs once
with a model that fills every field and once with the minimal call.
"""

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from tests.e2e.conftest import GIT_ENV, Fleet, fleet_processes, running_fleet
from tests.fakes._agent_clis import (
    NPM_BIN,
    CliCommand,
    claude_command,
    codex_command,
    gemini_command,
    open_cli,
    opencode_command,
    pi_command,
)
from tests.fakes.model_server import ModelServer
from tests.fakes.parent_model import WAIT_FOR_SERVERS, ParentModel, fleet_tool

pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]

CEILING = 300
#: How long the supervisor may outlive its parent when it holds no child (generous: 2 cores).
GRACE = 60
PROMPT = "test_calc.py fails: map the code with two scouts, have a worker fix it, land the fix"

CALC = "def add(a, b):\n    return a - b\n"
TEST = (
    "import sys\n\nsys.path.insert(0, 'src')\nfrom calc import add\n\n"
    "assert add(2, 3) == 5, add(2, 3)\nprint('TESTS OK')\n"
)
SCOUT_SRC = """
turns:
  - steps:
      - tool: read
        args: {path: src/calc.py}
      - reply: "## Summary\\nadd() lives in src/calc.py and subtracts"
"""
SCOUT_TESTS = """
turns:
  - steps:
      - tool: read
        args: {path: test_calc.py}
      - reply: "## Summary\\ntest_calc.py asserts add(2, 3) == 5"
"""
WORKER = """
turns:
  - steps:
      - tool: bash
        args: {command: "python3 -B test_calc.py; echo rc=$?"}
      - tool: edit
        args: {path: src/calc.py, old_text: "a - b", new_text: "a + b"}
      - tool: bash
        args: {command: "python3 -B test_calc.py && echo rc=$?"}
      - reply: "## Summary\\nfixed add\\n## Verification\\n{{tool:bash}}"
"""


def _repo(fleet: Fleet) -> None:
    (fleet.repo / "src" / "calc.py").write_text(CALC)
    (fleet.repo / "test_calc.py").write_text(TEST)
    env = {**os.environ, **GIT_ENV}
    for argv in (["git", "add", "-A"], ["git", "commit", "-qm", "calc"]):
        subprocess.run(argv, cwd=fleet.repo, env=env, check=True, capture_output=True)
    failing = _run_test(fleet.repo)
    assert failing.returncode != 0, failing.stdout


def _run_test(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-B", "test_calc.py"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _parent_model(fleet: Fleet) -> ParentModel:
    scouts = [
        {
            "task": "map src/: where is add() and what does it do?",
            "agent": "scout",
            "name": "src-map",
            "model": fleet.script("scout-src", SCOUT_SRC),
        },
        {
            "task": "map the tests: what does test_calc.py expect?",
            "agent": "scout",
            "name": "test-map",
            "model": fleet.script("scout-tests", SCOUT_TESTS),
        },
    ]
    worker = {
        "task": "fix add() in src/calc.py so test_calc.py passes; run python3 test_calc.py",
        "agent": "worker",
        "name": "fixer",
        "model": fleet.script("worker", WORKER),
    }
    # Both argument shapes in one run: every field the schema offers, and the fewest that do
    # the job, alternating verb by verb (tests/fakes/parent_model.py).
    return ParentModel(scouts=scouts, worker=worker, shape="both")


def _tree(repo: Path) -> dict[str, bytes]:
    """Every file of the checkout but git's own and the landed fix, with its bytes."""
    return {
        str(p.relative_to(repo)): p.read_bytes()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(repo).parts and p.name != "calc.py"
    }


def _install(fleet: Fleet, parent: str, env: dict[str, str], verb: str = "install") -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", verb, parent, "--project"],
        cwd=fleet.repo,
        env={**fleet.env, "HOME": env["HOME"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def fleet_env(fleet: Fleet) -> dict[str, str]:
    env = {k: v for k, v in fleet.env.items() if k.startswith(("FLEET_", "GIT_"))}
    env.pop("FLEET_IDLE_EXIT_S", None)
    return env


def _run(command: CliCommand, fleet: Fleet, log: Path) -> None:
    env = {**command.env, **fleet_env(fleet)}
    with log.open("wb") as err:
        result = subprocess.run(
            list(command.argv),
            cwd=command.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            timeout=CEILING,
            check=False,
        )
    log.with_suffix(".out").write_bytes(result.stdout)
    assert result.returncode == 0, (result.stdout[-3000:], log.read_text()[-3000:])


def _claude(fleet: Fleet, srv: ModelServer, state: Path) -> CliCommand:
    base = claude_command(base_url=srv.base_url("parent"), workspace=fleet.repo, state_dir=state)
    _install(fleet, "claude", dict(base.env))
    argv = [str(NPM_BIN / "claude"), "-p", "--output-format", "json"]
    argv += ["--no-session-persistence", PROMPT]
    return CliCommand(argv=tuple(argv), env=base.env, cwd=fleet.repo)


def _codex(fleet: Fleet, srv: ModelServer, state: Path) -> CliCommand:
    command = codex_command(
        base_url=srv.base_url("parent"), workspace=fleet.repo, state_dir=state, prompt=PROMPT
    )
    _install(fleet, "codex", dict(command.env))
    # What the install's note says: codex reads a project's .codex/ only once it is trusted.
    config = Path(command.env["CODEX_HOME"]) / "config.toml"
    config.write_text(
        config.read_text() + f'\n[projects."{fleet.repo}"]\ntrust_level = "trusted"\n'
    )
    return command


def _gemini(fleet: Fleet, srv: ModelServer, state: Path) -> CliCommand:
    command = gemini_command(
        base_url=srv.base_url("parent"), workspace=fleet.repo, state_dir=state, prompt=PROMPT
    )
    _install(fleet, "gemini", dict(command.env))
    # What the install's note says: trust the folder (what gemini's trust dialog writes);
    # --skip-trust alone runs headless but does not load the project's settings.
    trusted = Path(command.env["HOME"]) / ".gemini" / "trustedFolders.json"
    trusted.write_text(json.dumps({str(fleet.repo): "TRUST_FOLDER"}))
    return command


def _opencode(fleet: Fleet, srv: ModelServer, state: Path) -> CliCommand:
    command = opencode_command(
        base_url=srv.base_url("parent"), workspace=fleet.repo, state_dir=state, prompt=PROMPT
    )
    _install(fleet, "opencode", dict(command.env))
    return command


PARENTS = {"claude": _claude, "codex": _codex, "gemini": _gemini, "opencode": _opencode}


def pi_parent(fleet: Fleet, srv: ModelServer, state: Path, tools: str) -> CliCommand:
    """``pi --mode rpc`` on what ``fleet install pi --project`` wrote, offering *tools*."""
    base = pi_command(base_url=srv.base_url("parent"), workspace=fleet.repo, state_dir=state)
    _install(fleet, "pi", dict(base.env))
    # Discovery on (no --no-extensions): Pi finds .pi/extensions/fleet by itself.
    argv = [a for a in base.argv if a != "--no-extensions"]
    argv[argv.index("--tools") + 1] = tools
    env = {**base.env, **fleet_env(fleet)}
    return CliCommand(argv=tuple(argv), env=env, cwd=fleet.repo)


def _check(fleet: Fleet, model: ParentModel, srv: ModelServer) -> None:
    """The work was done, reviewed and landed; nothing is left running."""
    assert len(model.result("spawn")) == 3, model.results  # one call a child
    # Both shapes reached fleet through the parent: a spawn with every field, one with the fewest.
    spawns = [arguments for name, arguments in model.calls if name.endswith("spawn")]
    assert sorted("budget" in a for a in spawns) == [False, True, True], spawns
    stopped = model.result("stop")
    assert stopped, model.results
    [handoff] = stopped[0]["handoffs"]
    assert handoff["state"] == "stopped", handoff
    assert not handoff.get("applied"), handoff  # held: nothing landed before the review
    reports = {s["key"]: s.get("report", "") for w in model.result("wait") for s in w["settled"]}
    assert len(reports) == 3, model.results  # both scouts and the worker
    worker_report = reports[handoff["key"]]
    assert "TESTS OK" in worker_report  # the worker ran the test in its sandbox, after the fix
    assert "a + b" in str(model.result("review")[0])
    [applied] = model.result("apply")
    assert "src/calc.py" in str(applied), applied
    assert [r for r in srv.requests("parent") if r.api is not None]
    passing = _run_test(fleet.repo)
    assert passing.returncode == 0, passing.stderr
    assert "TESTS OK" in passing.stdout
    _nothing_left(fleet)


def _nothing_left(fleet: Fleet) -> None:
    """The parent's MCP server, every child and the supervisor it started are gone."""
    deadline = time.monotonic() + GRACE
    while fleet_processes(fleet.home) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [" ".join(p.cmdline()) for p in fleet_processes(fleet.home)]
    assert not left, left


@pytest.mark.parametrize(
    "parent", [pytest.param(p, marks=pytest.mark.needs(p)) for p in sorted(PARENTS)]
)
def test_a_real_parent_delegates_scouts_and_a_worker_and_lands_the_fix(
    tmp_path: Path, parent: str
) -> None:
    with running_fleet(tmp_path, prefix=f"frp{parent[:2]}-") as fleet, ModelServer() as srv:
        _repo(fleet)
        before = _tree(fleet.repo)
        model = _parent_model(fleet)
        srv.play("parent", model)
        command = PARENTS[parent](fleet, srv, tmp_path / parent)
        _run(command, fleet, tmp_path / f"{parent}.err")
        # Uninstall restores every byte, also after the parent ran on what install wrote.
        _install(fleet, parent, dict(command.env), "uninstall")
        assert _tree(fleet.repo) == before
        offered = [r.tool_names() for r in srv.requests("parent") if r.api is not None]
        assert model.calls, f"the parent model was never offered fleet's tools: {offered}"
        _check(fleet, model, srv)


@pytest.mark.needs("pi")
async def test_a_real_pi_parent_delegates_scouts_and_a_worker_and_lands_the_fix(
    tmp_path: Path,
) -> None:
    with running_fleet(tmp_path, prefix="frppi-") as fleet:
        _repo(fleet)
        async with ModelServer() as srv:
            model = _parent_model(fleet)
            srv.play("parent", model)
            tools = "read," + ",".join(
                f"fleet_{v}" for v in ("spawn", "wait", "stop", "review", "apply")
            )
            command = pi_parent(fleet, srv, tmp_path / "pi", tools)
            with trio.fail_after(CEILING):
                async with open_cli(command, tmp_path / "pi.stderr") as pi:
                    await pi.send({"type": "prompt", "id": "p1", "message": PROMPT})
                    while not model.answered:
                        await pi.until(lambda e: e.get("type") == "agent_end")
                    assert await pi.finish() == 0
            _check(fleet, model, srv)


@attrs.define(eq=False)
class ErrorProbe:
    """A parent model that makes two mistakes and keeps what each tool result said."""

    scout: str  # a scripted scout's model
    said: list[str] = attrs.field(factory=list)
    _step: int = 0

    def __call__(self, request: Any) -> dict[str, Any]:
        names = request.tool_names()
        if fleet_tool(names, "spawn") is None:
            if WAIT_FOR_SERVERS in names and self._step == 0:
                return {"tool_calls": [{"name": WAIT_FOR_SERVERS, "arguments": {}}]}
            return {"text": "fleet parent"}
        if self._step > 0:
            self.said.append(request.tool_results()[-1])
        self._step += 1
        if self._step == 1:  # a misspelt argument the schema forbids
            arguments = {"task": "look", "model": self.scout, "budjet": 5}
            return {"tool_calls": [{"name": fleet_tool(names, "spawn"), "arguments": arguments}]}
        if self._step == 2:  # a call the schema allows that fails: no such child
            arguments = {"agents": ["a99"]}
            return {"tool_calls": [{"name": fleet_tool(names, "stop"), "arguments": arguments}]}
        return {"text": "done"}


@pytest.mark.parametrize(
    "parent", [pytest.param(p, marks=pytest.mark.needs(p)) for p in sorted(PARENTS)]
)
def test_every_real_parent_reads_fleets_errors_and_an_unknown_argument_is_refused(
    tmp_path: Path, parent: str
) -> None:
    with running_fleet(tmp_path, prefix=f"fre{parent[:2]}-") as fleet, ModelServer() as srv:
        probe = ErrorProbe(scout=fleet.script("scout", SCOUT_SRC))
        srv.play("parent", probe)
        command = PARENTS[parent](fleet, srv, tmp_path / parent)
        _run(command, fleet, tmp_path / f"{parent}.err")
        assert len(probe.said) == 2, probe.said
        unknown, missing = probe.said
        for text in probe.said:
            assert "-32602" not in text
            assert "does not match" not in text
        if parent == "gemini":  # Gemini CLI checks the schema itself and never calls fleet
            assert "must NOT have additional properties" in unknown, unknown
        else:
            assert "budjet" in unknown, unknown
        assert fleet.json("peek")["agents"] == []  # refused before anything launched
        assert "a99" in missing


def _install_user(fleet: Fleet, parent: str, env: dict[str, str]) -> None:
    names = ("HOME", "CODEX_HOME", "PI_CODING_AGENT_DIR")
    merged: dict[str, str] = dict(fleet.env)
    merged.update({k: env[k] for k in names if k in env})
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "install", parent, "--user"],
        cwd=fleet.repo,
        env=merged,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def _user_claude(srv: ModelServer, fleet: Fleet, state: Path) -> CliCommand:
    base = claude_command(base_url=srv.base_url("parent"), workspace=fleet.repo, state_dir=state)
    argv = (str(NPM_BIN / "claude"), "-p", "--no-session-persistence", PROMPT)
    return CliCommand(argv=argv, env=base.env, cwd=fleet.repo)


def _user_codex(srv: ModelServer, fleet: Fleet, state: Path) -> CliCommand:
    url = srv.base_url("parent")
    return codex_command(base_url=url, workspace=fleet.repo, state_dir=state, prompt=PROMPT)


def _user_gemini(srv: ModelServer, fleet: Fleet, state: Path) -> CliCommand:
    url = srv.base_url("parent")
    return gemini_command(base_url=url, workspace=fleet.repo, state_dir=state, prompt=PROMPT)


def _user_opencode(srv: ModelServer, fleet: Fleet, state: Path) -> CliCommand:
    url = srv.base_url("parent")
    return opencode_command(base_url=url, workspace=fleet.repo, state_dir=state, prompt=PROMPT)


USER_COMMANDS: dict[str, Callable[[ModelServer, Fleet, Path], CliCommand]] = {
    "claude": _user_claude,
    "codex": _user_codex,
    "gemini": _user_gemini,
    "opencode": _user_opencode,
}


@pytest.mark.parametrize(
    "parent", [pytest.param(p, marks=pytest.mark.needs(p)) for p in sorted(USER_COMMANDS)]
)
def test_a_user_install_gives_the_real_parent_fleets_tools_in_any_project(
    tmp_path: Path, parent: str
) -> None:
    """``--user`` writes the parent's own configuration (a private HOME here); the parent
    then offers fleet's tools in a project that has no fleet file (gemini: --skip-trust)."""
    with running_fleet(tmp_path, prefix=f"fru{parent[:2]}-") as fleet, ModelServer() as srv:
        offered: list[list[str]] = []

        def player(request: Any) -> dict[str, Any]:
            names = request.tool_names()
            waiting = fleet_tool(names, "spawn") is None and WAIT_FOR_SERVERS in names
            if waiting and len(offered) < 5:  # a loaded machine: the server is still starting
                offered.append(names)
                return {"tool_calls": [{"name": WAIT_FOR_SERVERS, "arguments": {}}]}
            offered.append(names)
            return {"text": "nothing to delegate"}

        srv.play("parent", player)
        command = USER_COMMANDS[parent](srv, fleet, tmp_path / parent)
        _install_user(fleet, parent, dict(command.env))
        _run(command, fleet, tmp_path / f"{parent}.err")
        assert any(fleet_tool(names, "spawn") for names in offered), offered
        assert not [p for p in fleet.repo.iterdir() if p.name not in {".git", "README.md", "src"}]
        _nothing_left(fleet)


@pytest.mark.needs("pi")
async def test_a_user_install_gives_a_real_pi_parent_fleets_tools_in_any_project(
    tmp_path: Path,
) -> None:
    """``fleet install pi --user`` writes into Pi's agent directory (``PI_CODING_AGENT_DIR``);
    Pi discovers the extension in a project without any fleet file."""
    with running_fleet(tmp_path, prefix="frupi-") as fleet:
        async with ModelServer() as srv:
            offered: list[list[str]] = []

            def player(request: Any) -> dict[str, Any]:
                offered.append(request.tool_names())
                return {"text": "nothing to delegate"}

            srv.play("parent", player)
            base = pi_command(
                base_url=srv.base_url("parent"), workspace=fleet.repo, state_dir=tmp_path / "pi"
            )
            _install_user(fleet, "pi", dict(base.env))
            argv = [a for a in base.argv if a != "--no-extensions"]
            argv[argv.index("--tools") + 1] = "read,fleet_spawn,fleet_wait"
            env = {**base.env, **fleet_env(fleet)}
            command = CliCommand(argv=tuple(argv), env=env, cwd=fleet.repo)
            with trio.fail_after(CEILING):
                async with open_cli(command, tmp_path / "pi.stderr") as pi:
                    await pi.send({"type": "prompt", "id": "p1", "message": PROMPT})
                    await pi.until(lambda e: e.get("type") == "agent_end")
                    assert await pi.finish() == 0
        assert offered
        assert fleet_tool(offered[0], "spawn") == "fleet_spawn", offered
        assert not (fleet.repo / ".pi").exists()
        extension = Path(base.env["PI_CODING_AGENT_DIR"]) / "extensions" / "fleet" / "index.js"
        assert extension.is_file()
