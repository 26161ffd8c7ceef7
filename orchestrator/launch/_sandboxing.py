"""How the supervisor puts a child in an OS sandbox, and when it refuses to run one without.

Every child is sandboxed: scouts and forks under ``read_only`` (or ``review`` when their
definition asks), workers under ``worker`` with their worktree writable, builtin and agent-CLI
backends alike. No sandboxed child has the network: one that talks to a model reaches the
``host:port`` pairs of its allowlist (:func:`egress_allowlist`) through its egress proxy
(``_egress``), whose socket is bound into the sandbox. The whole state directory
(``config.home``: every session's loadouts, logs, registry, paper, worktrees and scratch) is
hidden, and so is every other fleet's of this user and the per-user runtime root holding every
fleet's tokens and sockets (:func:`hidden_paths`); only the child's own scratch, its worktree,
its IPC socket, its egress socket and its loadout file are bound back.

When no sandbox works (or ``sandbox: off``), every spawn is refused with one line saying how to
get one, unless the user passed ``--allow-unsandboxed``; then the child runs unwrapped and
``peek`` and its handoff say so (``sandboxed: false`` and the reason).
"""

import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import attrs

import ipc
import sandbox
from orchestrator._config import Config
from orchestrator._errors import PolicyError, UsageError
from orchestrator._runtime import ensure_session_runtime, fenced_paths
from orchestrator.launch._egress import EgressError, allowlist

POLICIES = {p.value: p for p in sandbox.Policy}
#: Where a CLI goes when its model names no base URL (Pi's provider is its own: name it in
#: the definition's ``egress:``).
DEFAULT_ENDPOINTS: Final = {
    "claude": ("api.anthropic.com:443",),
    "codex": ("api.openai.com:443", "chatgpt.com:443"),
}
#: The child's runtime starts its egress relay when this names the proxy socket (the same
#: name as ``child.backends._egress.SOCKET_ENV``; the orchestrator may not import ``child``).
EGRESS_SOCKET_ENV: Final = "FLEET_EGRESS_SOCKET"
#: "1" exactly when the child was wrapped (``child.backends._cli_env.SANDBOXED_ENV``).
SANDBOXED_ENV: Final = "FLEET_SANDBOXED"
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


HOW_TO_SANDBOX = (
    "install bubblewrap (Linux) or run on macOS, or pass --allow-unsandboxed (read when the "
    "supervisor starts: fleet serve --stop first)"
)


def unsandboxed_reason(config: Config) -> str | None:
    """Why children run unsandboxed here when the user allowed it; ``None`` when they are not.

    Raises :class:`PolicyError` when no sandbox works and the user did not allow running
    without one.
    """
    return decide_unsandboxed(off=config.sandbox == "off", allowed=config.allow_unsandboxed)


def decide_unsandboxed(*, off: bool, allowed: bool, where: str = "here") -> str | None:
    """:func:`unsandboxed_reason` for a sandbox turned *off* or not, unsandboxed runs *allowed*
    or not, probing the launcher of this machine (*where*: how a refusal names it; a Ray
    child's node decides on the node, :mod:`._nodeplan`)."""
    if off:
        if allowed:
            return "sandbox turned off (--allow-unsandboxed)"
        raise PolicyError(
            "spawn: the sandbox is turned off (sandbox: off) and every child must be sandboxed",
            hint="turn it back on, or pass --allow-unsandboxed (either read when the supervisor "
            "starts: fleet serve --stop first)",
        )
    result = sandbox.probe()
    if result.available:
        return None
    if allowed:
        suffix = "" if where == "here" else f" {where}"
        return f"no working sandbox{suffix} ({result.reason}); --allow-unsandboxed"
    raise PolicyError(f"spawn: no OS sandbox works {where}: {result.reason}", hint=HOW_TO_SANDBOX)


def check_available(config: Config, agent: str, *, remote: bool = False) -> None:
    """Refuse, before anything is reserved, a child that cannot be sandboxed here. A *remote*
    child's sandbox is its node's (:mod:`._nodeplan` probes it there): only a sandbox turned
    off without leave to run unsandboxed refuses it here."""
    try:
        if remote:
            if config.sandbox == "off":
                decide_unsandboxed(off=True, allowed=config.allow_unsandboxed)
        else:
            unsandboxed_reason(config)
    except PolicyError as exc:
        raise PolicyError(str(exc).replace("spawn:", f"spawn {agent}:", 1)) from None


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
    #: What a fork of the sandboxed fork server applies to get the view *argv* would give
    #: (``{"ops": bwrap mount operations, "cwd": dir}``); ``None`` when only *argv* will do.
    view: Mapping[str, object] | None = None


