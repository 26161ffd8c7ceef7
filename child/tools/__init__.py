"""The builtin agent's tools: files, shell and the todo checklist.

Layering: the bottom of ``child``: it imports ``ipc`` and itself only, never the backends, the
runtime or ``orchestrator``. A backend builds a toolset with ``build_tools(loadout.tools, ctx)``
and wires ``ToolContext.may_write`` to its IPC ``ownership`` request and ``on_progress`` to its
progress events.
"""

from ._base import BaseTool, Progress, Tool, ToolContext, ToolError, ToolResult
from ._registry import ALL_TOOLS, MUTATING_TOOLS, build_tools
from ._todo import Checklist, Task, TodoError

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
