"""Backend ``codex``: ``codex app-server`` (JSON lines, JSON-RPC without the ``jsonrpc`` field).

One app-server process and one thread for the child's life (details: ``docs/backends.md``):

- prompt / resume → ``turn/start`` on the same thread (context kept);
- steer → ``turn/steer {expectedTurnId}`` (joins the running turn at its next model call);
- pause / ask / stop → ``turn/interrupt``; the interrupted turn's shell commands are not
  stopped by Codex (they live until app-server exits), so we kill the ones still running;
- settled on ``turn/completed`` (``completed`` / ``failed`` / ``interrupted``); the final text
  is the turn's last ``agentMessage``.

The sandbox comes from the loadout: a scout (or any child without edit/write/bash) runs
``read-only``, others ``workspace-write``. ``CODEX_HOME`` is private, holds a generated
``config.toml``, and is not below ``TMPDIR`` (Codex's sandboxed tools break when it is).
fleet's own tools (``ask_parent``, ``todo``, ``discuss``, ``subagent``) come from our MCP server
(:mod:`child.backends._mcp`), configured there as ``[mcp_servers.fleet]``.
"""

import contextlib
import json
import logging
import os
import signal
from typing import Any, Final

import attrs
import psutil
import trio

import ipc
from child.backends._base import Host
from child.backends._cli_backend import CliBackend, CliProcess, CliTurn, preview
from child.backends._cli_env import (
    CliError,
    PrivateDirs,
    Version,
    binary_for,
    cli_environment,
    probe_version,
    stall_seconds,
)
from child.backends._digest import digest_fields
from child.backends._jsonl import Oversize
from child.backends._mcp import SERVER, ToolRelay, codex_mcp_config, relayed_tools, write_private
from child.backends._nesting import check_codex_sandbox, inside_fleet_sandbox
from child.backends._usage import codex_usage

log = logging.getLogger("child")

MINIMUM: Final = Version(0, 171, 0)
PACKAGE: Final = "@openai/codex"
REQUEST_TIMEOUT: Final = 30.0
INTERRUPT_GRACE: Final = 10.0
MCP_STARTUP: Final = 60.0
_WRITING: Final = frozenset({"edit", "write", "bash"})
_EFFORTS: Final = frozenset({"minimal", "low", "medium", "high", "xhigh"})
_TOOL_ITEMS: Final = frozenset({"commandExecution", "fileChange", "mcpToolCall", "webSearch"})
#: The fields of an item that say what it does, and those that say how it ended (loop gate).
_ITEM_INPUT: Final = ("type", "command", "cwd", "changes", "server", "tool", "arguments", "query")
_ITEM_OUTPUT: Final = ("status", "aggregatedOutput", "exitCode", "result", "error")


def sandbox_mode(loadout: ipc.Loadout) -> str:
    """``read-only`` for scouts and any child that may not write, else ``workspace-write``.

    Inside fleet's own sandbox (:func:`inside_fleet_sandbox`) Codex's nested bubblewrap cannot
    map its uids (every command fails), and ours already confines the files and the network,
    so Codex is told not to sandbox again."""
    if inside_fleet_sandbox(loadout):
        return "danger-full-access"
    if loadout.mode == "scout" or not _WRITING & set(loadout.tools):
        return "read-only"
    return "workspace-write"


