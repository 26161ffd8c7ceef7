"""A Ray child's sandbox, planned by the supervisor and made on its node (DESIGN §7, §11).

The supervisor cannot place a remote child itself: whether a sandbox works, which paths exist,
and which interpreter runs the child are facts of the child's node. So it sends the child's
actor a :class:`NodePlan` — plain strings and flags, what it knows: the policy, whether the
sandbox is off or unsandboxed runs are allowed, the child's argv after the interpreter, its
paths in its node directory, the extra paths it should see and those to hide — and the actor
realises it there (:func:`realise`): the node's own ``sys.executable``, the node's probe, the
spec of :func:`._sandboxing.child_spec` with only the paths that exist on the node, the wrap of
:func:`._sandboxing.wrap_child`, the environment the wrap adds merged on the node.

The plan is checked before anything is bound: its paths must be the ones of the actor's own
node directory (and its egress socket the one the actor serves), the child is always
``python -I -m child``, the node's roots of node directories (every other child's,
:func:`node_roots`) and the node's own fence (its runtime root and every fleet home on it,
:func:`orchestrator._runtime.fenced_paths`) are always hidden, and no extra visible path may
lie in a hidden one or another node directory. A plan can therefore make a child see less,
never more.
"""

import os
import secrets
import stat
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

import ipc
from orchestrator._config import Config
from orchestrator._errors import OperationFailed, PolicyError
from orchestrator._runtime import fenced_paths
from orchestrator.launch._sandboxing import (
    POLICIES,
    checked_visible,
    child_spec,
    decide_unsandboxed,
    hidden_paths,
    model_view,
    unsandboxed,
    wrap_child,
)

__all__ = [
    "NODE_HEX",
    "NODE_PREFIX",
    "NodePlan",
    "node_directory_name",
    "node_directory_of",
    "node_root",
    "node_roots",
    "plan_for",
    "realise",
]

#: The start of every node directory's name in its node's root for them (:func:`node_root`).
NODE_PREFIX: Final = "fleet-node-"
#: The node's memory file system, where its children's node directories go when it has room
#: (:func:`node_root`), as Ray's own object store does.
MEMORY_ROOT: Final = "/dev/shm"  # noqa: S108 - a shared root; every directory in it is 0700
#: The free space the memory root must have for a new node directory to be made there.
MEMORY_FREE: Final = 1 << 30
#: The random part of a node directory's name (``secrets.token_hex(16)``).
NODE_HEX: Final = 32
#: The loadout file's name in a node directory (``core._remote.node_layout``).
LOADOUT_NAME: Final = "loadout.json"
#: What a child is on every node: its package, isolated from its cwd (``child_argv``).
CHILD_MODULE: Final = ("-I", "-m", "child")


def _strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(item, str) for item in value):
        raise TypeError(f"expected a sequence of strings, got {value!r}")
    return tuple(value)


_STR = attrs.validators.instance_of(str)
_BOOL = attrs.validators.instance_of(bool)


@attrs.frozen(kw_only=True)
class NodePlan:
    """What the supervisor asks of a remote child's sandbox; the node makes it
    (:func:`realise`). Sent as :meth:`plain` and read back with :meth:`from_plain`."""

    owner: str = attrs.field(validator=_STR)
    #: The loadout's policy name (``read_only``, ``review``, ``worker``).
    policy: str = attrs.field(validator=_STR)
    sandbox_off: bool = attrs.field(validator=_BOOL)
    allow_unsandboxed: bool = attrs.field(validator=_BOOL)
    #: The child's argv after the interpreter (``-I -m child LOADOUT``).
    argv_tail: tuple[str, ...] = attrs.field(converter=_strings)
    #: In the node directory: the loadout file (the node reads and removes it, and the child
    #: inherits it: ``ChildActor.start``), the checkout (its cwd; a worker's one
    #: writable path besides scratch), the scratch, and the egress socket (``""``: none).
    loadout_file: str = attrs.field(validator=_STR)
    workspace: str = attrs.field(validator=_STR)
    scratch: str = attrs.field(validator=_STR)
    egress: str = attrs.field(default="", validator=_STR)
    #: Further paths the child reads, if they exist on the node (a scripted model's directory).
    visible: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    #: Paths the child must not see (the supervisor's state directory).
    hidden: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    #: Whether a fork of its node host's fork server will do (the supervisor says no for a
    #: child whose environment carries a credential: it would stay in the server's memory).
    forkable: bool = attrs.field(default=True, validator=_BOOL)

    def plain(self) -> dict[str, Any]:
        """Strings, flags and lists of strings only (JSON would carry it)."""
        plain = attrs.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in plain.items()}

    @classmethod
    def from_plain(cls, plain: Mapping[str, Any]) -> "NodePlan":
        return cls(**dict(plain))


