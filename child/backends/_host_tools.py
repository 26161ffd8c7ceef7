"""Tools that reach the parent over IPC: ``ask_parent``, ``subagent``, ``discuss``.

They share the shape of :mod:`child.tools` (name, description, JSON schema, ``run``) so the
agent loop treats every tool alike; the work is done by the runtime's :class:`Host`.
"""

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from child.backends._base import Host
from child.tools import ToolContext, ToolResult
from child.tools._base import BaseTool, ToolError, optional_str, require_str

HOST_TOOLS = frozenset({"ask_parent", "subagent", "discuss"})


@attrs.define(eq=False)
class AskParent(BaseTool):
    host: Host
    name: ClassVar[str] = "ask_parent"
    description: ClassVar[str] = (
        "Ask the parent a question when you cannot proceed without a decision. Waits for the "
        "answer (your budgets pause meanwhile). Ask rarely and precisely."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"question": {"type": "string"}},
        "required": ["question"],
    }

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        question = require_str(args, "question", tool=self.name)
        return ToolResult(text=await self.host.ask_parent(question))


@attrs.define(eq=False)
class Subagent(BaseTool):
    host: Host
    name: ClassVar[str] = "subagent"
    description: ClassVar[str] = (
        "Delegate a self-contained task to a nested child agent (from your allowlist) and get "
        "back only its final report."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "agent": {"type": "string", "description": "agent definition name, e.g. scout"},
            "task": {"type": "string"},
            "name": {"type": "string"},
        },
        "required": ["agent", "task"],
    }

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        agent = require_str(args, "agent", tool=self.name)
        task = require_str(args, "task", tool=self.name)
        name = optional_str(args, "name", tool=self.name) or ""
        return ToolResult(text=await self.host.spawn(agent, task, name))


@attrs.define(eq=False)
class Discuss(BaseTool):
    host: Host
    name: ClassVar[str] = "discuss"
    description: ClassVar[str] = (
        "The fleet's shared discussion paper. op=ask {text, to?}: post a terse question; "
        "op=answer {question: dN, text}: answer one; op=list {since?, question?}: read new "
        "entries by others. Replies are ids, not echoes."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": ["ask", "answer", "list"]},
            "text": {"type": "string"},
            "to": {"type": "string"},
            "question": {"type": "string"},
            "since": {"type": "string"},
        },
        "required": ["op"],
    }

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        op = require_str(args, "op", tool=self.name)
        if op not in {"ask", "answer", "list"}:
            raise ToolError(f"discuss: op must be ask, answer or list (got {op!r})")
        fields = {
            key: optional_str(args, key, tool=self.name) for key in ("to", "question", "since")
        }
        text = optional_str(args, "text", tool=self.name) or ""
        return ToolResult(text=await self.host.discuss(op, text=text, **fields))


def build_host_tools(names: set[str], host: Host) -> dict[str, BaseTool]:
    """The host tools among *names*."""
    made: dict[str, BaseTool] = {}
    if "ask_parent" in names:
        made["ask_parent"] = AskParent(host=host)
    if "subagent" in names:
        made["subagent"] = Subagent(host=host)
    if "discuss" in names:
        made["discuss"] = Discuss(host=host)
    return made
