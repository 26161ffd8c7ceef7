"""The ``scripted`` model: a YAML file of model turns, deterministic, for tests and the demo.

The format is documented in ``docs/scripted-model.md``. In short::

    turns:                 # one entry per prompt (spawn, then each resume)
      - steps:
          - say: "Looking around"                 # streamed text (an activity event)
          - tool: read                            # one tool call ...
            args: {path: README.md}
          - tools: [{name: ls, args: {}}, ...]    # ... or several at once
          - wait: 2                               # think for 2 s (until: steer ends it early)
          - branch: {steered: [...], default: [...]}   # steps depend on a steer this turn
          - events: 50                            # emit N activity events
          - hang: true                            # silent forever
          - crash: 3                              # exit the process with this code
          - reply: "## Summary ... {{last}}"      # final text; ends the turn
    side:                  # answers to side questions (fleet ask), in order
      - steps: [{reply: "..."}]

Templates in ``say``/``reply``/tool ``args`` strings: ``{{last}}`` (the last tool result),
``{{tool:NAME}}`` (the last result of tool NAME),
``{{steer}}`` (the last steer), ``{{task}}`` (this turn's prompt), ``{{turn}}``,
``{{nonce}}`` (the democracy-round nonce in this turn's prompt).
"""

import os
import re
from collections import deque
from pathlib import Path
from typing import Any, Final

import attrs
import trio
import yaml

import ipc
from child.backends.builtin._model import ModelError, ModelStep, StepContext, ToolCall

# libyaml's loader when PyYAML has it: the pure-Python one costs a child ~8 ms per script.
_LOADER: Final = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_STEP_KEYS = frozenset(
    {"say", "tool", "tools", "wait", "until", "branch", "events", "hang", "crash", "reply", "args"}
)


def _check_steps(steps: object, where: str) -> list[dict[str, Any]]:
    if not isinstance(steps, list):
        raise ModelError(f"script {where}: steps must be a list")
    for index, step in enumerate(steps):
        here = f"{where}[{index}]"
        if not isinstance(step, dict) or not step:
            raise ModelError(f"script {here}: each step is a mapping such as {{reply: text}}")
        unknown = set(step) - _STEP_KEYS
        if unknown:
            raise ModelError(f"script {here}: unknown key {min(unknown)!r}")
        branch = step.get("branch")
        if branch is not None:
            if not isinstance(branch, dict):
                raise ModelError(f"script {here}.branch: must map steered/default to steps")
            for arm in ("steered", "default"):
                _check_steps(branch.get(arm, []), f"{here}.branch.{arm}")
    return steps


def _turns(data: dict[str, Any], key: str) -> list[list[dict[str, Any]]]:
    raw = data.get(key, [])
    if not isinstance(raw, list):
        raise ModelError(f"script: {key} must be a list of {{steps: [...]}}")
    turns = []
    for index, turn in enumerate(raw):
        if not isinstance(turn, dict) or "steps" not in turn:
            raise ModelError(f"script: {key}[{index}] must be a mapping with steps")
        turns.append(_check_steps(turn["steps"], f"{key}[{index}].steps"))
    return turns


