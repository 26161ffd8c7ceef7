"""The Seatbelt command line and profile (macOS ``/usr/bin/sandbox-exec``).

Paths never enter the profile text: each is passed as a ``-DNAME=value`` parameter and the
profile refers to it as ``(param "NAME")``. A path holding ``"``, ``\\``, ``)`` or a newline
therefore cannot change the profile's meaning, and the profile for a given shape (policy,
number of worktrees and sockets) is the same text every time.

Seatbelt matches the kernel's resolved path, which on macOS is the ``/private/...`` form of
``/var``, ``/tmp`` and ``/etc``; each write and socket rule is given both forms so a caller that
passes either spelling is covered.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sandbox._paths import is_within

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox._paths import CanonicalPaths

SANDBOX_EXEC = "/usr/bin/sandbox-exec"
# macOS links these into /private; names only, nothing is created there.
_PRIVATE_ROOTS = ("/var", "/tmp", "/etc")  # noqa: S108

_BASE = """\
(version 1)
(deny default)
; run and fork programs; signal and inspect only processes inside this sandbox
(allow process-exec)
(allow process-fork)
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))
; reads are not confined: the sandbox protects writes and the network
(allow file-read*)
; dyld maps shared libraries (python's extension modules) executable
(allow file-map-executable)
(allow sysctl-read)
; libSystem's user lookups (getpwuid), logging and notifications
(allow mach-lookup
  (global-name "com.apple.system.opendirectoryd.libinfo")
  (global-name "com.apple.system.logger")
  (global-name "com.apple.system.notification_center"))
(allow ipc-posix-shm-read-data (ipc-posix-name "apple.shm.notification_center"))
(allow file-write* file-ioctl (literal "/dev/null") (literal "/dev/tty"))
"""

_NETWORK = """\
; review: outbound network, with the services that resolve names and check certificates
(allow network-outbound)
(allow system-socket)
(allow mach-lookup
  (global-name "com.apple.SystemConfiguration.DNSConfiguration")
  (global-name "com.apple.SystemConfiguration.configd")
  (global-name "com.apple.networkd")
  (global-name "com.apple.trustd.agent")
  (global-name "com.apple.ocspd")
  (global-name "com.apple.SecurityServer"))
"""


def path_forms(path: Path) -> tuple[str, ...]:
    """``path`` and its ``/private`` twin under ``/var``, ``/tmp`` or ``/etc`` (or the reverse)."""
    text = str(path)
    for root in _PRIVATE_ROOTS:
        private = "/private" + root
        if is_within(path, Path(private)):
            return (text, root + text[len(private) :])
        if is_within(path, Path(root)):
            return (text, private + text[len(root) :])
    return (text,)


def _bind(params: dict[str, str], name: str, path: Path) -> list[str]:
    """Register ``path``'s forms as parameters ``NAME`` and ``NAME_ALIAS``; return their names."""
    names = []
    for form, suffix in zip(path_forms(path), ("", "_ALIAS"), strict=False):
        params[name + suffix] = form
        names.append(name + suffix)
    return names


def seatbelt_profile(paths: CanonicalPaths, *, network: bool) -> tuple[str, dict[str, str]]:
    """The profile text and the ``-D`` parameters it refers to, in a stable order."""
    params: dict[str, str] = {}
    # Later rules win: hide first, then allow back reads, writes and sockets that are named.
    lines = [_BASE, *_hidden_rules(params, paths)]
    writes = _bind(params, "SCRATCH", paths.scratch)
    for index, writable in enumerate(paths.writable):
        writes += _bind(params, f"WORKTREE_{index}", writable)
    lines.append("; writes: scratch and the worker's worktrees only\n(allow file-write*")
    lines += [f'  (subpath (param "{name}"))' for name in writes]
    lines[-1] += ")\n"
    if network:
        lines.append(_NETWORK)
    sockets = (*paths.sockets, *((paths.egress,) if paths.egress else ()))
    if sockets and (not network or paths.hidden):
        lines.append(
            "; the supervisor's Unix sockets (the only network when the policy denies it)\n"
            "(allow system-socket (socket-domain AF_UNIX))\n(allow network-outbound"
        )
        for index, socket in enumerate(sockets):
            # A socket file is matched exactly; a directory admits the sockets inside it.
            match = "path-literal" if socket.is_socket() else "subpath"
            lines += [
                f'  (remote unix-socket ({match} (param "{name}")))'
                for name in _bind(params, f"SOCKET_{index}", socket)
            ]
        lines[-1] += ")\n"
    return "\n".join(lines), params


def _hidden_rules(params: dict[str, str], paths: CanonicalPaths) -> list[str]:
    """Deny reading, writing and connecting below each hidden path; allow back named reads."""
    if not paths.hidden:
        return []
    hidden: list[str] = []
    for index, path in enumerate(paths.hidden):
        hidden += _bind(params, f"HIDDEN_{index}", path)
    shown: list[str] = []
    named = (*paths.exposed, *((paths.egress,) if paths.egress else ()))
    for index, path in enumerate(p for p in named if _below(p, paths.hidden)):
        shown += _bind(params, f"SHOWN_{index}", path)
    lines = [
        (
            "; hidden: the fleet state directory, unreadable and unreachable but for what is "
            "named\n(deny file-read* file-write*"
        ),
        *(f'  (subpath (param "{name}"))' for name in hidden),
    ]
    lines[-1] += ")"
    lines.append("(deny network-outbound")
    lines += [f'  (remote unix-socket (subpath (param "{name}")))' for name in hidden]
    lines[-1] += ")"
    if shown:
        lines.append("(allow file-read*")
        lines += [f'  (subpath (param "{name}"))' for name in shown]
        lines[-1] += ")"
    lines[-1] += "\n"
    return lines


def _below(path: Path, roots: Sequence[Path]) -> bool:
    return any(is_within(path, root) for root in roots)


def seatbelt_argv(
    paths: CanonicalPaths, command: Sequence[str], *, network: bool
) -> tuple[str, ...]:
    """``sandbox-exec -p PROFILE -DNAME=value... -- COMMAND...`` (``command`` already absolute)."""
    profile, params = seatbelt_profile(paths, network=network)
    defines = [f"-D{name}={value}" for name, value in params.items()]
    return (SANDBOX_EXEC, "-p", profile, *defines, "--", *command)
