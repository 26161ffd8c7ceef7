"""How the supervisor puts a child in an OS sandbox, and when it refuses to run one without.

Scouts and forks run under ``read_only`` (or ``review`` when their definition asks), workers
under ``worker`` with their worktree writable. No sandboxed child has the network: one that
talks to a model reaches the ``host:port`` pairs of its allowlist (:func:`egress_allowlist`)
through its egress proxy (``_egress``), whose socket is bound into the sandbox. When no
sandbox launcher works, a child whose *only* enforcement is the sandbox — one with a shell, or
an external agent CLI — is refused unless the user allowed unsandboxed runs; a builtin child
with read-only tools is still confined by its tools, so it runs unwrapped and ``peek`` and its
handoff say so.
"""

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import attrs

import ipc
import sandbox
from orchestrator._config import Config
from orchestrator._errors import PolicyError, UsageError
from orchestrator.launch._egress import EgressError, allowlist

POLICIES = {p.value: p for p in sandbox.Policy}
#: Where a CLI goes when its model names no base URL (Pi's provider is its own: name it in
#: the definition's ``egress:``).
DEFAULT_ENDPOINTS: Final = {
    "claude": ("api.anthropic.com:443",),
    "codex": ("api.openai.com:443", "chatgpt.com:443"),
}
#: The child's runtime starts its egress relay when this names the proxy socket (the same
#: name as ``child._egress.SOCKET_ENV``; the orchestrator may not import ``child``).
EGRESS_SOCKET_ENV: Final = "FLEET_EGRESS_SOCKET"
_SCHEME_PORTS: Final = {"http": 80, "https": 443}


def policy_for(mode: str, requested: str | None) -> str:
    """The sandbox policy name for a child of *mode*, honouring a definition's request."""
    if requested is not None:
        if requested not in POLICIES:
            raise UsageError(f"sandbox {requested!r} is not one of {', '.join(POLICIES)}")
        if mode == "worktree" and requested != "worker":
            return "worker"
        if mode != "worktree" and requested == "worker":
            raise UsageError("sandbox worker is only for worktree children")
        return requested
    return "worker" if mode == "worktree" else "read_only"


def relies_on_sandbox(backend: str, tools: Iterable[str]) -> bool:
    """Whether the sandbox is the child's only enforcement (a shell or an external agent)."""
    return backend != "builtin" or "bash" in set(tools)


def check_available(config: Config, backend: str, tools: Iterable[str], agent: str) -> None:
    """Refuse, before anything is reserved, a child that cannot run safely here."""
    if config.sandbox == "off" or config.allow_unsandboxed:
        return
    if not relies_on_sandbox(backend, tools):
        return
    result = sandbox.probe()
    if not result.available:
        raise PolicyError(
            f"spawn {agent}: its shell or agent CLI needs an OS sandbox, and none works here: "
            f"{result.reason} (install bubblewrap, or pass --allow-unsandboxed)"
        )


def reaches_a_model(backend: str, model: ipc.ModelSpec) -> bool:
    """Whether the child talks to a model over the network (an agent CLI or ``openai``)."""
    return backend in {"pi", "claude", "codex"} or (
        backend == "builtin" and model.kind != "scripted"
    )


def endpoint_of(url: str) -> str:
    """``host:port`` of *url* (the scheme's port when it names none); ValueError if it has none."""
    parts = urlsplit(url)
    if parts.scheme not in _SCHEME_PORTS or not parts.hostname:
        raise ValueError(f"model URL {url!r} has no http(s) host")
    port = parts.port or _SCHEME_PORTS[parts.scheme]
    host = parts.hostname
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def egress_allowlist(
    backend: str, model: ipc.ModelSpec, *, named: Iterable[str], gateways: Iterable[str]
) -> list[str]:
    """Every ``host:port`` a child's egress proxy lets through: its model's endpoint (the base
    URL, else the CLI's own default service), the config's *gateways* when it reaches a model,
    and its definition's *named* endpoints. Empty: the child gets no network at all."""
    allowed: list[str] = []
    if reaches_a_model(backend, model):
        if model.base_url:
            try:
                allowed.append(endpoint_of(model.base_url))
            except ValueError as exc:
                raise UsageError(f"spawn: {exc} (write http(s)://host[:port]/...)") from None
        else:
            allowed += DEFAULT_ENDPOINTS.get(backend, ())
        allowed += gateways
    allowed += named
    try:
        allowlist(allowed)
    except EgressError as exc:
        raise UsageError(f"spawn: {exc}") from None
    return list(dict.fromkeys(allowed))


@attrs.frozen(kw_only=True)
class Placement:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    sandboxed: bool
    reason: str


def place(
    argv: tuple[str, ...],
    *,
    config: Config,
    loadout: ipc.Loadout,
    scratch: Path,
    egress: Path | None = None,
) -> Placement:
    """Wrap *argv* for *loadout*'s policy (or explain why it runs unwrapped).

    A sandboxed child never has the network; *egress*, the socket of its egress proxy, is bound
    into the sandbox and named to the child in ``FLEET_EGRESS_SOCKET``.
    """
    if config.sandbox == "off" or loadout.sandbox == "none":
        return Placement(argv=argv, env={}, sandboxed=False, reason="sandbox turned off")
    policy = POLICIES[loadout.sandbox]
    workspace = Path(loadout.workspace)
    source_root = Path(ipc.__file__).resolve().parents[1]
    visible = {workspace, config.paths.root, source_root, Path(sys.prefix), Path(sys.base_prefix)}
    if loadout.model.script:
        visible.add(Path(loadout.model.script).parent)
    if policy is sandbox.Policy.WORKER:
        visible.discard(workspace)
    spec = sandbox.SandboxSpec(
        policy=policy,
        scratch=scratch,
        visible=tuple(sorted(p for p in visible if p.exists())),
        writable=(workspace,) if policy is sandbox.Policy.WORKER else (),
        sockets=(config.paths.root,),
        cwd=workspace,
        # Egress: never the host's network, at most the proxy socket.
        network=False,
        egress=egress,
    )
    try:
        wrapped = sandbox.wrap(argv, spec)
    except sandbox.SandboxError as exc:
        raise PolicyError(f"spawn {loadout.owner}: sandbox refused: {exc}") from None
    if not wrapped.wrapped:
        return Placement(argv=argv, env=wrapped.env, sandboxed=False, reason=wrapped.reason)
    # FLEET_SANDBOXED: a CLI with a sandbox of its own (Codex) need not nest one in ours.
    env = wrapped.env | {"FLEET_SANDBOXED": "1"}
    if egress is not None:
        env[EGRESS_SOCKET_ENV] = str(egress)
    return Placement(argv=wrapped.argv, env=env, sandboxed=True, reason="")
