"""Which sandbox and which tools an agent CLI is configured with, without running one: inside
fleet's sandbox no CLI nests its own, and no CLI is given a tool that escapes a fleet rule."""

import pytest

from child.backends._claude import DISALLOWED_TOOLS, NO_NESTED_SANDBOX, claude_argv
from child.backends._cli_backend import CliTurn, sandbox_failure
from child.backends._cli_env import CliError, PrivateDirs
from child.backends._codex import codex_config, sandbox_mode
from child.backends._nesting import check_codex_sandbox, inside_fleet_sandbox
from tests.child.backends._cli import claude_loadout, codex_loadout


@pytest.mark.parametrize(
    ("policy", "variable", "inside"),
    [
        ("read_only", "1", True),
        ("worker", "1", True),
        ("review", "1", True),
        ("read_only", "0", False),  # --allow-unsandboxed: the launch did not wrap it
        ("read_only", None, False),
        ("none", "1", False),  # a loadout no supervisor sandboxes
    ],
)
def test_inside_fleets_sandbox_needs_the_policy_and_the_launch(
    tmp_path, monkeypatch, policy, variable, inside
):
    if variable is None:
        monkeypatch.delenv("FLEET_SANDBOXED", raising=False)
    else:
        monkeypatch.setenv("FLEET_SANDBOXED", variable)
    loadout = codex_loadout(tmp_path, "http://127.0.0.1:9", sandbox=policy)
    assert inside_fleet_sandbox(loadout) is inside
    assert (sandbox_mode(loadout) == "danger-full-access") is inside
    argv = claude_argv(
        "claude",
        claude_loadout(tmp_path, "http://x", sandbox=policy),
        PrivateDirs.create(str(tmp_path), "claude"),
    )
    settings = argv[argv.index("--settings") + 1] if "--settings" in argv else None
    assert settings == (NO_NESTED_SANDBOX if inside else None)


def test_outside_fleets_sandbox_codex_keeps_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEET_SANDBOXED", "0")
    scout = codex_loadout(tmp_path, "http://x", sandbox="read_only")
    worker = codex_loadout(tmp_path, "http://x", mode="worktree", tools=["read", "edit"])
    assert (sandbox_mode(scout), sandbox_mode(worker)) == ("read-only", "workspace-write")


def test_claude_denies_escaping_tools_and_loads_no_repository_settings(tmp_path):
    argv = claude_argv(
        "claude", claude_loadout(tmp_path, "http://x"), PrivateDirs.create(str(tmp_path), "c")
    )
    assert f"--disallowedTools={','.join(DISALLOWED_TOOLS)}" in argv
    assert {"Agent", "Task", "WebFetch", "WebSearch"} <= set(DISALLOWED_TOOLS)
    assert argv[argv.index("--setting-sources") + 1] == "user"


def test_codex_config_turns_off_sub_agents_the_web_and_its_own_questions(tmp_path):
    config = codex_config(codex_loadout(tmp_path, "http://127.0.0.1:9"), stall=5)
    for line in (
        'web_search = "disabled"',
        "[agents]\nenabled = false",
        "multi_agent_v2 = false",
        "goals = false",
        "[tools.experimental_request_user_input]\nenabled = false",
        "[tools.update_plan]\nenabled = false",
    ):
        assert line in config


def test_a_failed_tool_fails_the_turn_only_when_its_sandbox_could_not_start():
    nested = [
        {"type": "text", "text": "Exit code 1\nbwrap: setting up uid map: Operation not permitted"}
    ]
    assert sandbox_failure(nested) == "bwrap: setting up uid map: Operation not permitted"
    assert sandbox_failure({"content": [{"text": "grep: no match"}]}) == ""
    assert sandbox_failure("the word bwrap: inside a line") == ""
    turn = CliTurn()
    turn.tool_failed("pi", "bash", "no such file")
    assert turn.result().ok
    turn.tool_failed("pi", "bash", nested)
    assert turn.result().error == (
        "pi: bash could not run inside fleet's sandbox: "
        "bwrap: setting up uid map: Operation not permitted"
    )


async def test_codex_whose_own_sandbox_fails_is_refused_with_one_line(tmp_path):
    # A stand-in codex whose `sandbox -- true` fails as a nested bubblewrap does.
    fake = tmp_path / "codex"
    fake.write_text(
        "#!/bin/sh\necho 'WARNING: proceeding' >&2\n"
        'echo "bwrap: setting up uid map: Operation not permitted" >&2\nexit 1\n'
    )
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    with pytest.raises(CliError) as caught:
        await check_codex_sandbox("codex", env=env, cwd=str(tmp_path))
    assert str(caught.value).startswith(
        "backend codex: Codex's own sandbox cannot run here (bwrap: setting up uid map: "
        "Operation not permitted), so every command would fail"
    )
    fake.write_text("#!/bin/sh\nexit 0\n")
    await check_codex_sandbox("codex", env=env, cwd=str(tmp_path))  # works: nothing raised
