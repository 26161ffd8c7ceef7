"""From a spawn request and an agent definition to what a child's loadout will say.

Everything that can refuse a spawn without side effects happens here — unknown agent, bad
mode, a model that cannot be found, the workflow-mode toolset gate — so a batch is validated
whole before anything is reserved or launched.
"""

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

import ipc
from orchestrator._config import Config
from orchestrator._errors import NotFound, PolicyError, UsageError
from orchestrator._records import SpawnRequest
from orchestrator.definitions import AgentDefinition
from orchestrator.governance._checked import check_schema
from orchestrator.governance._policy import MUTATING_TOOLS, WORKTREE_TOOLS, validate_toolset
from orchestrator.launch._sandboxing import egress_allowlist, policy_for
from orchestrator.spend._modelroles import choose_role
from orchestrator.spend._roles import RoleEntry

CHILD_MODES = ("scout", "fork", "worktree")
SURFACES = ("process", "tmux", "tmux:current", "cmux", "ray")
BACKENDS = ("builtin", "pi", "claude", "codex", "command")
#: Which model kinds each backend can use; ``native`` = a name handed to the CLI as is.
MODEL_KINDS = {
    "builtin": ("scripted", "openai"),
    "pi": ("openai", "native"),
    "claude": ("anthropic", "native"),
    "codex": ("openai", "native"),
}


@attrs.frozen(kw_only=True)
class Plan:
    agent: str
    name: str | None
    mode: str
    task: str
    surface: str
    loadout_fields: dict[str, Any]
    #: The model role it runs on ("" for none) and the model it starts on ("" for the CLI's).
    role: str = ""
    model_label: str = ""
    #: The JSON Schema its result must satisfy (the spawn's, else its definition's).
    schema: dict[str, Any] | None = None


def parse_model(text: str, workspace: Path, backend: str = "builtin") -> ipc.ModelSpec:
    """A model for *backend* from ``scripted:PATH``, ``openai:MODEL[@BASE_URL]``,
    ``anthropic:MODEL[@BASE_URL]``, or (agent CLIs) a bare name the CLI resolves itself.

    ``openai`` base URLs include the ``/v1`` (OpenAI's convention); ``anthropic`` ones do not
    (Anthropic's). The API key is named, never given: ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``.
    """
    kinds = MODEL_KINDS.get(backend, ())
    kind, _, rest = text.partition(":")
    if kind not in {"scripted", "openai", "anthropic"} or not rest:
        kind, rest = "native", text
    if kind not in kinds:
        usable = " or ".join(f"{k}:..." if k != "native" else "a bare model name" for k in kinds)
        raise UsageError(f"spawn: model {text!r} cannot drive backend {backend} (use {usable})")
    if kind == "scripted":
        path = Path(rest).expanduser()
        path = path if path.is_absolute() else workspace / path
        if not path.is_file():
            raise UsageError(f"spawn: model script {path} does not exist")
        return ipc.ModelSpec(kind="scripted", script=str(path.resolve()))
    if kind == "openai":
        name, _, base_url = rest.partition("@")
        return ipc.ModelSpec(
            kind="openai",
            name=name,
            base_url=base_url or "https://api.openai.com/v1",
            api_key_env="OPENAI_API_KEY",
        )
    if kind == "anthropic":
        name, _, base_url = rest.partition("@")
        return ipc.ModelSpec(
            kind="anthropic", name=name, base_url=base_url, api_key_env="ANTHROPIC_API_KEY"
        )
    return ipc.ModelSpec(kind="native", name=rest)


def plan_spawn(
    request: SpawnRequest,
    *,
    definitions: Mapping[str, AgentDefinition],
    config: Config,
    workflow_mode: str,
    roles: Mapping[str, RoleEntry] | None = None,
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
    surface = request.surface or config.surface
    if surface not in SURFACES:
        raise UsageError(f"spawn: surface {surface!r} is not one of {', '.join(SURFACES)}")
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
    choice = None
    if backend in MODEL_KINDS:
        choice = choose_role(
            request_model=request.model,
            request_role=request.role,
            definition_model=definition.model,
            definition_role=definition.role,
            mode=mode,
            backend=backend,
            roles=roles or {},
        )
    if choice is None and (request.model or "").startswith("@"):
        request = attrs.evolve(request, model=None)  # an unassigned role: the current model
    definition_model = definition.model
    if definition_model and definition_model.startswith("@"):
        definition_model = None
    effort = definition.effort or ""
    models: list[ipc.ModelChoice] = []
    if choice is not None:
        models = [
            ipc.ModelChoice(
                spec=c.spec,
                model=parse_model(c.model_text(backend), config.workspace, backend),
                effort=c.effort or effort,
            )
            for c in choice.candidates
        ]
        request = attrs.evolve(request, model=choice.candidates[0].model_text(backend))
        effort = models[0].effort
    model_text = request.model or definition_model or config.model
    model = ipc.ModelSpec()
    command: list[str] = []
    if backend == "builtin":
        if not model_text:
            raise UsageError(
                "spawn: no model configured for the builtin agent (pass --model "
                "scripted:FILE or openai:MODEL, or set FLEET_MODEL and restart the supervisor: "
                "fleet serve --stop)"
            )
        model = parse_model(model_text, config.workspace)
    elif backend in MODEL_KINDS:
        # FLEET_MODEL configures the builtin agent; an agent CLI keeps its own default.
        cli_model = request.model or definition_model
        model = (
            parse_model(cli_model, config.workspace, backend)
            if cli_model
            else ipc.ModelSpec(kind="native")
        )
    elif backend == "command":
        command = list(request.command)
        if not command:
            raise UsageError("spawn: the command backend needs --command ARGV")
    schema = definition.schema if request.schema is None else request.schema
    if schema is not None:
        schema = check_schema(schema, source="spawn: schema")
    return Plan(
        schema=schema,
        agent=definition.name,
        name=request.name,
        mode=mode,
        task=request.task,
        surface=surface,
        role=choice.role if choice is not None else "",
        model_label=models[0].spec
        if models
        else (request.model or definition_model or (model_text if backend == "builtin" else ""))
        or "",
        loadout_fields={
            "backend": backend,
            "model": model,
            "command": command,
            "tools": tools,
            "system_prompt": definition.prompt,
            "mode": mode,
            "subagent_agents": list(definition.subagent_agents),
            "ownership": list(definition.ownership),
            "secret_env": list(definition.env),
            "effort": effort,
            "models": models,
            "sandbox": policy_for(mode, definition.sandbox),
            # Every candidate's endpoint: a fallback must be reachable from the sandbox too.
            "egress": list(
                dict.fromkeys(
                    endpoint
                    for spec in [model, *(m.model for m in models[1:])]
                    for endpoint in egress_allowlist(
                        backend, spec, named=definition.egress, gateways=config.egress
                    )
                )
            ),
        },
    )


def resume_id(backend: str, scratch: Path) -> str:
    """What a revive of a *backend* child resumes from, chosen before its launch so the journal
    has it before the first prompt: the builtin agent's transcript file, a Claude Code session
    id, a Pi session file; "" for a backend that cannot be revived."""
    if backend == "builtin":
        return str(scratch / "transcript.json")
    if backend == "claude":
        return str(uuid.uuid4())
    if backend == "pi":
        return str(scratch / "pi-session.jsonl")
    return ""
