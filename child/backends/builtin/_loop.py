"""The builtin agent: a model decides, this loop executes the tools for real.

The conversation lives as long as the child, so a resume continues the same context. A steer
joins the conversation before the next model step. An abort cancels the turn wherever it is
(a model call, a tool) and the turn settles as aborted.

A background event (a ``shell`` watch that matched) reaches the model as a user line before its
next step; with no turn running it waits for the next one and an ``activity="wake"`` event asks
the supervisor to start it.
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

import ipc
from child.backends._base import RESTARTED, Host, TurnAborted, TurnResult
from child.backends._digest import digest
from child.backends._host_tools import HOST_TOOLS, build_host_tools
from child.backends._usage import accumulate
from child.backends.builtin._model import Model, ModelError, SteerInbox, StepContext
from child.backends.builtin._transcript import load_transcript, save_transcript
from child.tools import Progress, Tool, ToolContext, build_tools
from child.tools._shell import ShellTool

MAX_STEPS = 200
#: The longest transcript a turn's result carries (its ``Settled`` must fit one frame: the
#: transcript is ASCII, and JSON escapes at most double it); a longer one is fetched.
INLINE_MAX = 384 * 1024
_ARG_PREVIEW = 80
_WAKE_TEXT = 200


def make_model(spec: ipc.ModelSpec, workspace: Path, effort: str = "") -> Model:
    """The model a loadout names (*effort*: the loadout's, for a model that has one)."""
    if spec.kind == "scripted":
        from child.backends.builtin._scripted import ScriptedModel  # noqa: PLC0415 - YAML only when it is used

        script = Path(spec.script)
        return ScriptedModel.from_file(script if script.is_absolute() else workspace / script)
    if spec.kind == "openai":
        from child.backends.builtin._openai import OpenAIModel  # noqa: PLC0415 - httpx only when it is used

        return OpenAIModel.from_spec(spec, effort=effort)
    raise ModelError(f"model kind {spec.kind!r} is not known (use scripted or openai)")


def _preview(args: Mapping[str, Any]) -> str:
    text = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= _ARG_PREVIEW else text[: _ARG_PREVIEW - 1] + "…"


def _to_ipc(progress: Progress) -> ipc.Progress:
    return ipc.Progress(
        done=progress.done,
        total=progress.total,
        current=progress.current,
        next=list(progress.next),
    )


@attrs.define(eq=False)
class Notes:
    """Background events for the model, delivered at its next step."""

    host: Host
    pending: list[str] = attrs.Factory(list)
    busy: bool = False

    def put(self, text: str) -> None:
        self.pending.append(text)
        self.wake()

    def wake(self) -> None:
        """No turn runs to show the pending notes: ask the supervisor for one."""
        if self.pending and not self.busy:
            self.host.emit(ipc.Event(activity="wake", text=self.pending[-1][:_WAKE_TEXT]))

    def drain(self, messages: list[dict[str, Any]]) -> None:
        messages.extend({"role": "user", "content": f"[background] {n}"} for n in self.pending)
        self.pending.clear()


@attrs.define(eq=False)
class BuiltinBackend:
    """Backend ``builtin``."""

    model: Model
    tools: dict[str, Tool]
    host: Host
    ctx: ToolContext
    messages: list[dict[str, Any]]
    notes: Notes
    name: str = "builtin"
    steers: SteerInbox = attrs.Factory(SteerInbox)
    #: Where the conversation is saved after each turn (``None``: it is not).
    transcript: Path | None = None
    restarted: bool = False
    #: Each turn's result carries the transcript saved (a child on a node: ``context_inline``)
    #: when it is at most :data:`INLINE_MAX` characters.
    inline: bool = False
    _scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _turn: int = attrs.field(default=0, init=False)
    _usage: ipc.Usage = attrs.field(factory=ipc.Usage, init=False)
    _abort_pending: bool = attrs.field(default=False, init=False)
    #: The loop gate stopped the child (:class:`TurnAborted`): no model step follows.
    _stopped: str = attrs.field(default="", init=False)

    @classmethod
    def from_loadout(cls, loadout: ipc.Loadout, host: Host) -> "BuiltinBackend":
        workspace = Path(loadout.workspace)

        async def may_write(path: Path) -> str | None:
            return await host.ownership([str(path)])

        def on_progress(progress: Progress) -> None:
            host.emit(ipc.Event(activity="todo", progress=_to_ipc(progress)))

        state_dir = loadout.state_dir or os.environ.get("FLEET_HOME")
        notes = Notes(host)
        ctx = ToolContext(
            workspace=workspace,
            may_write=may_write,
            on_progress=on_progress,
            notify=notes.put,
            state_dir=Path(state_dir) if state_dir else None,
            fenced=tuple(Path(path) for path in loadout.fenced),
            own=(loadout.scratch,) if loadout.scratch else (),
        )
        names = set(loadout.tools)
        tools: dict[str, Tool] = dict(build_tools(sorted(names - HOST_TOOLS), ctx))
        tools.update(build_host_tools(names & HOST_TOOLS, host))
        transcript = Path(loadout.resume) if loadout.resume else None
        messages = [{"role": "system", "content": loadout.system_prompt}]
        if transcript is not None and loadout.restarted:
            messages = load_transcript(transcript)
        return cls(
            model=make_model(loadout.model, workspace, loadout.effort),
            tools=tools,
            host=host,
            ctx=ctx,
            messages=messages,
            transcript=transcript,
            restarted=loadout.restarted,
            inline=loadout.context_inline,
            notes=notes,
        )

    def _schemas(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
            for tool in self.tools.values()
        ]

    async def run_turn(self, text: str, *, side: bool = False) -> TurnResult:
        result = await self._turn_of(text, side=side)
        # After each turn that ended (an aborted one too); a turn cut short by the child's own
        # end is not saved: a revive starts from the last turn that ended.
        if self.transcript is not None:
            saved = await self._save()
            if self.inline and not side and saved is not None and len(saved) <= INLINE_MAX:
                result = attrs.evolve(result, context={self.transcript.name: saved})
        return result

    async def _save(self) -> str | None:
        """The transcript saved (its text), or ``None`` when it could not be."""
        assert self.transcript is not None  # noqa: S101 - only called with one
        saved = None
        try:
            with trio.CancelScope(shield=True):
                saved = await trio.to_thread.run_sync(
                    save_transcript, self.transcript, self.messages
                )
        except (OSError, ipc.LoadoutError) as exc:  # a full disk costs the revive, not the turn
            why = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
            self.host.emit(ipc.Event(activity="status", text=f"transcript not saved: {why}"))
        return saved

    async def _turn_of(self, text: str, *, side: bool) -> TurnResult:
        if not side:
            self._turn += 1
            self.notes.drain(self.messages)  # what happened while idle comes before the prompt
        content = (
            f"By the way (a side question; answer it briefly and do not resume your task): {text}"
            if side
            else text
        )
        restarted, mark = self.restarted, len(self.messages)
        if self.restarted:
            content, self.restarted = f"{RESTARTED}\n{content}", False
        self.messages.append({"role": "user", "content": content})
        self.steers.new_turn()
        self._stopped = ""
        if self._abort_pending:  # the abort arrived before the turn began
            self._abort_pending = False
            return TurnResult(text="", ok=True, aborted=True)
        with trio.CancelScope() as scope:
            self._scope = scope
            self.notes.busy = True
            try:
                return await self._loop(text, side=side)
            except ModelError as exc:
                # The turn is undone: a retry (a role's fallback) sends the prompt once, not
                # twice; what its tools did stays done.
                del self.messages[mark:]
                self.restarted = restarted
                return TurnResult(text="", ok=False, error=f"model: {exc}")
            finally:
                self._scope = None
                self.notes.busy = False
                self.notes.wake()  # a note the turn's last step missed
        return TurnResult(text="", ok=True, aborted=True)

    async def _loop(self, task: str, *, side: bool) -> TurnResult:
        ctx = StepContext(
            messages=self.messages,
            tools=self._schemas(),
            turn=self._turn,
            side=side,
            task=task,
            steers=self.steers,
            emit=self.host.emit,
        )
        for _ in range(MAX_STEPS):
            for steer in self.steers.drain():
                self.messages.append({"role": "user", "content": f"Steer from parent: {steer}"})
            if not side:
                self.notes.drain(self.messages)
            step = await self.model.step(ctx)
            if step.usage is not None:
                # A step's usage (and cost) is its own; the child reports its life's total.
                self._usage = accumulate(self._usage, step.usage)
                self.host.emit(ipc.Event(activity="usage", usage=self._usage))
            if not step.tool_calls:
                self.messages.append({"role": "assistant", "content": step.text})
                return TurnResult(text=step.text)
            self.messages.append(
                {
                    "role": "assistant",
                    "content": step.text or None,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": json.dumps(call.args)},
                        }
                        for call in step.tool_calls
                    ],
                }
            )
            for call in step.tool_calls:
                result_text = await self._run_tool(call.name, call.args)
                self.messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": result_text}
                )
                if self._stopped:
                    # The supervisor is stopping this child: its abort ends the turn (the
                    # scope above), and until then the model is asked nothing.
                    await trio.sleep_forever()
        return TurnResult(text="", ok=False, error=f"turn exceeded {MAX_STEPS} model steps")

    async def _run_tool(self, name: str, args: dict[str, Any]) -> str:
        tool = self.tools.get(name)
        start = ipc.Event(
            activity="tool_start", tool=name, text=_preview(args), input_digest=digest(args)
        )
        # The supervisor's loop gate sees the call before it runs, and may refuse it; it sees
        # the result before the next model step, and may stop the child on it.
        try:
            refused = await self.host.check_tool(start)
        except TurnAborted as stop:
            self._stopped = str(stop)
            return f"error: this {name} call ({_preview(args)}) was refused: {stop}"
        if refused is not None:
            return f"error: this {name} call ({_preview(args)}) was refused: {refused}"
        if tool is None:
            text, is_error = f"{name}: no such tool here (available: {sorted(self.tools)})", True
        else:
            result = await tool.run(self.ctx, args)
            text, is_error = result.text, result.is_error
        end = ipc.Event(
            activity="tool_end",
            tool=name,
            text="error" if is_error else "ok",
            output_digest=digest(text),
            failed=is_error,
        )
        try:
            await self.host.check_tool(end)
        except TurnAborted as stop:
            self._stopped = str(stop)
        return text

    async def steer(self, text: str) -> None:
        self.steers.put(text)

    async def abort(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
        else:
            self._abort_pending = True

    async def switch_model(self, loadout: ipc.Loadout) -> None:
        """Go on with *loadout*'s model (a role's fallback), keeping the conversation."""
        old, self.model = self.model, make_model(loadout.model, self.ctx.workspace, loadout.effort)
        await old.aclose()

    async def aclose(self) -> None:
        shell = self.tools.get("shell")
        if isinstance(shell, ShellTool):
            await shell.aclose()  # every background shell dies with the child
        await self.model.aclose()