def load_script(path: str | os.PathLike[str]) -> tuple[list[list[dict[str, Any]]], ...]:
    """Read and validate a script file; returns (turns, side)."""
    try:
        data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_LOADER)  # noqa: S506 - a safe loader
    except OSError as exc:
        raise ModelError(f"script {path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ModelError(f"script {path}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ModelError(f"script {path}: top level must be a mapping with turns")
    unknown = set(data) - {"turns", "side"}
    if unknown:
        raise ModelError(f"script {path}: unknown key {min(unknown)!r}")
    return _turns(data, "turns"), _turns(data, "side")


_TOOL_REF = re.compile(r"\{\{tool:([A-Za-z0-9_]+)\}\}")
# The ballot format line of a democracy round's voter prompt: a script cannot know the fresh
# nonce in advance, so it takes it from there.
_BALLOT_FORMAT = re.compile(r"^BALLOT (\S+) <option-id> <rationale>$", re.MULTILINE)


def _last_result(messages: list[dict[str, Any]], tool: str | None = None) -> str:
    """The newest tool result (of *tool*, when named) in the conversation."""
    names = {
        call["id"]: call["function"]["name"]
        for message in messages
        for call in message.get("tool_calls") or ()
    }
    for message in reversed(messages):
        if message["role"] == "tool" and (
            tool is None or names.get(message.get("tool_call_id", "")) == tool
        ):
            return str(message.get("content", ""))
    return ""


def _render(value: Any, ctx: StepContext) -> Any:
    if isinstance(value, str):
        last = _last_result(ctx.messages)
        steers = ctx.steers.seen + ctx.steers.pending
        steer = steers[-1] if steers else ""
        ballot = _BALLOT_FORMAT.search(ctx.task)
        value = _TOOL_REF.sub(lambda m: _last_result(ctx.messages, m.group(1)), value)
        return (
            value.replace("{{last}}", last)
            .replace("{{steer}}", steer)
            .replace("{{task}}", ctx.task)
            .replace("{{turn}}", str(ctx.turn))
            .replace("{{nonce}}", ballot.group(1) if ballot else "")
        )
    if isinstance(value, dict):
        return {k: _render(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, ctx) for v in value]
    return value


@attrs.define(eq=False)
class ScriptedModel:
    """Plays a script; one instance per child, so turns advance across resumes."""

    turns: list[list[dict[str, Any]]]
    side: list[list[dict[str, Any]]]
    _queue: deque[dict[str, Any]] = attrs.field(factory=deque, init=False)
    _turn: int = attrs.field(default=0, init=False)
    _side_used: int = attrs.field(default=0, init=False)
    _calls: int = attrs.field(default=0, init=False)
    _active_key: tuple[int, bool] | None = attrs.field(default=None, init=False)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> "ScriptedModel":
        turns, side = load_script(path)
        return cls(turns=turns, side=side)

    def _begin(self, ctx: StepContext) -> None:
        key = (ctx.turn, ctx.side)
        if self._active_key == key:
            return
        self._active_key = key
        if ctx.side:
            steps = self.side[self._side_used] if self._side_used < len(self.side) else None
            self._side_used += 1
            default = "No scripted answer to that side question."
        else:
            steps = self.turns[self._turn] if self._turn < len(self.turns) else None
            self._turn += 1
            default = "## Summary\nThe script has no more turns.\n"
        self._queue = deque(steps if steps is not None else [{"reply": default}])

    async def step(self, ctx: StepContext) -> ModelStep:
        self._begin(ctx)
        while self._queue:
            step = self._queue.popleft()
            result = await self._play(step, ctx)
            if result is not None:
                return result
        # A script that runs out of steps without a reply ends the turn with the last text.
        return ModelStep(text=_render("{{last}}", ctx))

    async def _play(self, step: dict[str, Any], ctx: StepContext) -> ModelStep | None:
        if "say" in step:
            ctx.emit(ipc.Event(activity="message", text=str(_render(step["say"], ctx))))
            return None
        if "wait" in step:
            seconds = float(step["wait"])
            if step.get("until") == "steer":
                # A steer that joined the conversation just before this step counts: it came
                # while the previous step ran, which is when a steer is meant to arrive.
                if ctx.steers.fresh or ctx.steers.pending:
                    return None
                with trio.move_on_after(seconds):
                    await ctx.steers.arrived.wait()
            else:
                await trio.sleep(seconds)
            return None
        if "branch" in step:
            arm = "steered" if ctx.steers.seen or ctx.steers.pending else "default"
            self._queue.extendleft(reversed(step["branch"].get(arm, [])))
            return None
        if "events" in step:
            for index in range(int(step["events"])):
                ctx.emit(ipc.Event(activity="message", text=f"event {index + 1}"))
                await trio.lowlevel.checkpoint()
            return None
        if step.get("hang"):
            await trio.sleep_forever()
        if "crash" in step:
            os._exit(int(step["crash"]))
        if "tool" in step or "tools" in step:
            calls = step.get("tools") or [{"name": step["tool"], "args": step.get("args", {})}]
            built = []
            for call in calls:
                self._calls += 1
                args = _render(call.get("args", {}), ctx)
                built.append(ToolCall(id=f"call_{self._calls}", name=call["name"], args=args))
            return ModelStep(tool_calls=tuple(built), usage=ipc.Usage(tokens=10 * len(built)))
        if "reply" in step:
            text = str(_render(step["reply"], ctx))
            return ModelStep(text=text, usage=ipc.Usage(tokens=max(1, len(text) // 4)))
        raise ModelError(f"script step {step!r} does nothing")

    async def aclose(self) -> None:
        return None
