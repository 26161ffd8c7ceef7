"""Backend ``claude``: Claude Code in print mode, stream-json in and out, ONE process for life.

Mapping (details: ``docs/backends.md``):

- prompt / resume → a ``user`` line; the session continues across turns (context kept);
- steer → another ``user`` line while the turn works. Claude Code injects it into the running
  turn at its next model call ("The user sent a new message while you were working"); sent
  during the turn's last model call it starts a follow-up turn instead. Either way the turn
  settles only once every line we sent has been consumed (``--replay-user-messages`` echoes
  each when it is) and a ``result`` followed;
- pause / ask / stop → ``control_request interrupt``; the process stays alive;
- the final text and failure come from the ``result`` line: failure is ``is_error`` or the
  exit code, never ``subtype`` (an API error ends with ``subtype: "success"``); cost is
  ``total_cost_usd`` (cumulative for the session).

Tools: the loadout's tools become ``--tools`` (the built-in set that exists at all) and
``--allowedTools=`` (what runs without a permission prompt); nothing else can run, and
:data:`DISALLOWED_TOOLS` are denied outright; only the private HOME's settings load, and inside
fleet's sandbox Claude's own sandbox is off. fleet's own tools (``ask_parent``, ``todo``,
``discuss``, ``subagent``) come from our MCP server (:mod:`child.backends._mcp`) as
``mcp__fleet__<tool>``.
"""

import logging
import os
from pathlib import Path
from typing import Any, Final

import attrs
import trio

import ipc
from child.backends._base import Host
from child.backends._cli_backend import CliBackend, CliProcess, CliTurn, preview
from child.backends._cli_env import (
    PrivateDirs,
    Version,
    binary_for,
    cli_environment,
    probe_version,
    stall_seconds,
)
from child.backends._digest import digest
from child.backends._jsonl import Oversize
from child.backends._mcp import SERVER, ToolRelay, claude_mcp_config, relayed_tools, write_private
from child.backends._nesting import inside_fleet_sandbox
from child.backends._usage import claude_usage

log = logging.getLogger("child")

MINIMUM: Final = Version(2, 1, 0)
PACKAGE: Final = "@anthropic-ai/claude-code"
#: Our tool names → Claude Code's built-in tools (2.1: no LS, no TodoWrite).
CLAUDE_TOOLS: Final = {
    "read": ("Read",),
    "grep": ("Grep",),
    "find": ("Glob",),
    "ls": ("Glob",),
    "edit": ("Edit",),
    "write": ("Write",),
    "bash": ("Bash",),
}
INTERRUPT_GRACE: Final = 10.0
#: Built-in tools that duplicate or escape a fleet rule, denied even if a version offers them
#: outside ``--tools``: sub-agents fleet never sees (Task/Agent), the web (a sandboxed child has
#: no network but its model), Claude's own todo list and questions (fleet's todo, ask_parent).
DISALLOWED_TOOLS: Final = (
    "Agent",
    "Task",
    "WebFetch",
    "WebSearch",
    "TodoWrite",
    "AskUserQuestion",
)
#: Inside fleet's sandbox: Claude's own (bubblewrap) sandbox cannot nest in ours, and ours is
#: the stronger fence; a flag setting outranks the workspace's ``.claude/settings.json``.
NO_NESTED_SANDBOX: Final = '{"sandbox": {"enabled": false}}'


def claude_tools(tools: list[str]) -> list[str]:
    """The built-in Claude Code tools the loadout's tools map to, in a stable order."""
    names: list[str] = []
    for tool in tools:
        for name in CLAUDE_TOOLS.get(tool, ()):
            if name not in names:
                names.append(name)
    return names


def _has_session(dirs: PrivateDirs, session: str) -> bool:
    """Claude Code already keeps *session* in this child's private directories (an earlier
    process of this child ran it; ``--session-id`` would be refused as in use)."""
    return next(dirs.root.rglob(f"{session}.jsonl"), None) is not None


