"""The bubblewrap command line (Linux).

Shape, in this order (bwrap applies mounts in argument order, so later binds win)::

    bwrap --die-with-parent --new-session --unshare-user --unshare-pid [--unshare-net]
          --unshare-ipc --unshare-uts --cap-drop ALL
          --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp
          --ro-bind V V ...            (visible paths not below a hidden one)
          --tmpfs H ...                (hidden dirs; a hidden file gets /dev/null)
          --ro-bind V V ...  --ro-bind S S ...  (visible paths below a hidden one; sockets)
          --bind SCRATCH SCRATCH  --bind W W ...  [--ro-bind EGRESS_SOCKET EGRESS_SOCKET]
          [--seccomp FD] [--chdir CWD]
          -- COMMAND...

Why each flag is there (traps verified on these machines, see docs/sandbox.md):

- ``--unshare-user --cap-drop ALL``: as real root without them the child can
  ``mount -o remount,rw /`` and write the host through the "read-only" root.
- ``--unshare-pid``: bwrap becomes the namespace's init, so SIGKILL to bwrap kills every
  descendant, even ones that called ``setsid``.
- ``--die-with-parent``: PR_SET_PDEATHSIG, which fires when the spawning *thread* exits — the
  caller must spawn from a long-lived thread (the trio thread), never a worker-pool thread.
- ``--new-session``: the child cannot push keystrokes into the caller's terminal (TIOCSTI).
- ``--proc /proc`` after ``--unshare-pid``: a fresh procfs of the child's own pid namespace, so
  no ``/proc/<pid>/environ|cmdline|cwd|root`` of the supervisor or a sibling exists inside.
- ``--tmpfs H`` for each hidden path (every fleet state directory of the user, the runtime
  root holding every fleet's tokens and sockets): they vanish; what the child needs below one
  is bound back afterwards.
- ``--seccomp FD``: :mod:`sandbox._seccomp`'s filter, so a child running as root cannot leave a
  setuid or setgid file on the host.
- ``--tmpfs /tmp`` hides the host's /tmp, so every named path is bound again after it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sandbox._paths import is_within

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox._paths import CanonicalPaths

ISOLATION_FLAGS = (
    "--die-with-parent",
    "--new-session",
    "--unshare-user",
    "--unshare-pid",
)
NAMESPACE_FLAGS = ("--unshare-ipc", "--unshare-uts", "--cap-drop", "ALL")
# The mounts above replace these trees, hiding whatever the host had below them.
HIDDEN_ROOTS = ("/tmp", "/dev", "/proc")  # noqa: S108
#: The trees the view replaces with its own, where nothing of the host's shows unless bound.
_REPLACED = (Path("/tmp"), Path("/dev"))  # noqa: S108 - the view's own tmpfs and devices


def mount_ops(paths: CanonicalPaths) -> tuple[tuple[str, ...], ...]:
    """The mount operations of a sandbox for ``paths``, in bwrap's order: each a bwrap flag and
    its arguments (``("--ro-bind", SRC, DEST)``, ``("--tmpfs", DEST)``, ``("--dev", "/dev")``...).

    :func:`bwrap_argv` passes them to bwrap; a child forked inside the sandboxed fork server
    applies the same list itself (``child/_enclose.py``), so both views are one.
    """
    ops: list[tuple[str, ...]] = [
        ("--ro-bind", "/", "/"),
        ("--dev", "/dev"),
        ("--proc", "/proc"),
        ("--tmpfs", "/tmp"),  # noqa: S108 - a mount point inside the sandbox
    ]
    # Every visible path is bound again, not only those under /tmp: /dev/shm and friends are
    # hidden too, and a bind of an already visible path costs one mount. A visible tree that
    # holds a hidden path is bound before the hiding tmpfs, what lies below one after it.
    below = [p for p in (*paths.visible, *paths.sockets) if _under_hidden(p, paths.hidden)]
    ops += [("--ro-bind", str(kept), str(kept)) for kept in paths.visible if kept not in below]
    bound = (*paths.exposed, *(() if paths.egress is None else (paths.egress,)))
    ops += [
        ("--tmpfs", str(hidden)) if hidden.is_dir() else ("--ro-bind", "/dev/null", str(hidden))
        for hidden in paths.hidden
        if _shown(hidden, bound)
    ]
    ops += [("--ro-bind", str(kept), str(kept)) for kept in below]
    ops += [("--ro-bind", str(s), str(s)) for s in paths.sockets if s not in below]
    ops.append(("--bind", str(paths.scratch), str(paths.scratch)))
    ops += [("--bind", str(writable), str(writable)) for writable in paths.writable]
    if paths.egress is not None:
        # Last: the proxy socket stays reachable whatever the mounts above hide.
        ops.append(("--ro-bind", str(paths.egress), str(paths.egress)))
    return tuple(ops)


def bwrap_argv(
    bwrap: str,
    paths: CanonicalPaths,
    command: Sequence[str],
    *,
    network: bool,
    seccomp_fd: int | None = None,
) -> tuple[str, ...]:
    """The full bwrap argv running ``command`` (already absolute) inside ``paths``.

    ``seccomp_fd``: a descriptor the caller opens on the compiled filter for bwrap to load.
    """
    argv = [bwrap, *ISOLATION_FLAGS]
    if not network:
        argv.append("--unshare-net")
    argv += NAMESPACE_FLAGS
    for op in mount_ops(paths):
        argv += op
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if paths.cwd is not None:
        argv += ["--chdir", str(paths.cwd)]
    return (*argv, "--", *command)


#: The sandboxed fork server's own namespace flags: its children build their namespaces
#: themselves, so it keeps the capabilities of its user namespace that doing so needs.
SERVER_FLAGS = ("--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_NET_ADMIN")


def server_argv(
    bwrap: str,
    command: Sequence[str],
    *,
    hidden: Sequence[Path],
    writable: Sequence[Path],
    readable: Sequence[Path],
    seccomp_fd: int | None,
) -> tuple[str, ...]:
    """The bwrap argv of the sandboxed fork server (``child/_forkserver.py --sandboxed``).

    Its view is the host's, read-only, with the *hidden* trees (the state directory) replaced
    by empty ones in which only the session's *writable* roots (every child's scratch and
    worktree) and *readable* ones (the egress sockets) come back (a hidden tree inside one of
    those stays hidden); ``/tmp`` stays the host's so
    a child's visible paths below it can be bound. No child ever runs in this view: each builds
    its own from :func:`mount_ops` before its first instruction of its own.
    """
    argv = [bwrap, *ISOLATION_FLAGS, "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    argv += [*SERVER_FLAGS, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    bound = (*writable, *readable)
    # A hidden tree inside a bound root (a Ray node's runtime root in its writable /tmp) is
    # hidden after the binds, which would otherwise bring it back.
    inside = [p for p in hidden if any(p != root and is_within(p, root) for root in bound)]
    for path in hidden:
        if path not in inside:
            argv += ["--tmpfs", str(path)]
    for path in writable:
        argv += ["--bind", str(path), str(path)]
    for path in readable:
        argv += ["--ro-bind", str(path), str(path)]
    for path in inside:
        argv += ["--tmpfs", str(path)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return (*argv, "--", *command)


def _shown(hidden: Path, bound: Sequence[Path]) -> bool:
    """Whether *hidden* would show in the view without a mount of its own. Below ``/tmp`` (or
    ``/dev``: a Ray node's ``/dev/shm``) it is already gone under the view's own tree, unless a
    path bound again there holds it. Every fleet home registered under ``/tmp`` (a box that
    runs test suites had 89) cost every sandboxed child a mount each, and the view's every
    visible path a check against it."""
    if not any(is_within(hidden, root) for root in _REPLACED):
        return True
    return any(is_within(hidden, root) for root in bound)


def _under_hidden(path: Path, hidden: Sequence[Path]) -> bool:
    return any(is_within(path, root) for root in hidden)
