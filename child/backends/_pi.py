"""Backend ``pi``: Pi's RPC mode (``pi --mode rpc``), one process for the child's life.

Mapping (protocol facts: ``docs/backends.md``):

- prompt → ``prompt``; resume → another ``prompt`` to the same process (context kept);
- steer → ``steer`` (Pi delivers it before its next model call);
- pause / ask / stop → ``clear_queue`` (when this Pi has it) + ``abort``;
- a turn has settled on ``agent_settled`` where this Pi emits it (probed at start: the Pi that
  has ``clear_queue`` also settles with ``agent_settled``), else on ``agent_end`` — final only
  because retries are off in the generated ``settings.json``;
- ``extension_ui_request`` dialogs (``input``, ``select``, ``confirm``) go to the parent as a
  question when the loadout grants ``ask_parent``; any other dialog is cancelled at once (an
  unanswered dialog blocks Pi).

fleet's own tools (``ask_parent``, ``todo``, ``discuss``, ``subagent``) come from a Pi extension
shipped as package data (``child/pi_extension/fleet_tools.js``), which relays each call to the child
runtime through :class:`child.backends._mcp.ToolRelay` (Pi has no MCP client).

Pi keeps stdin open until settled (stdin EOF mid-turn exits at once without ``agent_end``).
Each child gets a private ``PI_CODING_AGENT_DIR`` with a generated ``models.json`` (for an
``openai:`` endpoint; the key is referenced by its variable *name*, Pi resolves it from the
environment) and ``settings.json``.
"""

import json
import logging
from pathlib import Path
from typing import Any, Final

import attrs
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
from child.backends._digest import digest
from child.backends._jsonl import Oversize
from child.backends._mcp import ToolRelay, relayed_tools
from child.backends._usage import pi_usage

log = logging.getLogger("child")

PI_TOOLS: Final = ("read", "bash", "edit", "write", "grep", "find", "ls")
MINIMUM: Final = Version(0, 73, 1)
PACKAGE: Final = "@earendil-works/pi-coding-agent (or @mariozechner/pi-coding-agent)"
#: Pi 0.73.1 answers ``get_state`` after ≈ 1 s; a cold Node start on a busy box takes longer.
READY_TIMEOUT: Final = 60.0
COMMAND_TIMEOUT: Final = 10.0
#: How long an aborted turn may take to settle before the process is killed.
ABORT_GRACE: Final = 10.0
_DIALOGS: Final = frozenset({"select", "confirm", "input", "editor"})
#: Registers fleet's own tools in Pi and relays their calls to us (shipped as package data).
EXTENSION: Final = Path(__file__).parent.parent / "pi_extension" / "fleet_tools.js"
_PROVIDER: Final = "fleet"


def pi_settings() -> dict[str, Any]:
    """``settings.json``: no retries (one HTTP 500 must be one failed turn, not a dozen
    requests and several ``agent_end``s)."""
    return {"retry": {"enabled": False, "provider": {"maxRetries": 0}}}


def pi_models(spec: ipc.ModelSpec) -> dict[str, Any]:
    """``models.json`` for an ``openai:MODEL@URL`` spec (an OpenAI-compatible endpoint)."""
    model = {
        "id": spec.name,
        "name": spec.name,
        "reasoning": False,
        "input": ["text"],
        "contextWindow": 128_000,
        "maxTokens": 16_384,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
    }
    provider = {
        "baseUrl": spec.base_url,
        "api": "openai-completions",
        # A variable name: Pi reads its value from the environment (the key stays off disk).
        # Without any apiKey Pi silently drops the provider.
        "apiKey": spec.api_key_env or "FLEET_NO_API_KEY",
        "models": [model],
    }
    return {"providers": {_PROVIDER: provider}}


def pi_argv(binary: str, loadout: ipc.Loadout, dirs: PrivateDirs) -> list[str]:
    # A resumable child's session file (in its own scratch) is what a revive continues.
    session = ["--session", loadout.resume] if loadout.resume else ["--no-session"]
    argv = [binary, "--mode", "rpc", *session]
    spec = loadout.model
    if spec.kind == "openai":
        argv += ["--provider", _PROVIDER, "--model", spec.name]
    elif spec.kind == "native" and spec.name:
        argv += ["--model", spec.name]
    tools = [tool for tool in loadout.tools if tool in PI_TOOLS] + relayed_tools(loadout.tools)
    argv += ["--tools", ",".join(tools)] if tools else ["--no-tools"]
    if relayed_tools(loadout.tools):
        argv += ["--extension", str(EXTENSION)]  # loads even with --no-extensions
    if loadout.effort:
        argv += ["--thinking", loadout.effort]
    if loadout.system_prompt:
        prompt = dirs.config / "system-prompt.md"
        prompt.write_text(loadout.system_prompt, encoding="utf-8")
        argv += ["--append-system-prompt", str(prompt)]
    return [*argv, "--no-extensions", "--no-skills", "--no-prompt-templates", "--no-themes"]


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        str(part.get("text", ""))
        for part in content
        if isinstance(part, dict) and part.get("type") == "text"
    )