def codex_config(loadout: ipc.Loadout, stall: float) -> str:
    """``config.toml``: offline, no retries, our endpoint when the model names one."""
    spec = loadout.model
    # No web search: a sandboxed child has no network but its model's endpoint.
    lines = ['approval_policy = "never"', 'web_search = "disabled"']
    if spec.name:
        lines.append(f"model = {json.dumps(spec.name)}")
    if loadout.effort in _EFFORTS:
        lines.append(f"model_reasoning_effort = {json.dumps(loadout.effort)}")
    if spec.kind == "openai":
        lines.append('model_provider = "fleet"')
    lines += [
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[features]",
        "plugins = false",
        "unbounded_connection_retries = false",
        # Tools that duplicate or escape a fleet rule (docs/backends.md, "Disabled tools"):
        # sub-agents fleet would never see or count, goals and plans beside fleet's todo.
        "multi_agent_v2 = false",
        "goals = false",
        "",
        "[agents]",
        "enabled = false",
        "",
        "[tools.experimental_request_user_input]",  # questions go through ask_parent
        "enabled = false",
        "",
        "[tools.update_plan]",
        "enabled = false",
    ]
    if spec.kind == "openai":
        lines += [
            "",
            "[model_providers.fleet]",
            'name = "fleet"',
            f"base_url = {json.dumps(spec.base_url)}",
            'wire_api = "responses"',
            "request_max_retries = 0",
            "stream_max_retries = 0",
            # Codex's own idle timeout, a backstop set behind ours: our watchdog acts first.
            f"stream_idle_timeout_ms = {int(stall * 2000)}",
        ]
        if spec.api_key_env and os.environ.get(spec.api_key_env):
            # Only when set: Codex refuses to start a turn when env_key names a missing
            # variable, and a local endpoint needs no key.
            lines.append(f"env_key = {json.dumps(spec.api_key_env)}")
    return "\n".join(lines) + "\n"