def node_roots() -> tuple[str, ...]:
    """Where this node's node directories may be: its memory root (:data:`MEMORY_ROOT`) if it
    is a usable one, and its temporary directory. Both are hidden from every sandboxed child
    and both are swept."""
    return (*((MEMORY_ROOT,) if _usable(MEMORY_ROOT, 0) else ()), tempfile.gettempdir())


def node_root() -> str:
    """Where this node makes its next child's node directory: the ``TMPDIR`` the node's Ray
    workers were given, if one was (its operator chose it); else its memory file system when
    that is a shared, sticky directory (as ``/tmp`` is) or one of ours, with
    :data:`MEMORY_FREE` bytes free; else its temporary directory. A child's directory is made,
    filled, read and removed within its life; on a disk file system each of those steps cost
    a journal write (on the 2-core box, about 5 to 12 ms of CPU a child over the directory, the
    key, the loadout, the checkout and the removal: ``benchmarks/ray_fleet.py``)."""
    if os.environ.get("TMPDIR") or not _usable(MEMORY_ROOT, MEMORY_FREE):
        return tempfile.gettempdir()
    return MEMORY_ROOT


def _usable(root: str, free: int) -> bool:
    try:
        info = os.lstat(root)
        space = os.statvfs(root)
    except OSError:
        return False
    shared = (info.st_mode & 0o1777) == 0o1777 and info.st_uid == 0
    return (
        stat.S_ISDIR(info.st_mode)
        and (shared or info.st_uid == os.getuid())
        and os.access(root, os.W_OK | os.X_OK)
        and space.f_bavail * space.f_frsize >= free
    )


def node_directory_name(session: str, key: str) -> str:
    """A fresh, unpredictable name for child *key*'s node directory in a root of them
    (``fleet-node-SESSION-KEY-<32 hex>``): made by its node, or named by the supervisor for a
    launch that makes it (:func:`node_directory_of` checks either)."""
    return f"{NODE_PREFIX}{session}-{key}-{secrets.token_hex(NODE_HEX // 2)}"


def node_directory_of(path: str, session: str, key: str) -> Path:
    """*path*, the node directory child *key*'s actor made, once the supervisor has checked it
    is one (absolute, plain, ``fleet-node-SESSION-KEY-<32 hex>``): the supervisor puts paths
    below it in the loadout (its node reads the loadout file there and removes it before the
    child starts)."""
    node = Path(path)
    prefix = f"{NODE_PREFIX}{session}-{key}-"
    random = node.name.removeprefix(prefix)
    if (
        not node.is_absolute()
        or os.path.normpath(path) != path
        or not node.name.startswith(prefix)
        or len(random) != NODE_HEX
        or any(c not in "0123456789abcdef" for c in random)
    ):
        raise OperationFailed(f"spawn {key}: its node made no valid node directory ({path!r})")
    return node


def plan_for(
    config: Config,
    loadout: ipc.Loadout,
    *,
    argv_tail: tuple[str, ...],
    loadout_file: str,
    egress: str = "",
) -> NodePlan:
    """The supervisor's plan for remote child *loadout* (its paths already its node's). With
    the sandbox off there is no view, so nothing to hide: the fence is not looked up (the
    registry's every home read, a realpath each, for each child)."""
    off = config.sandbox == "off"
    return NodePlan(
        owner=loadout.owner,
        policy=loadout.sandbox,
        sandbox_off=off,
        allow_unsandboxed=config.allow_unsandboxed,
        argv_tail=argv_tail,
        loadout_file=loadout_file,
        workspace=loadout.workspace,
        scratch=loadout.scratch,
        egress=egress,
        visible=tuple(str(path) for path in model_view(loadout)),
        hidden=() if off else tuple(str(path) for path in hidden_paths(config)),
    )


