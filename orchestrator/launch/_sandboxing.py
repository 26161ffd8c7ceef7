"""How the supervisor puts a child in an OS sandbox, and when it refuses to run one without.

Scouts and forks run under ``read_only`` (or ``review`` when their definition asks), workers
under ``worker`` with their worktree writable. A child that talks to a model over the network
keeps the network; its filesystem stays confined. When no sandbox launcher works, a child whose
*only* enforcement is the sandbox — one with a shell, or an external agent CLI — is refused
unless the user allowed unsandboxed runs; a builtin child with read-only tools is still
confined by its tools, so it runs unwrapped and ``peek`` and its handoff say so.
"""

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

import ipc
import sandbox
from orchestrator._config import Config
from orchestrator._errors import PolicyError, UsageError

POLICIES = {p.value: p for p in sandbox.Policy}


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


def reaches_a_model(loadout: ipc.Loadout) -> bool:
    """Whether the child talks to a model over the network (an agent CLI or ``openai``).

    Such a child needs the network even under ``read_only``: the filesystem stays read-only,
    but denying the network would cut it off from its model (a loopback endpoint included,
    since ``--unshare-net`` gives the child its own loopback).
    """
    return loadout.backend in {"pi", "claude", "codex"} or (
        loadout.backend == "builtin" and loadout.model.kind != "scripted"
    )


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
) -> Placement:
    """Wrap *argv* for *loadout*'s policy (or explain why it runs unwrapped)."""
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
        network=True if reaches_a_model(loadout) else None,
    )
    try:
        wrapped = sandbox.wrap(argv, spec)
    except sandbox.SandboxError as exc:
        raise PolicyError(f"spawn {loadout.owner}: sandbox refused: {exc}") from None
    if not wrapped.wrapped:
        return Placement(argv=argv, env=wrapped.env, sandboxed=False, reason=wrapped.reason)
    return Placement(argv=wrapped.argv, env=wrapped.env, sandboxed=True, reason="")