@attrs.define(eq=False)
class CodexBackend(CliBackend):
    """Backend ``codex``."""

    name: str = "codex"
    version: Version | None = None
    _thread: str = ""
    _usage: ipc.Usage = attrs.Factory(ipc.Usage)
    _turn_id: str = ""
    _mcp_ready: trio.Event = attrs.Factory(trio.Event)
    _ids: int = 0
    _pending: dict[int, trio.Event] = attrs.Factory(dict)
    _replies: dict[int, dict[str, Any]] = attrs.Factory(dict)
    _commands: dict[str, int] = attrs.Factory(dict)  # running command item id → pid
    _tools: set[str] = attrs.Factory(set)

    @classmethod
    def from_loadout(cls, loadout: ipc.Loadout, host: Host) -> "CodexBackend":
        return cls(
            loadout=loadout, host=host, binary=binary_for("codex", "codex"), stall=stall_seconds()
        )

    # -- the process ----------------------------------------------------------------------

    async def _start(self) -> CliProcess:
        if self._cli is not None:
            if self._cli.process.returncode is None and self._thread:
                return self._cli
            raise self._gone()
        if self.loadout.scratch:
            # Kept: its threads live in CODEX_HOME, and a revive resumes the one it had.
            dirs = self._dirs = PrivateDirs.kept(self.loadout.scratch, "codex")
            self.keep_dirs = True
        else:
            dirs = self._dirs = PrivateDirs.create(self.loadout.scratch, "codex")
        codex_home = dirs.config / "codex"
        codex_home.mkdir(mode=0o700, exist_ok=True)
        config = codex_config(self.loadout, self.stall)
        if relayed_tools(self.loadout.tools):
            self._relay = ToolRelay.create(
                self.loadout.tools, self.host, self.loadout.workspace, dirs.root
            )
            config += codex_mcp_config(self._relay)
        write_private(codex_home / "config.toml", config)
        secrets = [*self.loadout.secret_env, self.loadout.model.api_key_env]
        env = cli_environment(
            dirs, secrets=[s for s in secrets if s], extra={"CODEX_HOME": str(codex_home)}
        )
        self.version = await probe_version(
            "codex", self.binary, minimum=MINIMUM, package=PACKAGE, env=env
        )
        mode = sandbox_mode(self.loadout)
        if mode != "danger-full-access":
            await check_codex_sandbox(self.binary, env=env, cwd=self.loadout.workspace)
        cli = self._cli = await CliProcess.start(
            "codex",
            [self.binary, "app-server"],
            env=env,
            cwd=self.loadout.workspace,
            stderr_path=dirs.root / "stderr.log",
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, cli, nursery.cancel_scope)
            client = {"name": "fleet", "version": "1"}
            init = {"clientInfo": client, "capabilities": {"experimentalApi": True}}
            await self._request("initialize", init)
            await cli.send({"method": "initialized"})
            params: dict[str, Any] = {
                "cwd": self.loadout.workspace,
                "sandbox": mode,
                "approvalPolicy": "never",
            }
            if self.loadout.system_prompt:
                params["developerInstructions"] = self.loadout.system_prompt
            if self.loadout.restarted and self.loadout.resume:
                reply = await self._request(
                    "thread/resume", {**params, "threadId": self.loadout.resume}
                )
            else:
                reply = await self._request("thread/start", params)
            self._thread = str(((reply.get("result") or {}).get("thread") or {}).get("id", ""))
            if self._thread:  # journaled by the supervisor before the first turn starts
                self.host.emit(ipc.Event(activity="status", resume_id=self._thread))
            if self._thread and self._relay is not None:
                # Else a fast first turn starts before our tools exist.
                with trio.move_on_after(MCP_STARTUP):
                    await self._mcp_ready.wait()
            nursery.cancel_scope.cancel()
        if not self._thread:
            detail = _error_text(reply) or cli.stderr_line() or "no thread id"
            await cli.terminate()
            raise CliError(
                f"backend codex: app-server did not start a thread: {detail}",
                backend="codex",
                binary=self.binary,
            )
        return cli

    async def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One JSON-RPC request; the whole reply (``{}`` when none came in time)."""
        assert self._cli is not None  # noqa: S101 - only called once started
        self._ids += 1
        ident = self._ids
        done = self._pending[ident] = trio.Event()
        try:
            await self._cli.send({"id": ident, "method": method, "params": params})
            with trio.move_on_after(REQUEST_TIMEOUT):
                await done.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return {}
        finally:
            self._pending.pop(ident, None)
        return self._replies.pop(ident, {})

    async def _pump(self, cli: CliProcess, scope: trio.CancelScope) -> None:
        while True:
            record = await cli.reader.receive()
            if record is None:
                break
            self._watch.touch()
            if isinstance(record, Oversize):
                record = {"method": record.kind}
            self._dispatch(record)
        code = await cli.process.wait()
        for done in self._pending.values():
            done.set()
        if self._turn is not None:
            detail = cli.stderr_line()
            self._turn.fail(
                f"codex app-server exited with code {code} mid-turn"
                + (f": {detail}" if detail else "")
            )
            self._turn.finish()
        scope.cancel()

    # -- records --------------------------------------------------------------------------

    def _dispatch(self, record: dict[str, Any]) -> None:
        ident = record.get("id")
        if "method" not in record and isinstance(ident, int):
            if ident in self._pending:
                self._replies[ident] = record
                self._pending[ident].set()
            return
        method = record.get("method")
        params = record.get("params") or {}
        if method == "mcpServer/startupStatus/updated" and params.get("name") == SERVER:
            if params.get("status") != "starting":
                if params.get("status") != "ready":
                    log.warning("codex could not start fleet's MCP server: %s", params)
                self._mcp_ready.set()
            return
        if "id" in record:
            # A server request (an approval; none should come with approvalPolicy "never").
            self._answer_server_request(record)
            return
        turn = self._turn
        if turn is None:
            return
        if method == "turn/started":
            self._watch.arm()
        elif method == "item/agentMessage/delta":
            self.host.emit(ipc.Event(activity="message", text=str(params.get("delta", ""))[:120]))
        elif method == "item/started":
            self._on_item(params.get("item") or {}, started=True)
        elif method == "item/completed":
            item = params.get("item") or {}
            self._on_item(item, started=False)
            if item.get("type") == "agentMessage":
                turn.text = str(item.get("text", ""))
        elif method == "thread/tokenUsage/updated":
            self._usage = codex_usage(self._usage, params.get("tokenUsage") or {})
            self.host.emit(ipc.Event(activity="usage", usage=self._usage))
        elif method == "error" and not params.get("willRetry"):
            turn.fail(f"codex: {_error_text(params) or 'the turn failed'}")
        elif method == "turn/completed":
            self._on_completed(turn, params.get("turn") or {})

    def _on_item(self, item: dict[str, Any], *, started: bool) -> None:
        kind = str(item.get("type", ""))
        if kind not in _TOOL_ITEMS:
            return
        ident = str(item.get("id", ""))
        tool = "exec" if kind == "commandExecution" else kind
        if started:
            self._tools.add(ident)
            self._watch.disarm()
            pid = item.get("processId")
            if kind == "commandExecution" and str(pid).isdigit():
                self._commands[ident] = int(str(pid))
            what = item.get("command") or item.get("tool") or item.get("changes") or ""
            self.host.emit(
                ipc.Event(
                    activity="tool_start",
                    tool=tool,
                    text=preview(what),
                    input_digest=digest_fields(item, _ITEM_INPUT),
                )
            )
            return
        self._tools.discard(ident)
        self._commands.pop(ident, None)
        failed = item.get("status") in {"failed", "declined"} or item.get("exitCode") not in {
            None,
            0,
        }
        self.host.emit(
            ipc.Event(
                activity="tool_end",
                tool=tool,
                text="error" if failed else "ok",
                output_digest=digest_fields(item, _ITEM_OUTPUT),
                failed=failed,
            )
        )
        if failed and self._turn is not None:
            self._turn.tool_failed("codex", tool, item.get("aggregatedOutput"))
        if not self._tools:
            self._watch.arm()

    def _on_completed(self, turn: CliTurn, data: dict[str, Any]) -> None:
        status = data.get("status")
        if status == "interrupted":
            turn.finish(aborted=True)
        elif status == "failed":
            turn.fail(f"codex: {_error_text(data) or 'the turn failed'}")
            turn.finish()
        else:
            turn.finish()

    def _answer_server_request(self, record: dict[str, Any]) -> None:
        log.warning("codex asked %s; declining", record.get("method"))
        if self._nursery is not None and self._cli is not None:
            reply = {"id": record["id"], "result": {"decision": "decline"}}
            self._nursery.start_soon(self._cli.send, reply)

    # -- the Backend protocol --------------------------------------------------------------

    async def _begin(self, turn: CliTurn, message: str) -> None:
        # The stall watch is armed by turn/started, when Codex has begun the turn.
        params = {"threadId": self._thread, "input": [_text(message)]}
        reply = await self._request("turn/start", params)
        self._turn_id = str(((reply.get("result") or {}).get("turn") or {}).get("id", ""))
        if not self._turn_id:
            turn.fail(f"codex refused the turn: {_error_text(reply) or 'no reply'}")
            turn.finish()
        elif turn.stopping() and self._nursery is not None:
            self._nursery.start_soon(self._stop_turn)  # an abort came while turn/start flew

    def _after_turn(self) -> None:
        self._turn_id = ""
        self._tools.clear()
        _kill_commands(self._commands)

    async def _stop_turn(self) -> None:
        """``turn/interrupt``; kill app-server if the turn does not settle within the grace."""
        if not self._turn_id or self._cli is None:
            return  # turn/start is still in flight: run_turn interrupts once it has the id
        await self._request("turn/interrupt", {"threadId": self._thread, "turnId": self._turn_id})
        with trio.move_on_after(INTERRUPT_GRACE):
            if self._turn is not None:
                await self._turn.done.wait()
            return
        await self._cli.terminate()

    async def steer(self, text: str) -> None:
        if self._turn is None or not self._turn_id:
            raise ValueError("codex: no turn is running to steer")
        params = {
            "threadId": self._thread,
            "expectedTurnId": self._turn_id,
            "input": [_text(f"Steer from parent: {text}")],
        }
        reply = await self._request("turn/steer", params)
        if "result" not in reply:
            raise ValueError(f"codex refused the steer: {_error_text(reply) or 'no reply'}")


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _error_text(data: dict[str, Any]) -> str:
    error = data.get("error")
    if isinstance(error, dict):
        message = str(error.get("message") or "").strip()
        info = error.get("codexErrorInfo")
        if isinstance(info, str):
            message = f"{message} ({info})" if message else info
        return message.splitlines()[0][:300] if message else ""
    return str(error or "")[:300]


def _kill_commands(commands: dict[str, int]) -> None:
    """Kill the process trees of shell commands an interrupted turn left running."""
    for pid in commands.values():
        with contextlib.suppress(psutil.Error):
            tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            for process in tree:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(signal.SIGKILL)
    commands.clear()
