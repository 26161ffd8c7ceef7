"""Canonical paths for a spec, and the refusals that keep ``$HOME`` and visible paths read-only.

Both launchers see paths after symlinks are resolved (bwrap mounts by path; Seatbelt matches the
kernel's resolved path), so every rule is written on ``realpath`` forms. A symlinked scratch dir
therefore binds its target, and a link inside a writable dir that points elsewhere still meets
the read-only mount of its target.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from sandbox._errors import SandboxError

if TYPE_CHECKING:
    from sandbox._spec import SandboxSpec


@attrs.frozen(kw_only=True)
class CanonicalPaths:
    """A spec's paths, resolved, de-duplicated and checked; what the launchers are built from."""

    scratch: Path
    visible: tuple[Path, ...]
    writable: tuple[Path, ...]
    sockets: tuple[Path, ...]
    cwd: Path | None
    egress: Path | None = None
    hidden: tuple[Path, ...] = ()

    @property
    def exposed(self) -> tuple[Path, ...]:
        """Every path the spec names: what stays reachable wherever the sandbox hides the host."""
        return (self.scratch, *self.visible, *self.sockets, *self.writable)


def is_within(path: Path, ancestor: Path) -> bool:
    """Whether ``path`` is ``ancestor`` or lies below it (both canonical: absolute, no ``..``,
    no trailing slash but the root's). By their text: a sandbox's view compares every visible
    path with every hidden one, and ``ancestor in path.parents`` made a path per parent."""
    if path == ancestor:
        return True
    base = str(ancestor)
    return str(path).startswith(base if base.endswith("/") else f"{base}/")


def canonical(path: Path, role: str) -> Path:
    """``realpath`` of an existing path; a missing one raises :class:`SandboxError`."""
    try:
        return Path(os.path.realpath(path, strict=True))
    except OSError as exc:
        raise SandboxError(
            f"sandbox spec: {role} path {path} cannot be resolved ({exc.strerror}); "
            "create it before wrapping",
            path=path,
        ) from exc


def _canonical_all(paths: tuple[Path, ...], role: str) -> tuple[Path, ...]:
    return tuple(dict.fromkeys(canonical(path, role) for path in paths))


def canonicalize(spec: SandboxSpec) -> CanonicalPaths:
    """Resolve every path of ``spec`` and refuse a layout that would make a protected path writable.

    Refused (:class:`SandboxError`): a missing path; a scratch that is not a directory; scratch or
    a writable path that contains ``$HOME`` (it is ``/`` or a parent of home); a visible or socket
    path inside scratch or a writable path (the repository must never become writable); a ``cwd``
    outside every named path.
    """
    scratch = canonical(spec.scratch, "scratch")
    if not scratch.is_dir():
        raise SandboxError(
            f"sandbox spec: scratch {scratch} is not a directory; pass a per-run directory",
            path=scratch,
        )
    paths = CanonicalPaths(
        scratch=scratch,
        visible=_canonical_all(spec.visible, "visible"),
        writable=_canonical_all(spec.writable, "writable"),
        sockets=_canonical_all(spec.sockets, "socket"),
        cwd=None if spec.cwd is None else canonical(spec.cwd, "cwd"),
        egress=None if spec.egress is None else canonical(spec.egress, "egress"),
        hidden=tuple(
            dict.fromkeys(
                Path(os.path.realpath(path)) for path in spec.hidden if os.path.lexists(path)
            )
        ),
    )
    # $HOME need not exist (a service account); its would-be location is still protected.
    home = Path(os.path.realpath(Path.home()))
    for writable in (scratch, *paths.writable):
        if is_within(home, writable):
            raise SandboxError(
                f"sandbox spec: writable path {writable} contains $HOME {home}; home must stay "
                "read-only — use a dedicated directory below it",
                path=writable,
            )
        for kept in (*paths.visible, *paths.sockets):
            if is_within(kept, writable):
                raise SandboxError(
                    f"sandbox spec: visible path {kept} lies inside writable path {writable}; "
                    "it would become writable — move the writable dir out of it",
                    path=kept,
                )
    if paths.cwd is not None and not any(is_within(paths.cwd, p) for p in paths.exposed):
        raise SandboxError(
            f"sandbox spec: cwd {paths.cwd} is not inside scratch, a visible, socket or writable "
            "path; add it to visible or pick a cwd inside one",
            path=paths.cwd,
        )
    return paths
