"""What the web view asks of the supervisor: each read and each action is one control op.

:data:`ACTIONS` is the whole list of things a page can do; each turns a submitted form into
the arguments of the control op a CLI verb sends (``fleet steer a1 TEXT`` and the page's steer
button are the same request), so the supervisor applies the same checks and policy. Nothing
here talks to the supervisor but :class:`Client`, through the control client.
"""

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from orchestrator._errors import UsageError
from orchestrator.control._client import call_async, op_timeout, read_token

Form = Mapping[str, str]


def field(form: Form, name: str) -> str:
    value = form.get(name, "")
    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{name} is empty")
    return value.strip()


@attrs.frozen(kw_only=True)
class Action:
    """One thing a page can do: the control *op* and how a form becomes its arguments."""

    op: str
    args: Callable[[Form], dict[str, Any]]
    #: What the page says when it worked.
    done: Callable[[Form, Mapping[str, Any]], str]


def _agent_text(form: Form) -> dict[str, Any]:
    return {"agent": field(form, "agent"), "text": field(form, "text")}


def _state(form: Form, reply: Mapping[str, Any]) -> str:
    return f"{reply.get('key', form.get('agent'))} is {reply.get('state', '?')}"


def _files(verb: str) -> Callable[[Form, Mapping[str, Any]], str]:
    def said(form: Form, reply: Mapping[str, Any]) -> str:
        files = reply.get("files", [])
        failed = [f for f in files if f.get("status") == "failed"]
        if failed:
            return "; ".join(f"{f['path']}: {f.get('error', 'failed')}" for f in failed)
        return f"{verb} {', '.join(f['path'] for f in files) or 'nothing'}"

    return said


def _stopped(form: Form, reply: Mapping[str, Any]) -> str:
    lines = []
    for handoff in reply.get("handoffs", []):
        applied = ", ".join(handoff.get("applied", [])) or "nothing"
        line = f"{handoff['key']} {handoff['state']} (applied: {applied}"
        held = [entry.get("path", "?") for entry in handoff.get("held", [])]
        pending = handoff.get("pending", [])
        if pending:
            line += f"; kept for review: {', '.join(pending)}"
        if held:
            line += f"; held, each lands only by name: {', '.join(held)}"
        conflicts = [c.get("path", "?") for c in handoff.get("conflicts", [])]
        if conflicts:
            line += f"; conflicts: {', '.join(conflicts)}"
        lines.append(line + ")")
    return "; ".join(lines) or "stopped"


#: Every action a page offers. A path names one file: there is no blanket "all" here.
ACTIONS: Final[dict[str, Action]] = {
    "steer": Action(op="steer", args=_agent_text, done=_state),
    "resume": Action(op="resume", args=_agent_text, done=_state),
    "ask": Action(
        op="ask",
        args=_agent_text,
        done=lambda _form, reply: f"{reply.get('key')} answered: {reply.get('answer', '')}",
    ),
    "pause": Action(op="pause", args=lambda form: {"agent": field(form, "agent")}, done=_state),
    "stop": Action(op="stop", args=lambda form: {"agents": [field(form, "agent")]}, done=_stopped),
    # fleet stop --hold: nothing is copied back; the change waits in its worktree for review.
    "hold": Action(
        op="stop",
        args=lambda form: {"agents": [field(form, "agent")], "hold": True},
        done=_stopped,
    ),
    # fleet apply AGENT PATH: one named file of a kept change (a held file lands no other way).
    "apply": Action(
        op="apply",
        args=lambda form: {"agent": field(form, "agent"), "paths": [field(form, "path")]},
        done=_stopped,
    ),
    "answer": Action(
        op="answer",
        args=lambda form: {"question": field(form, "question"), "text": field(form, "text")},
        done=lambda _form, reply: f"answered {reply.get('question')} ({reply.get('key')})",
    ),
    "accept": Action(
        op="accept", args=lambda form: {"targets": [field(form, "path")]}, done=_files("accepted")
    ),
    "revert": Action(
        op="revert", args=lambda form: {"targets": [field(form, "path")]}, done=_files("reverted")
    ),
    "discuss": Action(
        op="discuss",
        args=lambda form: {"action": "ask", "text": field(form, "text")},
        done=lambda _form, reply: f"posted {reply.get('id')}",
    ),
}


@attrs.define(eq=False)
class Client:
    """Control requests to one session's supervisor (the token is read for each: a new
    supervisor writes a new one)."""

    socket: Path
    token_path: Path

    async def call(self, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        token = read_token(self.token_path)
        return await call_async(self.socket, token, op, args, timeout=op_timeout(op))

    async def act(self, name: str, form: Form) -> str:
        """Run the action *name* with *form*; what the page says (a FleetError on refusal)."""
        action = ACTIONS.get(name)
        if action is None:
            raise UsageError(f"no such action: {name}")
        reply = await self.call(action.op, action.args(form))
        return action.done(form, reply)
