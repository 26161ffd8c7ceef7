"""``wrap()``: turn a command and a :class:`SandboxSpec` into the command to execute."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox._bwrap import HIDDEN_ROOTS, bwrap_argv, mount_ops, server_argv
from sandbox._errors import SandboxError
from sandbox._paths import CanonicalPaths, canonicalize, is_within
from sandbox._probe import ProbeResult, probe, probe_platform
from sandbox._seatbelt import seatbelt_argv
from sandbox._seccomp import filter_file
from sandbox._spec import SandboxSpec, Wrapped

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

SHELL = "/bin/sh"
SECCOMP_FD = 3
_SECCOMP_EXEC = f'exec "$@" {SECCOMP_FD}<"$0"'


def exec_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """What a wrapped ``argv`` runs once its seccomp shell has exec'd bwrap (else ``argv``)."""
    if tuple(argv[:3]) == (SHELL, "-c", _SECCOMP_EXEC):
        return tuple(argv[4:])
    return tuple(argv)


_LAUNCHERS = {"linux": "bwrap", "darwin": "sandbox-exec"}


def scratch_env(scratch: Path) -> dict[str, str]:
    """Point temporary files, caches and bytecode at ``scratch``, the one always-writable place."""
    return {
        "TMPDIR": str(scratch),
        "TMP": str(scratch),
        "TEMP": str(scratch),
        "XDG_CACHE_HOME": str(scratch / ".cache"),
        "PYTHONPYCACHEPREFIX": str(scratch / ".pycache"),
    }


def resolve_command(argv: Sequence[str]) -> tuple[str, ...]:
    """Non-empty ``argv`` with ``argv[0]`` made absolute through ``PATH``, its directory canonical.

    The file name itself is kept: a venv's ``bin/python`` is a symlink to the base interpreter,
    and Python finds the venv (``pyvenv.cfg``) from the name it was started as, so resolving it
    would silently run the child without the venv's packages.
    """
    found = shutil.which(argv[0])
    if found is None:
        raise SandboxError(
            f"sandbox wrap: command {argv[0]!r} not found on PATH or not executable; "
            "install it or pass an absolute path",
            path=Path(argv[0]),
        )
    program = Path(found).absolute()
    return (str(Path(os.path.realpath(program.parent)) / program.name), *argv[1:])


def _check_reachable(program: Path, paths: CanonicalPaths) -> None:
    hidden = any(is_within(program, Path(root)) for root in HIDDEN_ROOTS)
    if hidden and not any(is_within(program, exposed) for exposed in paths.exposed):
        raise SandboxError(
            f"sandbox wrap: command {program} lies under a directory the sandbox replaces "
            f"({', '.join(HIDDEN_ROOTS)}); add its directory to visible",
            path=program,
        )


def _unwrapped(argv: Sequence[str], env: dict[str, str], reason: str) -> Wrapped:
    return Wrapped(argv=tuple(argv), env=env, wrapped=False, launcher="none", reason=reason)


def wrap(
    argv: Sequence[str],
    spec: SandboxSpec,
    *,
    platform: str | None = None,
    probe_result: ProbeResult | None = None,
) -> Wrapped:
    """The command that runs ``argv`` under ``spec`` on ``platform`` (default: this one).

    Raises :class:`SandboxError` for a spec or command that can never be sandboxed safely (see
    :func:`sandbox._paths.canonicalize`, an empty argv, a command not on ``PATH`` or hidden by
    the sandbox); the spec is checked even when no launcher works. A missing or failing launcher
    never raises: the result is ``wrapped=False`` with the original ``argv`` and the reason, and
    the caller fails closed.

    ``probe_result`` defaults to the cached :func:`probe` on this platform, and to an uncached
    probe of ``platform``'s launcher otherwise (building a macOS command on Linux finds no
    ``sandbox-exec``: pass a ``probe_result`` to get the wrapped form).
    """
    if not argv:
        raise SandboxError("sandbox wrap: empty argv; pass the command to run")
    paths = canonicalize(spec)
    env = scratch_env(paths.scratch)
    platform = sys.platform if platform is None else platform
    if probe_result is None:
        probe_result = probe() if platform == sys.platform else probe_platform(platform)
    if not probe_result.available:
        return _unwrapped(argv, env, probe_result.reason)
    launcher = _LAUNCHERS.get(platform)
    if probe_result.launcher != launcher:
        return _unwrapped(
            argv,
            env,
            f"probe result is for {probe_result.launcher} but platform {platform!r} "
            f"needs {launcher or 'a launcher fleet does not have'}",
        )
    command = resolve_command(argv)
    network = spec.allows_network
    if launcher == "sandbox-exec":
        argv_out = seatbelt_argv(paths, command, network=network)
        return Wrapped(argv=argv_out, env=env, wrapped=True, launcher=launcher, reason="")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return _unwrapped(argv, env, "bwrap not found on PATH; install bubblewrap")
    _check_reachable(Path(command[0]), paths)
    seccomp = filter_file()
    if seccomp is None:
        argv_out = bwrap_argv(bwrap, paths, command, network=network)
    else:
        # bwrap reads the filter from a descriptor: the shell opens it and execs bwrap, so
        # bwrap keeps the launched pid and every launcher (tmux, cmux) can run the argv.
        inner = bwrap_argv(bwrap, paths, command, network=network, seccomp_fd=SECCOMP_FD)
        argv_out = (SHELL, "-c", _SECCOMP_EXEC, str(seccomp), *inner)
    return Wrapped(
        argv=argv_out,
        env=env,
        wrapped=True,
        launcher="bwrap",
        reason="",
        mounts=mount_ops(paths),
        chdir=None if paths.cwd is None else str(paths.cwd),
    )


def wrap_fork_server(
    *,
    hidden: Sequence[Path],
    writable: Sequence[Path],
    readable: Sequence[Path],
) -> tuple[str, ...] | None:
    """The command line, up to and including its ``--``, that runs an absolute command (the
    fork server) in the sandboxed fork server's bwrap (:func:`sandbox._bwrap.server_argv`),
    with the seccomp filter; ``None`` where bwrap does not work here (the caller keeps starting
    sandboxed children under bwrap one by one). Every writable and readable path must exist;
    a hidden one that is gone (another fleet's home, deleted since it was listed) has nothing
    left to hide and is left out. Each is canonicalized."""
    if sys.platform != "linux" or not probe().available:
        return None
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None
    roots = {
        "hidden": tuple(_existing(hidden)),
        "writable": tuple(Path(os.path.realpath(path, strict=True)) for path in writable),
        "readable": tuple(Path(os.path.realpath(path, strict=True)) for path in readable),
    }
    seccomp = filter_file()
    inner = server_argv(
        bwrap,
        (),
        hidden=roots["hidden"],
        writable=roots["writable"],
        readable=roots["readable"],
        seccomp_fd=None if seccomp is None else SECCOMP_FD,
    )
    return inner if seccomp is None else (SHELL, "-c", _SECCOMP_EXEC, str(seccomp), *inner)


def _existing(paths: Sequence[Path]) -> Iterator[Path]:
    """Each of *paths* that exists, canonical."""
    for path in paths:
        try:
            yield Path(os.path.realpath(path, strict=True))
        except FileNotFoundError:
            continue