def claude_argv(
    binary: str, loadout: ipc.Loadout, dirs: PrivateDirs, mcp_config: Path | None = None
) -> list[str]:
    """The command line; *mcp_config* (the relay's 0600 JSON) adds fleet's own tools."""
    tools = claude_tools(loadout.tools)
    allowed = list(tools)
    if mcp_config is not None:
        allowed += [f"mcp__{SERVER}__{tool}" for tool in relayed_tools(loadout.tools)]
    argv = [
        binary,
        "-p",
        "--output-format",
        "stream-json",
        "--input-format",
        "stream-json",
        "--verbose",
        "--include-partial-messages",  # a steady stream: our stall watchdog sees liveness
        "--replay-user-messages",  # acknowledges each user line when it is consumed
        "--strict-mcp-config",
        # Only the private HOME's settings: a repository's .claude/settings.json could add
        # hooks (shell commands a scout without Bash would run), permissions or a sandbox.
        "--setting-sources",
        "user",
        "--permission-mode",
        "acceptEdits" if {"edit", "write"} & set(loadout.tools) else "default",
        # With "=": a bare list would swallow the next argument as another tool name.
        f"--tools={','.join(tools)}",
        f"--allowedTools={','.join(allowed)}",
        f"--disallowedTools={','.join(DISALLOWED_TOOLS)}",
    ]
    if not loadout.resume:
        argv.append("--no-session-persistence")
    elif loadout.restarted or _has_session(dirs, loadout.resume):
        # The session it had: a revive, or a restart on a role's fallback model.
        argv += ["--resume", loadout.resume]
    else:
        argv += ["--session-id", loadout.resume]  # chosen by the supervisor, journaled first
    if inside_fleet_sandbox(loadout):
        argv += ["--settings", NO_NESTED_SANDBOX]
    if mcp_config is not None:
        argv += ["--mcp-config", str(mcp_config)]
    if loadout.model.kind in {"anthropic", "native"} and loadout.model.name:
        argv += ["--model", loadout.model.name]
    if loadout.effort in CLAUDE_EFFORTS:
        argv += ["--effort", CLAUDE_EFFORTS[loadout.effort]]
    if loadout.system_prompt:
        prompt = dirs.config / "system-prompt.md"
        prompt.write_text(loadout.system_prompt, encoding="utf-8")
        argv += ["--append-system-prompt-file", str(prompt)]
    return argv


#: Our effort words in Claude Code's ``--effort`` levels ("off" has none: Claude's default).
CLAUDE_EFFORTS: Final = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
}


def claude_extra_env(loadout: ipc.Loadout, stall: float) -> dict[str, str]:
    extra = {
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        # Connect our MCP server before the first model call (else its tools are "still
        # connecting" when a fast model calls them).
        "MCP_CONNECTION_NONBLOCKING": "false",
        # Our server's start-up (Python + the MCP SDK) on a busy box: both default to seconds,
        # after which Claude goes on without the server.
        "MCP_TIMEOUT": "60000",
        "MCP_CONNECT_TIMEOUT_MS": "60000",
        # ask_parent waits for a person: no MCP tool timeout that a human answer could hit.
        "MCP_TOOL_TIMEOUT": str(24 * 3600 * 1000),
        # Claude's own idle timeout, a backstop set behind ours: our watchdog acts first.
        "CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS": str(int(stall * 2000)),
    }
    spec = loadout.model
    if spec.kind == "anthropic" and spec.base_url:
        extra["ANTHROPIC_BASE_URL"] = spec.base_url
    return extra


