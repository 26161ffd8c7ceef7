"""From a spawn request and an agent definition to what a child's loadout will say.

Everything that can refuse a spawn without side effects happens here — unknown agent, bad
mode, a model that cannot be found, the workflow-mode toolset gate — so a batch is validated
whole before anything is reserved or launched.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

import ipc
from orchestrator._agents import AgentDefinition
from orchestrator._config import Config
from orchestrator._errors import NotFound, PolicyError, UsageError
from orchestrator._policy import MUTATING_TOOLS, WORKTREE_TOOLS, validate_toolset
from orchestrator._sandboxing import policy_for

CHILD_MODES = ("scout", "fork", "worktree")
BACKENDS = ("builtin", "command")


@attrs.frozen(kw_only=True)
class SpawnRequest:
    """One task to delegate (``fleet spawn`` / the API)."""

    task: str
    agent: str = "scout"
    mode: str | None = None
    name: str | None = None
    backend: str | None = None
    model: str | None = None
    command: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "SpawnRequest":
        """From a ``--batch`` JSON entry; unknown keys are an error."""
        known = {"task", "agent", "mode", "name", "backend", "model", "command"}
        unknown = set(data) - known
        if unknown:
            raise UsageError(f"spawn: unknown batch key {min(unknown)!r}")
        task = data.get("task")
        if not isinstance(task, str) or not task.strip():
            raise UsageError("spawn: every batch entry needs a non-empty task")
        command = data.get("command") or ()
        if not isinstance(command, (list, tuple)) or not all(isinstance(c, str) for c in command):
            raise UsageError("spawn: command must be a list of strings")
        fields = {k: data.get(k) for k in ("agent", "mode", "name", "backend", "model")}
        for key, value in fields.items():
            if value is not None and not isinstance(value, str):
                raise UsageError(f"spawn: {key} must be a string")
        return cls(
            task=task,
            agent=fields["agent"] or "scout",
            mode=fields["mode"],
            name=fields["name"],
            backend=fields["backend"],
            model=fields["model"],
            command=tuple(command),
        )


@attrs.frozen(kw_only=True)
class Plan:
    agent: str
    name: str | None
    mode: str
    task: str
    loadout_fields: dict[str, Any]


def parse_model(text: str, workspace: Path) -> ipc.ModelSpec:
    """``scripted:PATH`` or ``openai:MODEL[@BASE_URL]`` into a model spec."""
    kind, _, rest = text.partition(":")
    if kind == "scripted" and rest:
        path = Path(rest).expanduser()
        path = path if path.is_absolute() else workspace / path
        if not path.is_file():
            raise UsageError(f"spawn: model script {path} does not exist")
        return ipc.ModelSpec(kind="scripted", script=str(path.resolve()))
    if kind == "openai" and rest:
        name, _, base_url = rest.partition("@")
        return ipc.ModelSpec(
            kind="openai",
            name=name,
            base_url=base_url or "https://api.openai.com/v1",
            api_key_env="OPENAI_API_KEY",
        )
    raise UsageError(f"spawn: model {text!r} is not scripted:PATH or openai:MODEL[@URL]")


def plan_spawn(
    request: SpawnRequest,
    *,
    definitions: Mapping[str, AgentDefinition],
    config: Config,
    workflow_mode: str,
) -> Plan:
    """Validate *request* against its definition and the policy; no side effects."""
    if not request.task.strip():
        raise UsageError("spawn: the task is empty")
    definition = definitions.get(request.agent)
    if definition is None:
        names = ", ".join(sorted(definitions)) or "none"
        raise NotFound(f"spawn: no agent definition {request.agent!r} (known: {names})")
    mode = request.mode or definition.mode
    if mode not in CHILD_MODES:
        raise UsageError(f"spawn: mode {mode!r} is not one of {', '.join(CHILD_MODES)}")
    backend = request.backend or definition.backend
    if backend not in BACKENDS:
        raise UsageError(f"spawn: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    tools = list(definition.tools)
    if mode in {"scout", "fork"} and MUTATING_TOOLS & set(tools):
        if mode == "scout" or definition.mode == "scout":
            raise PolicyError(
                f"spawn: {definition.name} is a scout and may not hold mutating tools"
            )
        tools = [t for t in tools if t not in MUTATING_TOOLS]
    if mode == "worktree":
        tools = [t for t in WORKTREE_TOOLS if t in set(tools) | {"todo", "discuss"}]
    if "subagent" not in tools and definition.subagent_agents and mode != "scout":
        tools.append("subagent")
    validate_toolset(workflow_mode, definition.name, tools, backend)
    model_text = request.model or definition.model or config.model
    model = ipc.ModelSpec()
    command: list[str] = []
    if backend == "builtin":
        if not model_text:
            raise UsageError(
                "spawn: no model configured for the builtin agent (pass --model "
                "scripted:FILE or openai:MODEL, or set FLEET_MODEL)"
            )
        model = parse_model(model_text, config.workspace)
    elif backend == "command":
        command = list(request.command)
        if not command:
            raise UsageError("spawn: the command backend needs --command ARGV")
    return Plan(
        agent=definition.name,
        name=request.name,
        mode=mode,
        task=request.task,
        loadout_fields={
            "backend": backend,
            "model": model,
            "command": command,
            "tools": tools,
            "system_prompt": definition.prompt,
            "mode": mode,
            "subagent_agents": list(definition.subagent_agents),
            "ownership": list(definition.ownership),
            "sandbox": policy_for(mode, definition.sandbox),
        },
    )
