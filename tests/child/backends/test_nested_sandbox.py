"""Agent CLIs inside fleet's own sandbox (real bubblewrap): their nested sandboxes are off, so
a shell command really runs and the model receives its real output; a tool whose sandbox could
not start fails the turn instead of feeding a report built on nothing."""

import json

import pytest

from tests.child.backends._cli import ANTHROPIC_KEY_ENV
from tests.child.backends._sandboxed import sandboxed_turn
from tests.fakes.model_server import ModelServer

pytestmark = pytest.mark.slow

#: What a shell call looks like in each CLI's own tool vocabulary.
SHELL_CALLS = {
    "codex": lambda cmd: {"name": "exec_command", "arguments": {"cmd": cmd}},
    "claude": lambda cmd: {"name": "Bash", "arguments": {"command": cmd}},
    "pi": lambda cmd: {"name": "bash", "arguments": {"command": cmd}},
    "pi-next": lambda cmd: {"name": "bash", "arguments": {"command": cmd}},
}


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(ANTHROPIC_KEY_ENV, "sk-ant-scripted")


def shell_turn(binary, tmp_path, cmd, *, repo_settings=None, sandboxed=True):
    """One sandboxed turn whose model runs *cmd*; the result and the tool results it got."""
    if repo_settings is not None:  # a repository's own Claude Code settings
        (tmp_path / "ws" / ".claude").mkdir(parents=True)
        (tmp_path / "ws" / ".claude" / "settings.json").write_text(json.dumps(repo_settings))
    with ModelServer() as srv:
        srv.script("a", [{"tool_calls": [SHELL_CALLS[binary](cmd)]}, {"text": "## Summary\ndone"}])
        tools = ["read", "bash", "ask_parent"]
        result = sandboxed_turn(
            binary, tmp_path, srv.base_url("a"), sandboxed=sandboxed, tools=tools
        )
        calls = [r for r in srv.requests("a") if r.api is not None]
    return result, calls[-1].tool_results() if len(calls) > 1 else []


@pytest.mark.parametrize("binary", ["codex", "claude", "pi", "pi-next"])
def test_a_shell_command_runs_and_the_model_gets_its_output(binary, tmp_path):
    # A repository asking for Claude Code's own sandbox (and refusing to run without one)
    # cannot nest it in ours; Codex's read-only sandbox would fail every command here.
    settings = {"sandbox": {"enabled": True, "failIfUnavailable": True}}
    result, [output] = shell_turn(
        binary, tmp_path, "cat notes.txt; echo rc=$?", repo_settings=settings
    )
    assert (result["ok"], result["error"]) == (True, "")
    assert result["tool_ends"] == ["ok"]
    assert "the secret is 4217\nrc=0" in output
    assert "bwrap" not in output


def test_codex_refuses_to_start_when_its_own_sandbox_cannot_run(tmp_path):
    # FLEET_SANDBOXED=0 (--allow-unsandboxed): Codex keeps its own read-only sandbox, which
    # inside our (test-only) wrap is the nesting that cannot work. Codex would report nothing
    # and hand the model "bwrap: setting up uid map" as every command's output: fail at start.
    result, outputs = shell_turn("codex", tmp_path, "cat notes.txt", sandboxed=False)
    assert outputs == []  # the model was never asked
    assert not result["ok"]
    assert result["error"] == (
        "backend codex: Codex's own sandbox cannot run here (bwrap: setting up uid map: "
        "Operation not permitted), so every command would fail; run the child in fleet's "
        "sandbox (install bubblewrap)"
    )


def test_a_repository_hook_does_not_run_in_a_claude_child(tmp_path):
    marker = tmp_path / "scratch" / "hooked"
    hook = {"type": "command", "command": f"echo hooked > {marker}"}
    settings = {"hooks": {"UserPromptSubmit": [{"hooks": [hook]}]}}
    result, _ = shell_turn("claude", tmp_path, "true", repo_settings=settings)
    assert result["ok"], result["error"]
    assert not marker.exists()


@pytest.mark.parametrize("binary", ["codex", "claude", "pi"])
def test_a_tool_whose_sandbox_cannot_start_fails_the_turn(binary, tmp_path):
    result, [output] = shell_turn(binary, tmp_path, "bwrap --ro-bind / / true")
    assert "bwrap: " in output
    assert not result["ok"]
    assert result["error"].startswith(f"{binary}: ")
    assert "could not run inside fleet's sandbox: bwrap: " in result["error"]
    assert result["tool_ends"] == ["error"]
