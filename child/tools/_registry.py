"""Which tools exist and how a child's toolset is built from its loadout's tool names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._bash import BashTool
from ._edit import EditTool, WriteTool
from ._fs import FindTool, GrepTool, LsTool, ReadTool
from ._shell import ShellTool
from ._todo import TodoTool

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ._base import Tool, ToolContext

_FACTORIES: dict[str, Callable[[], Tool]] = {
    "read": ReadTool,
    "grep": GrepTool,
    "find": FindTool,
    "ls": LsTool,
    "edit": EditTool,
    "write": WriteTool,
    "bash": BashTool,
    "todo": TodoTool,
}

ALL_TOOLS: frozenset[str] = frozenset(_FACTORIES)
#: Tools that can change the repository. ``orchestrator.definitions`` keeps its own copy (it
#: may not import ``child``); a test holds the two equal.
MUTATING_TOOLS: frozenset[str] = frozenset({"edit", "write", "bash"})


def build_tools(names: Iterable[str], ctx: ToolContext) -> dict[str, Tool]:
    """Fresh instances of exactly the named tools, keyed by name (each gets its own checklist);
    ``bash`` brings ``shell`` (background shells) with it.

    Raises ``ValueError`` (one line) for a name that is not a tool or a workspace that is not a
    directory, so a bad loadout fails at start-up instead of at the first tool call.
    """
    tools: dict[str, Tool] = {}
    for name in names:
        factory = _FACTORIES.get(name)
        if factory is None:
            known = ", ".join(sorted(ALL_TOOLS))
            raise ValueError(
                f"build tools: unknown tool {name!r}; use one of {known} (fix the tools list)"
            )
        tools[name] = factory()
    if "bash" in tools:  # background shells come with bash (and are gated like it)
        tools["shell"] = ShellTool()
    if not ctx.workspace.is_dir():
        raise ValueError(
            f"build tools: workspace {ctx.workspace} is not a directory; create it or fix the "
            "loadout"
        )
    return tools