@attrs.define(eq=False)
class _Pending:
    command: str
    done: trio.Event = attrs.Factory(trio.Event)
    reply: dict[str, Any] = attrs.Factory(dict)


@attrs.define(eq=False)
class PiBackend(CliBackend):
    """Backend ``pi``."""

    name: str = "pi"
    version: Version | None = None
    #: ``clear_queue`` and ``agent_settled`` (probed once the process is up).
    has_queue: bool = False
    _pending: dict[str, _Pending] = attrs.Factory(dict)
    _ids: int = 0
    _usage: ipc.Usage = attrs.Factory(ipc.Usage)
    _streamed: str = ""

    @classmethod
    def from_loadout(cls, loadout: ipc.Loadout, host: Host) -> "PiBackend":
        return cls(loadout=loadout, host=host, binary=binary_for("pi", "pi"), stall=stall_seconds())

    # -- the process ----------------------------------------------------------------------

    async def _start(self) -> CliProcess:
        if self._cli is not None:
            if self._cli.process.returncode is None:
                return self._cli
            raise self._gone()
        dirs = self._dirs = PrivateDirs.create(self.loadout.scratch, "pi")
        agent_dir = dirs.config / "pi"
        agent_dir.mkdir(mode=0o700)
        (agent_dir / "settings.json").write_text(json.dumps(pi_settings()))
        if self.loadout.model.kind == "openai":
            (agent_dir / "models.json").write_text(json.dumps(pi_models(self.loadout.model)))
        secrets = [*self.loadout.secret_env, self.loadout.model.api_key_env]
        extra = {"PI_CODING_AGENT_DIR": str(agent_dir), "PI_OFFLINE": "1"}
        if relayed_tools(self.loadout.tools):
            self._relay = ToolRelay.create(
                self.loadout.tools, self.host, self.loadout.workspace, dirs.root
            )
            extra |= self._relay.server_env()
        env = cli_environment(dirs, secrets=[name for name in secrets if name], extra=extra)
        self.version = await probe_version(
            "pi", self.binary, minimum=MINIMUM, package=PACKAGE, env=env
        )
        cli = self._cli = await CliProcess.start(
            "pi",
            pi_argv(self.binary, self.loadout, dirs),
            env=env,
            cwd=self.loadout.workspace,
            stderr_path=dirs.root / "stderr.log",
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, cli, nursery.cancel_scope)
            with trio.move_on_after(READY_TIMEOUT) as ready:
                # No ready event exists: the first answered command is the sign of life.
                await self._command({"type": "get_state"}, patience=float("inf"))
                probe = await self._command({"type": "clear_queue"}, patience=float("inf"))
                self.has_queue = bool(probe.get("success"))
            nursery.cancel_scope.cancel()
        if ready.cancelled_caught or cli.process.returncode is not None:
            await cli.terminate()
            detail = cli.stderr_line() or f"no answer to get_state within {READY_TIMEOUT:g} s"
            raise CliError(
                f"backend pi: {self.binary} did not start: {detail}",
                backend="pi",
                binary=self.binary,
            )
        log.info("pi %s ready (clear_queue/agent_settled: %s)", self.version, self.has_queue)
        return cli

    async def _command(
        self, message: dict[str, Any], *, patience: float = COMMAND_TIMEOUT
    ) -> dict[str, Any]:
        """Send a command and wait for its response (``{}`` when none came in time)."""
        assert self._cli is not None  # noqa: S101 - only called once started
        self._ids += 1
        ident = f"f{self._ids}"
        pending = self._pending[ident] = _Pending(command=str(message["type"]))
        try:
            await self._cli.send({**message, "id": ident})
            with trio.move_on_after(patience):
                await pending.done.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return {}
        finally:
            self._pending.pop(ident, None)
        return pending.reply

    async def _pump(self, cli: CliProcess, scope: trio.CancelScope) -> None:
        """Read Pi's records until EOF, dispatching each; EOF fails the turn."""
        while True:
            record = await cli.reader.receive()
            if record is None:
                break
            self._watch.touch()
            if isinstance(record, Oversize):
                record = {"type": record.kind}
            await self._dispatch(record)
        code = await cli.process.wait()
        detail = cli.stderr_line()
        for pending in self._pending.values():
            pending.done.set()
        if self._turn is not None:
            self._turn.fail(
                f"pi exited with code {code} mid-turn" + (f": {detail}" if detail else "")
            )
            self._turn.finish()
        scope.cancel()

    # -- records --------------------------------------------------------------------------

    async def _dispatch(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "response":
            self._on_response(record)
        elif kind == "extension_ui_request":
            await self._on_dialog(record)
        elif self._turn is not None:
            self._on_event(self._turn, str(kind), record)

    def _on_response(self, record: dict[str, Any]) -> None:
        ident = record.get("id")
        pending = self._pending.get(ident) if isinstance(ident, str) else None
        if pending is None:
            # An unknown command's response carries no id: match the oldest of that command.
            command = record.get("command")
            pending = next((p for p in self._pending.values() if p.command == command), None)
        if pending is not None and not pending.done.is_set():
            pending.reply = record
            pending.done.set()

    def _on_event(self, turn: CliTurn, kind: str, record: dict[str, Any]) -> None:
        emit = self.host.emit
        if kind == "message_update":
            update = record.get("assistantMessageEvent") or {}
            if update.get("type") == "text_delta":
                self._streamed += str(update.get("delta", ""))
                lines = self._streamed.strip().splitlines()
                emit(ipc.Event(activity="message", text=lines[-1][:120] if lines else ""))
        elif kind == "agent_start":
            self._watch.arm()
        elif kind == "message_start":
            self._streamed = ""
        elif kind == "message_end":
            self._on_message(turn, record.get("message") or {})
        elif kind == "tool_execution_start":
            self._watch.disarm()
            tool, args = str(record.get("toolName", "")), record.get("args", {})
            emit(
                ipc.Event(
                    activity="tool_start",
                    tool=tool,
                    text=preview(args),
                    input_digest=digest(args),
                )
            )
        elif kind == "tool_execution_update":
            emit(ipc.Event(activity="tool_update", tool=str(record.get("toolName", ""))))
        elif kind == "tool_execution_end":
            self._watch.arm()
            tool, failed = str(record.get("toolName", "")), bool(record.get("isError"))
            if failed:
                turn.tool_failed("pi", tool, record.get("result"))
            emit(
                ipc.Event(
                    activity="tool_end",
                    tool=tool,
                    text="error" if failed else "ok",
                    output_digest=digest(record.get("result")),
                    failed=failed,
                )
            )
        elif kind == "agent_settled" or (kind == "agent_end" and not self.has_queue):
            turn.finish(aborted=bool(record.get("aborted")))

    def _on_message(self, turn: CliTurn, message: dict[str, Any]) -> None:
        if message.get("role") != "assistant":
            return
        self._usage = pi_usage(self._usage, message)
        self.host.emit(ipc.Event(activity="usage", usage=self._usage))
        turn.text = _text_of(message)
        stop = message.get("stopReason")
        if stop == "error":
            detail = str(message.get("errorMessage") or "unknown error")
            turn.fail(f"pi: the model request failed: {detail}")
        elif stop == "aborted":
            turn.aborted = True

    async def _on_dialog(self, record: dict[str, Any]) -> None:
        method = record.get("method")
        if method not in _DIALOGS:
            return  # notify, setStatus, setWidget, ...: fire and forget
        ident = record.get("id")
        if "ask_parent" in self.loadout.tools and method != "editor" and self._nursery:
            self._nursery.start_soon(self._ask_parent, ident, method, record)
            return
        await self._reply_dialog({"id": ident, "cancelled": True})

    async def _ask_parent(self, ident: object, method: str, record: dict[str, Any]) -> None:
        title = str(record.get("title") or record.get("message") or "The agent asks")
        options = [str(o) for o in record.get("options") or []]
        question = title
        if method == "select" and options:
            question += " (one of: " + "; ".join(options) + ")"
        elif method == "confirm":
            question += f" {record.get('message') or ''} (yes or no)".rstrip()
        self._watch.disarm()
        try:
            answer = (await self.host.ask_parent(question)).strip()
        finally:
            self._watch.arm()
        reply: dict[str, Any] = {"id": ident}
        if method == "confirm":
            reply["confirmed"] = answer.lower().startswith(("y", "ok", "true"))
        elif method == "select":
            match = next((o for o in options if o.lower() == answer.lower()), None)
            reply |= {"value": match} if match is not None else {"cancelled": True}
        else:
            reply["value"] = answer
        await self._reply_dialog(reply)

    async def _reply_dialog(self, reply: dict[str, Any]) -> None:
        if self._cli is not None:
            try:
                await self._cli.send({"type": "extension_ui_response", **reply})
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                log.info("pi went away before a dialog answer")

    # -- the Backend protocol --------------------------------------------------------------

    async def _begin(self, turn: CliTurn, message: str) -> None:
        # The stall watch is armed by agent_start: Node's pace before it is not model time.
        reply = await self._command({"type": "prompt", "message": message})
        if not reply.get("success"):
            turn.fail(f"pi refused the prompt: {reply.get('error') or 'no response'}")
            turn.finish()

    async def _stop_turn(self) -> None:
        """``clear_queue`` + ``abort``; kill Pi if it does not settle within the grace."""
        if self._cli is None:
            return
        if self.has_queue:
            await self._command({"type": "clear_queue"})
        await self._command({"type": "abort"}, patience=ABORT_GRACE)
        if self._turn is not None and not self._turn.done.is_set():
            await self._cli.terminate()

    async def steer(self, text: str) -> None:
        if self._cli is None or self._turn is None:
            raise ValueError("pi: no turn is running to steer")
        reply = await self._command({"type": "steer", "message": text})
        if not reply.get("success"):
            raise ValueError(f"pi refused the steer: {reply.get('error') or 'no response'}")