@attrs.define(eq=False)
class ClaudeBackend(CliBackend):
    """Backend ``claude``."""

    name: str = "claude"
    version: Version | None = None
    _sent: int = 0  # user lines written
    _consumed: int = 0  # user lines Claude echoed back (consumed)
    _tools: dict[str, str] = attrs.Factory(dict)  # running tool_use id → tool name
    _usage: ipc.Usage = attrs.Factory(ipc.Usage)
    _interrupts: int = 0

    @classmethod
    def from_loadout(cls, loadout: ipc.Loadout, host: Host) -> "ClaudeBackend":
        return cls(
            loadout=loadout,
            host=host,
            binary=binary_for("claude", "claude"),
            stall=stall_seconds(),
        )

    async def _start(self) -> CliProcess:
        if self._cli is not None:
            if self._cli.process.returncode is None:
                return self._cli
            raise self._gone()
        if self.loadout.resume and self.loadout.scratch:
            dirs = self._dirs = PrivateDirs.kept(self.loadout.scratch, "claude")
        else:
            dirs = self._dirs = PrivateDirs.create(self.loadout.scratch, "claude")
        secrets = list(self.loadout.secret_env)
        extra = claude_extra_env(self.loadout, self.stall)
        key_env = self.loadout.model.api_key_env
        env = cli_environment(dirs, secrets=secrets, extra=extra)
        if key_env and os.environ.get(key_env):
            env["ANTHROPIC_API_KEY"] = os.environ[key_env]
        self.version = await probe_version(
            "claude", self.binary, minimum=MINIMUM, package=PACKAGE, env=env
        )
        mcp_config = None
        if relayed_tools(self.loadout.tools):
            self._relay = ToolRelay.create(
                self.loadout.tools, self.host, self.loadout.workspace, dirs.root
            )
            mcp_config = dirs.config / "mcp.json"
            write_private(mcp_config, claude_mcp_config(self._relay))
        self._cli = await CliProcess.start(
            "claude",
            claude_argv(self.binary, self.loadout, dirs, mcp_config),
            env=env,
            cwd=self.loadout.workspace,
            stderr_path=dirs.root / "stderr.log",
        )
        return self._cli

    async def _pump(self, cli: CliProcess, scope: trio.CancelScope) -> None:
        while True:
            record = await cli.reader.receive()
            if record is None:
                break
            self._watch.touch()
            if isinstance(record, Oversize):
                record = {"type": record.kind}
            await self._dispatch(record)
        code = await cli.process.wait()
        if self._turn is not None:
            detail = cli.stderr_line()
            if self._turn.abort_requested:
                self._turn.finish(aborted=True)  # SIGTERM ends without a result: aborted
            else:
                self._turn.fail(
                    f"claude exited with code {code} before a result"
                    + (f": {detail}" if detail else "")
                )
                self._turn.finish()
        scope.cancel()

    async def _dispatch(self, record: dict[str, Any]) -> None:
        turn = self._turn
        kind = record.get("type")
        if turn is None:
            return
        if kind == "system" and record.get("subtype") == "init":
            # The turn has begun (MCP servers connected): from here silence means a stall.
            self._watch.arm()
        elif kind == "stream_event":
            self._on_stream(record.get("event") or {})
        elif kind == "assistant":
            for block in (record.get("message") or {}).get("content") or []:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    name = str(block.get("name", ""))
                    self._tools[str(block.get("id", ""))] = name
                    self._watch.disarm()
                    self.host.emit(
                        ipc.Event(
                            activity="tool_start",
                            tool=name,
                            text=preview(block.get("input")),
                            input_digest=digest(block.get("input")),
                        )
                    )
        elif kind == "user":
            await self._on_user(turn, record)
        elif kind == "result":
            await self._on_result(turn, record)

    def _on_stream(self, event: dict[str, Any]) -> None:
        delta = event.get("delta") or {}
        if event.get("type") == "content_block_delta" and delta.get("type") == "text_delta":
            self.host.emit(ipc.Event(activity="message", text=str(delta.get("text", ""))[:120]))

    async def _on_user(self, turn: CliTurn, record: dict[str, Any]) -> None:
        content = (record.get("message") or {}).get("content")
        if isinstance(content, str):
            # The echo of a line we sent: consumed, either into this turn or as a new turn.
            self._consumed += 1
            if turn.abort_requested:
                await self._interrupt()  # a queued steer restarted work after a pause
            return
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                name = self._tools.pop(str(block.get("tool_use_id", "")), "")
                failed = bool(block.get("is_error"))
                if failed:
                    turn.tool_failed("claude", name, block.get("content"))
                self.host.emit(
                    ipc.Event(
                        activity="tool_end",
                        tool=name,
                        text="error" if failed else "ok",
                        output_digest=digest(block.get("content")),
                        failed=failed,
                    )
                )
        if not self._tools:
            self._watch.arm()

    async def _on_result(self, turn: CliTurn, record: dict[str, Any]) -> None:
        self._usage = claude_usage(self._usage, record)
        self.host.emit(ipc.Event(activity="usage", usage=self._usage))
        if self._consumed < self._sent:
            return  # a steer queued behind this result starts a follow-up turn: wait for it
        text = record.get("result")
        if turn.abort_requested:
            turn.finish(aborted=True)
        elif record.get("is_error"):
            detail = str(text or record.get("subtype") or "unknown error").strip()
            line = detail.splitlines()[0][:300] if detail else "error"
            if "Not logged in" in line:
                key = self.loadout.model.api_key_env or "ANTHROPIC_API_KEY"
                line += f" (fleet: set {key} in the supervisor's environment)"
            turn.fail(f"claude: {line}")
            turn.finish()
        else:
            turn.text = str(text or "")
            turn.finish()

    # -- the Backend protocol --------------------------------------------------------------

    async def _begin(self, turn: CliTurn, message: str) -> None:
        # The stall watch is armed by the turn's system/init, not here (start-up is not model time).
        self._tools.clear()
        await self._send_user(message)

    async def _send_user(self, text: str) -> bool:
        """Write one user line; False when Claude has gone (its EOF fails the turn)."""
        if self._cli is None:
            return False
        self._sent += 1
        try:
            await self._cli.send({"type": "user", "message": {"role": "user", "content": text}})
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._sent -= 1
            return False
        return True

    async def _interrupt(self) -> None:
        if self._cli is None:
            return
        self._interrupts += 1
        message = {
            "type": "control_request",
            "request_id": f"interrupt-{self._interrupts}",
            "request": {"subtype": "interrupt"},
        }
        try:
            await self._cli.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.info("claude went away before the interrupt")

    async def _stop_turn(self) -> None:
        """Interrupt; kill Claude if the turn does not settle within the grace."""
        await self._interrupt()
        with trio.move_on_after(INTERRUPT_GRACE):
            if self._turn is not None:
                await self._turn.done.wait()
            return
        if self._cli is not None:
            await self._cli.terminate()

    async def steer(self, text: str) -> None:
        if self._cli is None or self._turn is None:
            raise ValueError("claude: no turn is running to steer")
        if not await self._send_user(f"Steer from parent: {text}"):
            raise ValueError("claude: the claude process has gone; the steer was not delivered")
