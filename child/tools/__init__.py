"""The builtin agent's tools: files, shell and the todo checklist.

Layering: a leaf inside ``child``; it imports nothing of ours (not ``ipc``, never
``orchestrator``). The runtime builds a toolset with ``build_tools(loadout.tools, ctx)`` and
wires ``ToolContext.may_write`` to its IPC ``ownership`` request and ``on_progress`` to its
progress events.
"""

from ._base import BaseTool, Tool, ToolContext, ToolError, ToolResult
from ._registry import ALL_TOOLS, MUTATING_TOOLS, build_tools
from ._todo import Checklist, Progress, Task, TodoError

__all__ = [
    "ALL_TOOLS",
    "MUTATING_TOOLS",
    "BaseTool",
    "Checklist",
    "Progress",
    "Task",
    "TodoError",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "build_tools",
]
