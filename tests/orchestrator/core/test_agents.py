"""Agent definitions: parsing, scopes and overrides, scout rules, Claude Code / Pi files."""

from pathlib import Path

import pytest

import child.tools
from orchestrator._config import load_config
from orchestrator._errors import UsageError
from orchestrator.definitions import (
    MUTATING_TOOLS,
    AgentDefinition,
    AgentDefinitionError,
    expand_agent_dirs,
    load_agents,
    parse_agent,
)

REPORT_HEADINGS = ["## Summary", "## Details", "## Verification", "## Open issues"]


def write(directory: Path, name: str, front: str, body: str = "Do the work.\n") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.md"
    path.write_text(f"---\n{front.strip()}\n---\n{body}")
    return path


def parse(front: str, body: str = "Prompt.\n", source: str = "user") -> AgentDefinition:
    return parse_agent(f"---\n{front}\n---\n{body}", path=Path("/defs/x.md"), source=source)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A cwd with no project definitions above it and an empty user directory."""
    monkeypatch.delenv("FLEET_AGENTS_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    cwd = tmp_path / "repo" / "sub"
    cwd.mkdir(parents=True)
    return cwd


def test_mutating_tools_match_the_child_tools_definition():
    assert MUTATING_TOOLS == child.tools.MUTATING_TOOLS


def test_bundled_scout_and_worker(isolated):
    agents = load_agents(cwd=isolated)
    scout, worker = agents["scout"], agents["worker"]
    assert scout.mode == "scout"
    assert scout.tools == ("read", "grep", "find", "ls", "todo", "ask_parent")
    assert worker.mode == "worktree"
    # The bundled worker has a shell (inside its worker sandbox) so it can run the tests.
    assert worker.tools == (
        "read",
        "grep",
        "find",
        "ls",
        "edit",
        "write",
        "bash",
        "todo",
        "discuss",
    )
    assert "no shell" in scout.description
    assert "shell" in worker.description
    for definition in (scout, worker):
        assert definition.source == "bundled"
        assert definition.backend == "builtin"
        assert definition.path.name == f"{definition.name}.md"
        positions = [definition.prompt.index(heading) for heading in REPORT_HEADINGS]
        assert positions == sorted(positions)


def test_every_field_is_parsed():
    definition = parse(
        "name: fixer\n"
        "description: Fixes one bug\n"
        "tools: read, edit, write, bash\n"
        "model: openai:qwen2.5-coder\n"
        "backend: pi\n"
        "mode: worktree\n"
        "subagent_agents: [scout]\n"
        "effort: high\n"
        "ownership: [src/pkg/**, 'docs/{a,b}.md']\n"
        "sandbox: worker\n"
        "env: [OPENAI_API_KEY]\n",
        body="\nYou fix bugs.\n\n",
    )
    assert definition == AgentDefinition(
        name="fixer",
        description="Fixes one bug",
        tools=("read", "edit", "write", "bash"),
        model="openai:qwen2.5-coder",
        backend="pi",
        mode="worktree",
        subagent_agents=("scout",),
        effort="high",
        ownership=("src/pkg/**", "docs/{a,b}.md"),
        sandbox="worker",
        env=("OPENAI_API_KEY",),
        prompt="You fix bugs.",
        source="user",
        path=Path("/defs/x.md"),
    )


def test_a_budget_is_parsed_as_a_limit():
    definition = parse("description: d\nbudget: {soft_tokens: 10, hard_usd: 0.5}")
    assert definition.budget is not None
    assert definition.budget.as_json() == {"soft_tokens": 10, "hard_usd": 0.5}
    assert parse("description: d").budget is None


def test_a_space_separated_tools_string_is_accepted():
    assert parse("description: d\ntools: read grep").tools == ("read", "grep")


def test_defaults_fail_closed_and_name_comes_from_the_file():
    definition = parse("description: Looks around")
    assert definition.name == "x"
    assert definition.tools == ("read", "grep", "find", "ls", "todo")
    assert definition.mode == "scout"
    assert definition.backend == "builtin"
    assert definition.model is None
    assert parse("description: d\ntools: [read, edit]").mode == "worktree"


@pytest.mark.parametrize(
    ("front", "body", "field", "cause"),
    [
        ("description: d\ncolour: red", "P", "colour", "unknown front-matter key"),
        ("description: d\nname: 'bad name'", "P", "name", "is not a valid agent name"),
        ("description: d\nname: " + "n" * 65, "P", "name", "is not a valid agent name"),
        ("name: a", "P", "description", "is missing"),
        ("description: d\ntools: [read, shell]", "P", "tools", "unknown tool 'shell'"),
        ("description: d\ntools: {read: 1}", "P", "tools", "must be a list of strings"),
        ("description: d\nmode: solo", "P", "mode", "'solo' is not one of scout, fork, worktree"),
        ("description: d\nbackend: gpt", "P", "backend", "is not one of builtin, pi"),
        ("description: d\neffort: max", "P", "effort", "'max' is not one of off"),
        ("description: d\nsandbox: none", "P", "sandbox", "is not one of read_only"),
        ("description: d\nenv: [MY-KEY]", "P", "env", "not a valid environment variable name"),
        ("description: d\nsubagent_agents: [a b]", "P", "subagent_agents", "not a valid agent"),
        ("description: d\nownership: src/**", "P", "ownership", "only writing agents"),
        ("description: d\nownership: [1]\ntools: edit", "P", "ownership", "list of paths"),
        ("description: [d]", "P", "description", "must be a string, not list"),
        ("description: d", "  \n", "prompt", "the body after the front matter is empty"),
        ("- a\n- b", "P", "front matter", "is a YAML list, not a mapping"),
        ("description: d\nbudget: {hard: 5}", "P", "budget", "unknown key 'hard'"),
        ("description: d\nbudget: {hard_usd: -1}", "P", "budget", "hard_usd -1 must be a finite"),
        ("description: d\nbudget: 500", "P", "budget", "must be a mapping of soft_tokens"),
    ],
)
def test_invalid_definitions_raise_one_line_errors_naming_the_field(front, body, field, cause):
    with pytest.raises(AgentDefinitionError) as info:
        parse(front, body=body)
    error = info.value
    assert error.field == field
    assert cause in error.cause
    assert error.path == Path("/defs/x.md")
    message = str(error)
    assert message.startswith(f"agent definition /defs/x.md: {field}: ")
    assert message.endswith(")")
    assert "\n" not in message


def test_bad_yaml_is_one_line_with_its_position():
    with pytest.raises(AgentDefinitionError) as info:
        parse("description: d\ntools: [read, grep\nmode: scout")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("agent definition /defs/x.md: front matter: invalid YAML: ")
    assert "at line 3" in message
    assert message.endswith("(fix the YAML between the '---' lines)")


def test_missing_front_matter_is_an_error():
    with pytest.raises(AgentDefinitionError, match="does not start with a '---' YAML block"):
        parse_agent("# just markdown\n", path=Path("/defs/x.md"), source="user")


@pytest.mark.parametrize(
    "front",
    [
        "description: d\nmode: scout\ntools: [read, bash]",
        "name: scout\ndescription: d\nmode: worktree\ntools: [read, edit]",
    ],
)
def test_a_scout_holding_a_mutating_tool_is_rejected(front):
    with pytest.raises(AgentDefinitionError, match=r"tools: scout '\w+' holds mutating tools"):
        parse(front)


def test_a_scout_may_not_spawn_subagents():
    with pytest.raises(AgentDefinitionError, match="subagent_agents: a scout may not spawn"):
        parse("description: d\nmode: scout\nsubagent_agents: [worker]")


def test_scopes_layer_bundled_user_and_project_in_order(isolated, tmp_path):
    user = tmp_path / "config" / "fleet" / "agents"
    project = tmp_path / "repo" / ".fleet" / "agents"
    write(user, "helper", "description: from user")
    write(user, "worker", "description: user worker\ntools: [read, edit]\nmode: worktree")
    write(project, "helper", "description: from project")
    write(project, "reviewer", "description: reviews\nmode: fork")

    default = load_agents("default", cwd=isolated)
    assert set(default) == {"scout", "worker", "helper"}
    assert default["helper"].source == "user"
    assert default["worker"].description == "user worker"

    project_scope = load_agents("project", cwd=isolated)
    assert set(project_scope) == {"scout", "worker", "helper", "reviewer"}
    assert project_scope["helper"].source == "project"
    assert project_scope["worker"].source == "bundled"

    both = load_agents("both", cwd=isolated)
    assert both["helper"].description == "from project"
    assert both["worker"].source == "user"
    assert both["reviewer"].path == project / "reviewer.md"


def test_user_dir_argument_and_environment_override_the_default(isolated, tmp_path, monkeypatch):
    write(tmp_path / "env-agents", "a", "description: env")
    write(tmp_path / "arg-agents", "b", "description: arg")
    monkeypatch.setenv("FLEET_AGENTS_DIR", str(tmp_path / "env-agents"))
    assert "a" in load_agents(cwd=isolated)
    explicit = load_agents(cwd=isolated, user_dir=tmp_path / "arg-agents")
    assert "b" in explicit
    assert "a" not in explicit


def test_unknown_scope_is_refused(isolated):
    with pytest.raises(UsageError, match="scope 'all' is not one of default, project, both"):
        load_agents("all", cwd=isolated)


def test_an_override_may_not_give_a_scout_mutating_tools(isolated, tmp_path):
    user = tmp_path / "config" / "fleet" / "agents"
    write(user, "explorer", "description: looks\nmode: scout")
    project = tmp_path / "repo" / ".fleet" / "agents"
    path = write(project, "explorer", "description: writes\nmode: worktree\ntools: [read, write]")
    with pytest.raises(AgentDefinitionError) as info:
        load_agents("both", cwd=isolated)
    assert info.value.path == path
    assert "overrides the scout 'explorer'" in str(info.value)
    assert "\n" not in str(info.value)


def test_overriding_the_bundled_scout_with_bash_is_rejected(isolated, tmp_path):
    user = tmp_path / "config" / "fleet" / "agents"
    write(user, "scout", "description: sneaky\nmode: worktree\ntools: [read, bash]")
    with pytest.raises(AgentDefinitionError, match="scout 'scout' holds mutating tools"):
        load_agents(cwd=isolated)


def test_two_files_with_one_name_in_a_directory_are_an_error(isolated, tmp_path):
    user = tmp_path / "config" / "fleet" / "agents"
    write(user, "a", "name: same\ndescription: one")
    write(user, "b", "name: same\ndescription: two")
    with pytest.raises(AgentDefinitionError, match="'same' is also defined in"):
        load_agents(cwd=isolated)


def test_claude_code_agents_map_tools_and_record_what_was_dropped(isolated, tmp_path):
    claude = tmp_path / "repo" / ".claude" / "agents"
    write(
        claude,
        "code-reviewer",
        "name: code-reviewer\n"
        "description: Reviews diffs\n"
        "tools: Read, Grep, Glob, LS, Bash(git diff:*), WebFetch\n"
        "model: inherit\n"
        "color: purple\n",
    )
    write(claude, "fixer", "description: Fixes\ntools: [Read, Edit, Write, Bash]\nmodel: sonnet")
    write(claude, "plain", "description: No tools listed")
    agents = load_agents(cwd=isolated, extra_dirs=[claude])
    reviewer = agents["code-reviewer"]
    assert reviewer.source == "claude"
    assert reviewer.tools == ("read", "grep", "find", "ls")
    assert reviewer.mode == "scout"
    assert reviewer.model is None
    assert reviewer.warnings == (
        "ignored front-matter key 'color'",
        (
            "dropped tool 'Bash(git diff:*)': fleet cannot enforce a restricted form, "
            "so 'Bash' is not given"
        ),
        "dropped tool 'WebFetch': fleet has no equivalent",
    )
    fixer = agents["fixer"]
    assert fixer.tools == ("read", "edit", "write", "bash")
    assert fixer.mode == "worktree"
    assert fixer.model == "sonnet"
    assert agents["plain"].tools == ("read", "grep", "find", "ls", "todo")
    assert agents["plain"].warnings == ("no tools listed; given the read-only default",)


def test_pi_agents_keep_our_names_and_user_definitions_override_them(isolated, tmp_path):
    pi = tmp_path / "home" / ".pi" / "agent" / "agents"
    write(pi, "planner", "name: planner\ndescription: Plans\ntools: read, grep, find, ls, web")
    write(pi, "helper", "description: pi helper")
    write(tmp_path / "config" / "fleet" / "agents", "helper", "description: fleet helper")
    agents = load_agents(cwd=isolated, extra_dirs=[pi])
    assert agents["planner"].source == "pi"
    assert agents["planner"].tools == ("read", "grep", "find", "ls")
    assert agents["planner"].warnings == ("dropped tool 'web': fleet has no equivalent",)
    assert agents["helper"].source == "user"


def test_a_claude_agent_named_scout_with_bash_is_rejected(isolated, tmp_path):
    claude = tmp_path / ".claude" / "agents"
    write(claude, "scout", "description: d\ntools: Read, Bash")
    with pytest.raises(AgentDefinitionError, match="holds mutating tools"):
        load_agents(cwd=isolated, extra_dirs=[claude])


def test_agent_dir_words_stand_for_the_project_and_user_directories(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    workspace = tmp_path / "repo"
    assert expand_agent_dirs(["claude", "pi", str(tmp_path / "x")], workspace=workspace) == [
        workspace / ".claude" / "agents",
        tmp_path / "home" / ".claude" / "agents",
        workspace / ".pi" / "agents",
        tmp_path / "home" / ".pi" / "agent" / "agents",
        tmp_path / "x",
    ]


def test_agent_dirs_from_flag_environment_or_file_become_absolute(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    home = tmp_path / "state"
    monkeypatch.delenv("FLEET_AGENT_DIRS", raising=False)
    config = load_config(cwd=repo / "sub", home=home, agent_dirs="claude, ../agents ,")
    assert config.agent_dirs == ("claude", str(repo / "sub" / ".." / "agents"))
    monkeypatch.setenv("FLEET_AGENT_DIRS", "pi")
    assert load_config(cwd=repo, home=home).agent_dirs == ("pi",)
    monkeypatch.delenv("FLEET_AGENT_DIRS")
    home.mkdir()
    (home / "config.yaml").write_text("subagents:\n  agent_dirs: [claude, /srv/agents]\n")
    assert load_config(cwd=repo, home=home).agent_dirs == ("claude", "/srv/agents")
    (home / "config.yaml").write_text("subagents:\n  agent_dirs: 7\n")
    with pytest.raises(UsageError, match="agent_dirs 7 must be a list"):
        load_config(cwd=repo, home=home)


@pytest.mark.parametrize(
    ("listed", "kept"),
    [
        ("read, edit, write, bash", ["read", "edit", "write", "bash", "todo", "discuss"]),
        ("read, edit, write", ["read", "edit", "write", "todo", "discuss"]),
    ],
)
def test_a_worktree_definition_keeps_bash_only_when_it_lists_it(tmp_path, listed, kept):
    from orchestrator._records import SpawnRequest  # noqa: PLC0415
    from orchestrator.core._plan import plan_spawn  # noqa: PLC0415

    definition = parse(f"name: fixer\ndescription: d\nmode: worktree\ntools: {listed}")
    (tmp_path / "s.yaml").write_text("turns: []\n")
    config = load_config(cwd=tmp_path, home=tmp_path / "home")
    plan = plan_spawn(
        SpawnRequest(task="fix it", agent="fixer", model="scripted:s.yaml"),
        definitions={"fixer": definition},
        config=config,
        workflow_mode="build",
    )
    assert plan.loadout_fields["tools"] == kept
    assert plan.loadout_fields["sandbox"] == "worker"