@attrs.frozen(kw_only=True)
class NodeStart:
    """The child's command on its node, its cwd and environment, whether it is sandboxed."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    sandboxed: bool
    reason: str
    #: The sandbox's view (``{"ops": bwrap mount operations, "cwd": dir}``) a fork of the
    #: node's sandboxed fork server builds instead of running *argv*; ``None`` unsandboxed.
    view: Mapping[str, Any] | None = None


def realise(plan: NodePlan, *, node_dir: str, egress: str, env: Mapping[str, str]) -> NodeStart:
    """On the child's node: *plan* checked against the actor's own *node_dir* and the
    *egress* socket it serves (``""``: none), the child's command under this node's sandbox
    (unwrapped only when allowed), and *env* with what the wrap adds.

    Raises :class:`PolicyError` (one line) for a plan the node refuses or a child it cannot
    sandbox."""
    node = Path(node_dir)
    _check_paths(plan, node, egress)
    # The loadout is no argument: the child inherits it (``ChildActor.start``: --loadout-fd).
    argv = (os.path.abspath(sys.executable), *CHILD_MODULE)
    try:
        reason = decide_unsandboxed(
            off=plan.sandbox_off, allowed=plan.allow_unsandboxed, where="on its node"
        )
    except PolicyError as exc:
        named = exc.for_child.replace("spawn:", f"spawn {plan.owner}:", 1)
        raise PolicyError(named, hint=exc.hint) from None
    if reason is not None:
        placed = unsandboxed(argv, reason)
        # The supervisor's temporary directory names a place on its machine, not here.
        temp = dict.fromkeys(("TMPDIR", "TMP", "TEMP"), tempfile.gettempdir())
        return NodeStart(
            argv=placed.argv,
            cwd=plan.workspace,
            env={**env, **temp, **placed.env},
            sandboxed=False,
            reason=reason,
        )
    # The node's own fence too: its runtime root, its default state directory and every
    # fleet home registered on it (another fleet of the user on the node).
    hidden = tuple(
        dict.fromkeys(
            (*(Path(path) for path in plan.hidden), *map(Path, node_roots()), *fenced_paths())
        )
    )
    try:
        shown = checked_visible(plan.visible, hidden, nodes=NODE_PREFIX)
    except PolicyError as exc:
        raise _refuse(plan, str(exc)) from None
    visible = shown  # not the loadout: the child inherits it, no file of it is left to bind
    spec = child_spec(
        policy=POLICIES.get(plan.policy, POLICIES["read_only"]),
        workspace=Path(plan.workspace),
        scratch=Path(plan.scratch),
        visible=visible,
        hidden=hidden,
        egress=Path(plan.egress) if plan.egress else None,
    )
    placed = wrap_child(argv, spec, plan.owner)
    return NodeStart(
        argv=placed.argv,
        cwd=plan.workspace,
        env={**env, **placed.env},
        sandboxed=True,
        reason="",
        view=placed.view,
    )


def _refuse(plan: NodePlan, why: str) -> PolicyError:
    return PolicyError(f"spawn {plan.owner}: its node refused the sandbox plan: {why}")


def _check_paths(plan: NodePlan, node: Path, egress: str) -> None:
    """The plan's own paths are the actor's node directory's, its command is the child."""
    expected = {"workspace": node / "checkout", "scratch": node / "scratch"}
    for field, path in expected.items():
        if Path(getattr(plan, field)) != path:
            raise _refuse(plan, f"{field} {getattr(plan, field)!r} is not {str(path)!r}")
    loadout = node / LOADOUT_NAME
    if Path(plan.loadout_file) != loadout or os.path.islink(loadout) or not loadout.is_file():
        raise _refuse(plan, f"loadout {plan.loadout_file!r} is not the file {str(loadout)!r}")
    if plan.egress != egress:
        raise _refuse(plan, f"egress {plan.egress!r} is not the one served here ({egress!r})")
    if tuple(plan.argv_tail) != (*CHILD_MODULE, plan.loadout_file):
        raise _refuse(plan, f"argv {list(plan.argv_tail)!r} is not the child's")
