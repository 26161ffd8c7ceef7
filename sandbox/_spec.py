"""What a caller asks of the sandbox (:class:`SandboxSpec`) and gets back (:class:`Wrapped`)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from sandbox._errors import SandboxError

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable


class Policy(enum.Enum):
    """How much a sandboxed child may do.

    ``READ_ONLY``: read the whole file system, write only its scratch dir, no network.
    ``REVIEW``: the same, plus network (a reviewer may fetch documentation).
    ``WORKER``: ``READ_ONLY`` plus its own writable paths (its worktree).
    """

    READ_ONLY = "read_only"
    REVIEW = "review"
    WORKER = "worker"


def _path_tuple(value: Iterable[str | os.PathLike[str]]) -> tuple[Path, ...]:
    return tuple(Path(item) for item in value)


@attrs.frozen(kw_only=True)
class SandboxSpec:
    """One child's sandbox.

    Every path must exist when :func:`sandbox.wrap` runs; it is canonicalized (``realpath``) there.

    - ``scratch``: the per-run scratch directory, the only place every policy may write; the
      child's ``TMPDIR``/``TMP``/``TEMP``, ``XDG_CACHE_HOME`` and ``PYTHONPYCACHEPREFIX``
      point into it.
    - ``visible``: paths that must stay visible read-only even where the sandbox hides the host
      (``/tmp``, ``/dev``): the repository, the loadout dir, the venv.
    - ``writable``: ``WORKER`` only — its worktree. Giving it for another policy raises.
    - ``sockets``: Unix sockets (or directories holding them) the child must connect to, the
      supervisor's IPC socket dir. Visible read-only like ``visible``; on macOS they are also the
      only network a network-denying policy allows. (On Linux every visible path socket is
      reachable; Seatbelt needs them named.)
    - ``egress``: the supervisor's egress-proxy Unix socket for this child, bound into the sandbox
      at the same path after every other mount (so no hidden or replaced tree covers it). It is
      how a child without network reaches its model; on macOS it is allowed like ``sockets``.
    - ``hidden``: directories the child must not see at all, though they lie under a visible
      tree (the fleet state directory, every session's tokens, sockets and loadouts). bwrap
      mounts an empty tmpfs over each; Seatbelt denies reads below them. A scratch, writable,
      socket or visible path inside a hidden one is bound back on top and stays reachable —
      and nothing else below it. A hidden path that does not exist is skipped.
    - ``network``: ``None`` takes the policy's default (``REVIEW`` allows, the others deny).
    - ``cwd``: the child's working directory, passed to bwrap as ``--chdir`` so a directory the
      sandbox cannot see fails the launch instead of silently starting in ``$HOME``. It must lie
      inside ``scratch``, a visible, socket or writable path. ``None`` leaves bwrap to keep the
      caller's cwd (and fall back to ``$HOME`` when it is hidden).
    """

    policy: Policy
    scratch: Path = attrs.field(converter=Path)
    visible: tuple[Path, ...] = attrs.field(default=(), converter=_path_tuple)
    writable: tuple[Path, ...] = attrs.field(default=(), converter=_path_tuple)
    sockets: tuple[Path, ...] = attrs.field(default=(), converter=_path_tuple)
    hidden: tuple[Path, ...] = attrs.field(default=(), converter=_path_tuple)
    network: bool | None = None
    cwd: Path | None = None
    egress: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))

    @writable.validator
    def _only_workers_write(self, _attribute: attrs.Attribute[object], value: object) -> None:
        if value and self.policy is not Policy.WORKER:
            raise SandboxError(
                f"sandbox spec: policy {self.policy.value} was given writable paths "
                f"{[str(path) for path in self.writable]}; only the worker policy may write "
                "outside scratch — drop them or use Policy.WORKER"
            )

    @property
    def allows_network(self) -> bool:
        """Whether the child may open network connections (path Unix sockets aside)."""
        if self.network is not None:
            return self.network
        return self.policy is Policy.REVIEW


@attrs.frozen(kw_only=True)
class Wrapped:
    """The command to run, and the environment the caller must add for it.

    ``wrapped`` is ``False`` when no working launcher exists: ``argv`` is then the original
    command, ``launcher`` is ``"none"`` and ``reason`` says why in one line. The caller decides
    whether to refuse (it must, unless the user allowed unsandboxed runs). ``env`` is set either
    way: it points the child's temporary and cache files at its scratch dir.
    """

    argv: tuple[str, ...]
    env: dict[str, str]
    wrapped: bool
    launcher: str
    reason: str
    #: bwrap only: its mount operations (:func:`sandbox._bwrap.mount_ops`) and ``--chdir``,
    #: what a child forked inside the sandboxed fork server applies itself to get this view.
    mounts: tuple[tuple[str, ...], ...] = ()
    chdir: str | None = None