def hidden_paths(config: Config) -> tuple[Path, ...]:
    """What no sandboxed child may see: its own state directory (every session in it), and
    every other fleet's of this user (:func:`orchestrator._runtime.fenced_paths`: the runtime
    root holding every fleet's sockets and secrets, the default state directory, every
    registered ``FLEET_HOME``), canonical, none inside another, looked up as it is now: at
    the child's launch (a child queued since its spawn hides a fleet started meanwhile too).

    Another fleet's home that holds this session's workspace keeps only its ``sessions``
    directory hidden (all of its state): hiding it whole would hide the repository too.
    """
    own = Path(os.path.realpath(config.home))
    workspace = Path(os.path.realpath(config.workspace))
    found = [own]
    for path in fenced_paths():
        holds = sandbox.is_within(workspace, path)
        found.append(path / "sessions" if holds else path)
    return outermost(found)


def outermost(paths: Iterable[Path]) -> tuple[Path, ...]:
    """*paths* without duplicates and without any that lies inside another (one hidden tree
    covers them)."""
    unique = dict.fromkeys(paths)
    return tuple(path for path in unique if not any(parent in unique for parent in path.parents))


def ipc_endpoint(loadout: ipc.Loadout) -> tuple[Path, ...]:
    """The IPC endpoint bound back into the sandbox: the socket FILE, not its directory.

    Only a pane's child connects to the listener; a ``process`` child inherits its connection
    (``loadout.socket`` is empty) and sees no socket of the session at all.
    """
    return (Path(loadout.socket),) if loadout.socket else ()


def loadout_file_view(loadout_file: Path | None) -> tuple[Path, ...]:
    """The child's own loadout file, bound back read-only (and nothing else of ``loadouts/``).

    The one place that names it; a loadout passed over a descriptor will make it go away.
    """
    return () if loadout_file is None else (loadout_file,)


def model_view(loadout: ipc.Loadout) -> tuple[Path, ...]:
    """What a child reads of its model: a scripted model's directory (nothing otherwise)."""
    return (Path(loadout.model.script).parent,) if loadout.model.script else ()


def checked_visible(
    names: Iterable[str | Path], hidden: Iterable[Path], *, nodes: str = ""
) -> list[Path]:
    """The extra paths a child should read (its repository, a scripted model's directory)
    that exist here, canonical. Raises :class:`PolicyError` for one that would bring back what
    the sandbox hides: one in a *hidden* path, or one that is or holds a tree the sandbox
    replaces (``/tmp``, ``/dev``, ``/proc``: bound, it would show the host's over the
    sandbox's). With *nodes* (the node directories' name prefix), below a hidden temporary
    directory only those directories are refused: a model file in a node's ``/tmp`` is fine.
    """
    temp = Path(os.path.realpath(tempfile.gettempdir()))
    hidden_real = [Path(os.path.realpath(path)) for path in hidden]
    replaced = [Path(os.path.realpath(root)) for root in sandbox.HIDDEN_ROOTS]
    kept = []
    for name in names:
        if not os.path.isabs(name):
            raise PolicyError(f"visible path {str(name)!r} is not absolute")
        if not os.path.exists(name):
            continue  # not here: nothing to show
        path = Path(os.path.realpath(name))
        for root in replaced:
            if sandbox.is_within(root, path):
                raise PolicyError(f"visible path {str(name)!r} would show the host's {str(root)!r}")
        for root in hidden_real:
            if not sandbox.is_within(path, root):
                continue
            below = path.relative_to(root).parts
            if nodes and root == temp and below and not below[0].startswith(nodes):
                continue  # e.g. a model file in the node's /tmp, not a child's directory
            raise PolicyError(f"visible path {str(name)!r} would show hidden {str(root)!r}")
        kept.append(path)
    return kept


def child_spec(
    *,
    policy: sandbox.Policy,
    workspace: Path,
    scratch: Path,
    visible: Iterable[Path],
    hidden: Iterable[Path],
    sockets: Iterable[Path] = (),
    egress: Path | None = None,
) -> sandbox.SandboxSpec:
    """The one place a child's :class:`sandbox.SandboxSpec` is built: by :func:`place` for a
    local child, and on its node for a Ray child (:mod:`._nodeplan`), so both see the same view.

    Its *workspace* (its cwd) is visible, or writable under the worker policy (the only path a
    worker may write besides its *scratch*); this interpreter's source tree and prefixes are
    visible; of *visible* and *sockets* only what exists *here* is named; *hidden* stays hidden.
    """
    source_root = Path(ipc.__file__).resolve().parents[1]
    shown = {workspace, source_root, Path(sys.prefix), Path(sys.base_prefix), *visible}
    if policy is sandbox.Policy.WORKER:
        shown.discard(workspace)
    return sandbox.SandboxSpec(
        policy=policy,
        scratch=scratch,
        visible=tuple(sorted(p for p in shown if p.exists())),
        writable=(workspace,) if policy is sandbox.Policy.WORKER else (),
        sockets=tuple(p for p in sockets if p.exists()),
        hidden=tuple(hidden),
        cwd=workspace,
        # Egress: never the host's network, at most the proxy socket.
        network=False,
        egress=egress,
    )


