"""Workflow modes, launch-time toolset validation and the nested-spawn rules (DESIGN §4)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator import definitions
from orchestrator._errors import PolicyError, UsageError
from orchestrator.governance._policy import (
    MAX_DEPTH,
    MODES,
    MUTATING_TOOLS,
    READ_ONLY_TOOLS,
    WORKTREE_TOOLS,
    check_mode,
    validate_nested,
    validate_toolset,
)

GATED = [m for m in MODES if m != "build"]
ALL_TOOLS = sorted(READ_ONLY_TOOLS | MUTATING_TOOLS)


def test_the_modes_and_the_depth_are_the_design_ones() -> None:
    assert MODES == ("build", "plan", "discuss", "design", "review")
    assert MAX_DEPTH == 2


def test_the_mutating_tools_agree_with_the_agent_definitions() -> None:
    assert MUTATING_TOOLS == definitions.MUTATING_TOOLS
    assert not READ_ONLY_TOOLS & MUTATING_TOOLS


def test_worktree_children_may_keep_a_listed_shell() -> None:
    assert {"edit", "write", "bash"} <= set(WORKTREE_TOOLS)


@pytest.mark.parametrize("mode", MODES)
def test_check_mode_accepts_each_mode(mode: str) -> None:
    assert check_mode(mode) == mode


def test_check_mode_refuses_an_unknown_mode_in_one_line() -> None:
    with pytest.raises(UsageError) as refused:
        check_mode("Plan")
    assert str(refused.value) == "mode 'Plan' is not one of build, plan, discuss, design, review"


def test_build_allows_every_tool_and_backend() -> None:
    validate_toolset("build", "worker", ALL_TOOLS, "command")


@pytest.mark.parametrize("mode", GATED)
@pytest.mark.parametrize("tool", sorted(MUTATING_TOOLS))
def test_outside_build_a_mutating_tool_is_refused(mode: str, tool: str) -> None:
    with pytest.raises(PolicyError) as refused:
        validate_toolset(mode, "worker", ["read", tool], "builtin")
    assert str(refused.value) == (
        f"spawn worker: tool {tool} is not allowed in {mode} mode "
        "(only read-only tools outside build; switch with fleet mode build)"
    )
    assert refused.value.exit_code == 4


@pytest.mark.parametrize("mode", GATED)
def test_outside_build_the_command_backend_is_refused_even_without_tools(mode: str) -> None:
    with pytest.raises(PolicyError, match=f"command backend is not read-only, refused in {mode}"):
        validate_toolset(mode, "runner", [], "command")


@pytest.mark.parametrize("mode", GATED)
def test_outside_build_read_only_tools_and_subagent_launch(mode: str) -> None:
    validate_toolset(mode, "scout", sorted(READ_ONLY_TOOLS), "builtin")


@given(
    mode=st.sampled_from(MODES),
    tools=st.sets(st.sampled_from(ALL_TOOLS)),
    backend=st.sampled_from(["builtin", "command", "pi", "claude", "codex"]),
)
def test_validation_fails_closed_exactly_when_something_could_write(
    mode: str, tools: set[str], backend: str
) -> None:
    allowed = mode == "build" or (tools <= READ_ONLY_TOOLS and backend != "command")
    if allowed:
        validate_toolset(mode, "agent", sorted(tools), backend)
        return
    with pytest.raises(PolicyError) as refused:
        validate_toolset(mode, "agent", sorted(tools), backend)
    assert "\n" not in str(refused.value)
    first = min(tools - READ_ONLY_TOOLS, default=None)
    assert (f"tool {first} " if first else "command backend") in str(refused.value)


def nested(**overrides: object) -> None:
    args: dict[str, object] = {
        "caller_agent": "lead",
        "caller_mode": "fork",
        "allowlist": ("scout", "reviewer"),
        "depth": 1,
        "agent": "scout",
        **overrides,
    }
    validate_nested(**args)  # type: ignore[arg-type]


def test_a_depth_one_child_may_spawn_an_allowlisted_agent() -> None:
    nested()
    nested(caller_mode="worktree", agent="reviewer")


def test_scouts_are_leaves_whatever_their_allowlist_says() -> None:
    with pytest.raises(PolicyError) as refused:
        nested(caller_agent="scout", caller_mode="scout")
    assert str(refused.value) == "subagent: scout is a scout, and scouts are leaves"


def test_an_agent_outside_the_allowlist_is_refused_naming_the_allowlist() -> None:
    with pytest.raises(PolicyError) as refused:
        nested(agent="worker")
    assert str(refused.value) == (
        "subagent: worker is not in lead's subagent_agents allowlist (reviewer, scout)"
    )
    with pytest.raises(PolicyError, match=r"allowlist \(none\)"):
        nested(allowlist=())


def test_the_parents_children_are_depth_one_and_their_children_the_last_level() -> None:
    nested(depth=MAX_DEPTH - 1)
    with pytest.raises(PolicyError) as refused:
        nested(depth=MAX_DEPTH)
    assert str(refused.value) == "subagent: depth 3 exceeds the maximum depth 2"


@given(depth=st.integers(min_value=1, max_value=10), allowed=st.booleans())
def test_nested_spawn_is_allowed_only_inside_both_bounds(depth: int, allowed: bool) -> None:
    allowlist = ("scout",) if allowed else ("other",)
    if allowed and depth + 1 <= MAX_DEPTH:
        nested(depth=depth, allowlist=allowlist)
        return
    with pytest.raises(PolicyError, match="allowlist" if not allowed else "exceeds the maximum"):
        nested(depth=depth, allowlist=allowlist)
