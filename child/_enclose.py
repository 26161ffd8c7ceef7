"""A forked child builds its own sandbox inside the sandboxed fork server (Linux only).

The sandboxed fork server (``child/_forkserver.py --sandboxed``) runs inside one bubblewrap
sandbox with the capabilities of its own user namespace. A child forked from it must end up
where a child started by ``bwrap <its flags>`` would: nothing of its siblings or of the server
reachable. The server forks it as pid 1 of a fresh pid namespace; then, before any of the
child's own code runs, :func:`enter`:

1. unshares a mount, network, IPC and UTS namespace of its own;
2. applies the child's bwrap mount operations (``--dev``, ``--proc``, ``--tmpfs``, ``--bind``,
   ``--ro-bind``: :func:`sandbox._bwrap.mount_ops`, sent by the supervisor) in their order,
   every bind taken from the server's view *before* the first operation (as bwrap takes its
   sources from the old root), with ``nosuid,nodev`` (and ``ro``) set on each whole tree;
   a fresh ``/proc`` of its own pid namespace, a fresh ``/dev`` (device nodes bound, its own
   ``devpts`` and ``/dev/shm``), its own ``/tmp``;
3. brings its own loopback up and joins a fresh session keyring;
4. unshares a user namespace of its own (the same uid and gid mapped; ``setgroups`` denied), so
   the mounts above are locked and the server's namespaces are owned by a namespace it has no
   capability in, then drops every capability (bounding, ambient, effective, permitted,
   inheritable) and sets ``no_new_privs``.

The seccomp filter of the server's bubblewrap is inherited (a filter cannot be removed). What
the child may then see is exactly what its bwrap command line would have shown it. Any failure
raises :class:`OSError`; the caller exits without running the child.
"""

import ctypes
import errno
import fcntl
import os
import socket
import struct
import sys
from collections.abc import Sequence
from typing import Final

CLONE_NEWNS: Final = 0x00020000
CLONE_NEWUTS: Final = 0x04000000
CLONE_NEWIPC: Final = 0x08000000
CLONE_NEWUSER: Final = 0x10000000
CLONE_NEWPID: Final = 0x20000000
CLONE_NEWNET: Final = 0x40000000

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
_AT_RECURSIVE, _AT_EMPTY_PATH = 0x8000, 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_ATTR_RDONLY, _ATTR_NOSUID, _ATTR_NODEV = 0x1, 0x2, 0x4
# The new mount API has one syscall number on every architecture.
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_SYS_SETNS = {"x86_64": 308, "aarch64": 268}
_SYS_UNSHARE = {"x86_64": 272, "aarch64": 97}
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT = 38, 24, 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_KEYCTL_JOIN_SESSION_KEYRING = 1
_CAP_VERSION_3 = 0x20080522
_SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8913, 0x8914
_IFF_UP = 0x1
#: What bwrap's ``--dev`` binds from the host's /dev.
DEVICES: Final = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS: Final = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
    "core": "/proc/kcore",
    "ptmx": "pts/ptmx",
}
#: bwrap's ``--proc`` binds these read-only over themselves.
_PROC_READ_ONLY: Final = ("sys", "sysrq-trigger", "irq", "bus")

_libc = ctypes.CDLL(None, use_errno=True)
if sys.platform == "linux":  # imported everywhere (the fork server preloads it), used here only
    _libc.syscall.restype = ctypes.c_long
    _libc.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_char_p)
    _libc.prctl.argtypes = (ctypes.c_int,) + (ctypes.c_ulong,) * 4


def _machine() -> str:
    return os.uname().machine


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _syscall(number: int, *args: object, what: str) -> int:
    return _check(_libc.syscall(ctypes.c_long(number), *args), what)


def supported() -> str | None:
    """Why this machine cannot run :func:`enter` (``None`` when it can)."""
    if sys.platform != "linux":
        return f"no namespaces on {sys.platform}"
    if _machine() not in _SYS_UNSHARE:
        return f"no syscall table for {_machine()}"
    return None


def unshare(flags: int) -> None:
    _syscall(_SYS_UNSHARE[_machine()], ctypes.c_int(flags), what=f"unshare({flags:#x})")


def setns(fd: int, nstype: int) -> None:
    _syscall(_SYS_SETNS[_machine()], ctypes.c_int(fd), ctypes.c_int(nstype), what="setns")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    encoded = [None if item is None else os.fsencode(item) for item in (source, target, fstype)]
    result = _libc.mount(*encoded, flags, data.encode() if data else None)
    _check(result, f"mount {fstype or source} on {target}")


def _clone_tree(path: str, *, recursive: bool = True) -> int:
    flags = _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | (_AT_RECURSIVE if recursive else 0)
    return _syscall(
        _SYS_OPEN_TREE,
        ctypes.c_int(-100),  # AT_FDCWD
        os.fsencode(path),
        ctypes.c_uint(flags),
        what=f"clone mount of {path}",
    )


def _set_attrs(fd: int, attrs: int, what: str) -> None:
    # struct mount_attr { u64 attr_set, attr_clr, propagation, userns_fd; }
    body = ctypes.create_string_buffer(struct.pack("=QQQQ", attrs, 0, 0, 0))
    _syscall(
        _SYS_MOUNT_SETATTR,
        ctypes.c_int(fd),
        b"",
        ctypes.c_uint(_AT_EMPTY_PATH | _AT_RECURSIVE),
        body,
        ctypes.c_size_t(32),
        what=f"mount_setattr {what}",
    )