def wrap_child(argv: tuple[str, ...], spec: sandbox.SandboxSpec, owner: str) -> Placement:
    """*argv* wrapped in *spec*'s sandbox (fail closed: :class:`PolicyError` when it cannot
    be), with the environment the wrap adds; here or on a Ray child's node."""
    try:
        wrapped = sandbox.wrap(argv, spec)
    except sandbox.SandboxError as exc:
        raise PolicyError(f"spawn {owner}: sandbox refused: {exc}") from None
    if not wrapped.wrapped:
        raise PolicyError(f"spawn {owner}: no OS sandbox: {wrapped.reason} ({HOW_TO_SANDBOX})")
    # With the loadout's policy, tells a CLI with a sandbox of its own (Codex, Claude Code) not
    # to nest it in ours (child.backends._cli_env.inside_fleet_sandbox).
    env = wrapped.env | {SANDBOXED_ENV: "1"}
    if spec.egress is not None:
        env[EGRESS_SOCKET_ENV] = str(spec.egress)
    view = None
    if wrapped.mounts:
        view = {"ops": [list(op) for op in wrapped.mounts], "cwd": wrapped.chdir}
    return Placement(argv=wrapped.argv, env=env, sandboxed=True, reason="", view=view)


def unsandboxed(argv: tuple[str, ...], reason: str) -> Placement:
    """*argv* run without a sandbox, as the user allowed (*reason* says why)."""
    # "0", not absent: a FLEET_SANDBOXED=1 in the supervisor's own environment must not
    # tell an unwrapped CLI (Codex, Claude Code) to drop its own sandbox.
    return Placement(argv=argv, env={SANDBOXED_ENV: "0"}, sandboxed=False, reason=reason)


def place(
    argv: tuple[str, ...],
    *,
    config: Config,
    loadout: ipc.Loadout,
    scratch: Path,
    egress: Path | None = None,
    loadout_file: Path | None = None,
) -> Placement:
    """Wrap *argv* for *loadout*'s policy; unwrapped only when the user allowed it.

    A sandboxed child never has the network; *egress*, the socket of its egress proxy, is bound
    into the sandbox and named to the child in ``FLEET_EGRESS_SOCKET``. Raises
    :class:`PolicyError` when the child cannot be sandboxed and ``--allow-unsandboxed`` was not
    given.
    """
    reason = unsandboxed_reason(config)
    if reason is not None:
        return unsandboxed(argv, reason)
    # The session's repository stays readable (a worker's git finds its objects there).
    hidden = hidden_paths(config)
    try:
        extra = checked_visible([config.workspace, *model_view(loadout)], hidden)
    except PolicyError as exc:
        raise PolicyError(f"spawn {loadout.owner}: sandbox refused: {exc}") from None
    visible = {*extra, *loadout_file_view(loadout_file)}
    spec = child_spec(
        policy=POLICIES.get(loadout.sandbox, sandbox.Policy.READ_ONLY),
        workspace=Path(loadout.workspace),
        scratch=scratch,
        visible=visible,
        sockets=ipc_endpoint(loadout),
        hidden=hidden,
        egress=egress,
    )
    return wrap_child(argv, spec, loadout.owner)


def fork_server_wrapper(config: Config) -> tuple[str, ...] | None:
    """The bwrap command of this session's sandboxed fork server, or ``None`` where sandboxed
    children cannot be forked here (no bwrap, ``sandbox: off``): they start under bwrap.

    Its view keeps the host's ``/tmp`` (a child's visible paths below it are bound from
    there), so it hides by name what every child hides (:func:`hidden_paths`: the runtime root
    with every fleet's sockets and secrets, every fleet's state directory) and brings back only
    what its children's views are built from: the session's scratch and worktree roots
    (writable) and its egress sockets. A fleet started later is hidden by each child's own view.
    """
    if config.sandbox == "off" or sys.platform != "linux":
        return None
    paths = config.paths
    roots = (paths.scratch, paths.worktrees, paths.egress)
    ensure_session_runtime(paths.runtime)  # before its egress directory, made below it
    for root in roots:
        ipc.ensure_private_dir(root)
    return sandbox.wrap_fork_server(
        hidden=hidden_paths(config),
        writable=roots[:2],
        readable=roots[2:],
    )
