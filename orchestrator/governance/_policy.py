"""Workflow modes and launch-time toolset validation.

The supervisor holds one workflow mode. In ``build`` anything a definition allows may launch.
In every other mode validation fails closed: a new child may hold only read-only repository
tools, ``ask_parent``, the nested ``subagent`` tool, ``discuss`` and ``todo``. Only new launches
are gated; running children survive a mode change.
"""

from collections.abc import Iterable
from typing import Final

from orchestrator._errors import PolicyError, UsageError

MODES: Final = ("build", "plan", "discuss", "design", "review")
READ_ONLY_TOOLS: Final = frozenset(
    {"read", "grep", "find", "ls", "todo", "ask_parent", "subagent", "discuss"}
)
MUTATING_TOOLS: Final = frozenset({"edit", "write", "bash"})
#: What a worktree child may keep of its definition's tools. ``bash`` is kept only when the
#: definition lists it: the child runs in the ``worker`` sandbox (writes confined to its
#: worktree and scratch), so its shell is too.
WORKTREE_TOOLS: Final = (
    "read",
    "edit",
    "write",
    "bash",
    "grep",
    "find",
    "ls",
    "todo",
    "discuss",
)
MAX_DEPTH: Final = 2


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UsageError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    return mode


def validate_toolset(mode: str, agent: str, tools: Iterable[str], backend: str) -> None:
    """Refuse a launch whose tools the workflow *mode* does not allow."""
    if mode == "build":
        return
    extra = sorted(set(tools) - READ_ONLY_TOOLS)
    if extra:
        raise PolicyError(
            f"spawn {agent}: tool {extra[0]} is not allowed in {mode} mode",
            hint="only read-only tools outside build; switch with fleet mode build",
        )
    if backend == "command":
        raise PolicyError(
            f"spawn {agent}: the command backend is not read-only, refused in {mode} mode",
            hint="switch with fleet mode build",
        )


def validate_nested(
    *, caller_agent: str, caller_mode: str, allowlist: Iterable[str], depth: int, agent: str
) -> None:
    """Refuse a nested spawn outside the caller's allowlist or the depth cap."""
    if caller_mode == "scout":
        raise PolicyError(f"subagent: {caller_agent} is a scout, and scouts are leaves")
    allowed = set(allowlist)
    if agent not in allowed:
        names = ", ".join(sorted(allowed)) or "none"
        raise PolicyError(
            f"subagent: {agent} is not in {caller_agent}'s subagent_agents allowlist ({names})"
        )
    if depth + 1 > MAX_DEPTH:
        raise PolicyError(f"subagent: depth {depth + 1} exceeds the maximum depth {MAX_DEPTH}")