def _attach(fd: int, target: str) -> None:
    _syscall(
        _SYS_MOVE_MOUNT,
        ctypes.c_int(fd),
        b"",
        ctypes.c_int(-100),
        os.fsencode(target),
        ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
        what=f"attach mount on {target}",
    )


def _mount_point(target: str, *, directory: bool) -> None:
    """Create *target* (and its parents) to mount on, as bwrap does; an existing one stays."""
    if os.path.lexists(target):
        return
    os.makedirs(os.path.dirname(target) or "/", mode=0o755, exist_ok=True)
    if directory:
        os.mkdir(target, 0o755)
    else:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def _gone(hidden: str) -> bool:
    """Whether *hidden*, a path the plan hides, no longer exists: it hides nothing then, and its
    mount point could not be made where a read-only tree holds it (``EROFS``). A fleet home
    removed between the plan and the fork (another fleet's test run ending) failed the fork."""
    return not os.path.lexists(hidden)


def _bind(fd: int, target: str, *, directory: bool) -> None:
    _mount_point(target, directory=directory)
    _attach(fd, target)


def _tmpfs(target: str) -> None:
    _mount_point(target, directory=True)
    _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")


def _dev(target: str, devices: dict[str, int]) -> None:
    _tmpfs(target)
    for name, fd in devices.items():
        _bind(fd, f"{target}/{name}", directory=False)
    for name, link in _DEV_LINKS.items():
        os.symlink(link, f"{target}/{name}")
    os.mkdir(f"{target}/shm", 0o1777)
    os.chmod(f"{target}/shm", 0o1777)  # noqa: S103 - the child's own /dev/shm, as bwrap's
    os.mkdir(f"{target}/pts", 0o755)
    _mount(
        "devpts",
        f"{target}/pts",
        "devpts",
        _MS_NOSUID | _MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=620",
    )


def _proc(target: str) -> None:
    _mount_point(target, directory=True)
    _mount("proc", target, "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for name in _PROC_READ_ONLY:
        path = f"{target}/{name}"
        if os.path.exists(path):
            fd = _clone_tree(path)
            try:
                _set_attrs(fd, _ATTR_RDONLY | _ATTR_NOSUID | _ATTR_NODEV, path)
                _attach(fd, path)
            finally:
                os.close(fd)


def apply_ops(ops: Sequence[Sequence[str]]) -> None:
    """Apply bwrap mount operations (``--ro-bind / /`` first: the server's root already is).

    Every bind source is cloned before the first operation, as bwrap resolves its sources in
    the old root: a source that a later ``--tmpfs`` covers is still the one named.
    """
    if not ops or list(ops[0]) != ["--ro-bind", "/", "/"]:
        raise OSError(errno.EINVAL, "sandbox plan must start with --ro-bind / /")
    clones: dict[int, tuple[int, bool]] = {}
    devices: dict[str, int] = {}
    try:
        for index, op in enumerate(ops[1:], start=1):
            if op[0] in ("--bind", "--ro-bind"):
                source = op[1]
                directory = os.path.isdir(source)
                fd = _clone_tree(source)
                clones[index] = (fd, directory)
                flags = _ATTR_NOSUID | _ATTR_NODEV | (_ATTR_RDONLY if op[0] == "--ro-bind" else 0)
                _set_attrs(fd, flags, source)
            elif op[0] == "--dev" and not devices:
                for name in DEVICES:
                    fd = _clone_tree(f"/dev/{name}", recursive=False)
                    devices[name] = fd
                    _set_attrs(fd, _ATTR_NOSUID, f"/dev/{name}")
            elif op[0] not in ("--proc", "--tmpfs", "--dev"):
                raise OSError(errno.EINVAL, f"sandbox plan: unknown operation {op[0]}")
        for index, op in enumerate(ops[1:], start=1):
            if op[0] == "--dev":
                _dev(op[1], devices)
            elif op[0] == "--proc":
                _proc(op[1])
            elif op[0] == "--tmpfs":
                if not _gone(op[1]):
                    _tmpfs(op[1])
            else:
                fd, directory = clones[index]
                if op[1] == os.devnull and _gone(op[2]):
                    continue  # a hidden file that is gone
                _bind(fd, op[2], directory=directory)
    finally:
        for fd, _directory in clones.values():
            os.close(fd)
        for fd in devices.values():
            os.close(fd)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def _own_user_namespace() -> None:
    uid, gid = os.geteuid(), os.getegid()
    unshare(CLONE_NEWUSER)
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as handle:
            handle.write(text)


def drop_capabilities() -> None:
    """No capability left in any set, none to regain (``no_new_privs``)."""
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as handle:
        last = int(handle.read())
    for cap in range(last + 1):
        _check(_libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient")
    header = ctypes.create_string_buffer(struct.pack("=Ii", _CAP_VERSION_3, 0))
    data = ctypes.create_string_buffer(bytes(24))
    _syscall(_SYS_CAPSET[_machine()], header, data, what="capset")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def enter(ops: Sequence[Sequence[str]], cwd: str | None) -> None:
    """Build this process's sandbox (it must be pid 1 of a pid namespace of its own)."""
    if os.getpid() != 1:
        raise OSError(errno.EINVAL, "enter: not the init of a fresh pid namespace")
    unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    apply_ops(ops)
    _loopback_up()
    try:
        _syscall(
            _SYS_KEYCTL[_machine()],
            ctypes.c_int(_KEYCTL_JOIN_SESSION_KEYRING),
            None,
            what="join a session keyring",
        )
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EPERM):
            raise
    _own_user_namespace()
    drop_capabilities()
    if cwd is not None:
        os.chdir(cwd)
