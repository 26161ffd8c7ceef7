"""A seccomp filter that keeps a sandboxed child from making setuid or setgid files.

As root, bwrap's ``--unshare-user`` maps the child to host uid 0, so a file it creates in a
bound directory (scratch, a worktree) is owned by host root, and ``chmod 4755`` on it would
leave a setuid-root program on the host. ``--cap-drop ALL`` does not stop that: the owner may
always set the bits. The filter below (classic BPF, handed to bwrap as ``--seccomp FD``) fails
with ``EPERM`` every call that could put ``S_ISUID`` or ``S_ISGID`` on a file — ``chmod``,
``fchmod``, ``fchmodat``, ``fchmodat2`` and the creating calls that take a mode (``open``,
``openat``, ``creat``, ``mknod``, ``mknodat``, ``mkdir``, ``mkdirat``) when the mode has either
bit — and fails ``openat2`` (whose mode sits in a struct BPF cannot read) and
``io_uring_setup`` (whose requests bypass the filter) with ``ENOSYS`` so libraries fall back
to the plain calls. A call from another architecture than the one the filter was built for
(x86_64's x32 or i386 ABIs included) kills the process.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import platform
import shutil
import stat
import struct
import tempfile
from pathlib import Path

# BPF opcodes (linux/filter.h, linux/bpf_common.h) and seccomp return values.
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
_NR, _ARCH, _ARGS = 0, 4, 16
_SUID_BITS = 0o6000
_X32_BIT = 0x40000000

# (audit arch, {syscall: (number, index of the mode argument)}, [syscalls refused with ENOSYS])
_ARCHES = {
    "x86_64": (
        0xC000003E,
        {
            "open": (2, 2),
            "creat": (85, 1),
            "chmod": (90, 1),
            "fchmod": (91, 1),
            "mkdir": (83, 1),
            "mknod": (133, 1),
            "openat": (257, 3),
            "mkdirat": (258, 2),
            "mknodat": (259, 2),
            "fchmodat": (268, 2),
            "fchmodat2": (452, 2),
        },
        (437, 425),  # openat2, io_uring_setup
    ),
    "aarch64": (
        0xC00000B7,
        {
            "mkdirat": (34, 2),
            "mknodat": (33, 2),
            "fchmod": (52, 1),
            "fchmodat": (53, 2),
            "openat": (56, 3),
            "fchmodat2": (452, 2),
        },
        (437, 425),
    ),
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def nosuid_filter(machine: str | None = None) -> bytes:
    """The compiled filter (an array of ``struct sock_filter``) for ``machine`` (default: this).

    Raises :class:`KeyError` for an architecture the filter has no syscall table for.
    """
    arch, calls, unsupported = _ARCHES[machine or platform.machine()]
    body: list[bytes] = []
    # One block per call: if nr == N, load its mode argument and refuse when a bit is set.
    # Every matched block returns, so the accumulator still holds nr for the next compare.
    for number, index in calls.values():
        body += [
            _insn(_JEQ_K, number, 0, 4),
            _insn(_LD_W_ABS, _ARGS + 8 * index),  # the low 32 bits (little-endian): mode_t
            _insn(_JSET_K, _SUID_BITS, 0, 1),
            _insn(_RET_K, _RET_ERRNO | errno.EPERM),
            _insn(_RET_K, _RET_ALLOW),
        ]
    for number in unsupported:
        body += [_insn(_JEQ_K, number, 0, 1), _insn(_RET_K, _RET_ERRNO | errno.ENOSYS)]
    head = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, arch, 1, 0),
        _insn(_RET_K, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, _NR),
        _insn(_JGE_K, _X32_BIT, 0, 1),
        _insn(_RET_K, _RET_KILL_PROCESS),
    ]
    return b"".join([*head, *body, _insn(_RET_K, _RET_ALLOW)])


_PREFIX = "fleet-seccomp-"


def _sweep_orphans() -> None:
    """Remove filter directories left by processes of ours that died without running atexit.

    A directory is named ``fleet-seccomp-<pid>-<random>``; one whose pid is gone and which this
    user owns is removed. Anything else (another user's, a live process's, a foreign name) stays.
    """
    root = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            pid_text, _, rest = entry.name.removeprefix(_PREFIX).partition("-")
            if not entry.name.startswith(_PREFIX) or not pid_text.isdigit() or not rest:
                continue
            try:
                info = entry.lstat()
                if info.st_uid != os.getuid() or not stat.S_ISDIR(info.st_mode):
                    continue
                os.kill(int(pid_text), 0)
            except ProcessLookupError:
                shutil.rmtree(entry, ignore_errors=True)
            except OSError:
                continue


@functools.cache
def filter_file() -> Path | None:
    """This process's copy of :func:`nosuid_filter` in a private directory, or ``None``.

    ``None`` on an architecture without a syscall table. The file is read by the shell that
    starts bwrap (``3<FILE``), outside the sandbox; its directory is ``0700`` and the sandbox's
    ``/tmp`` is a fresh tmpfs, so no child can reach or replace it.
    """
    try:
        program = nosuid_filter()
    except KeyError:
        return None
    _sweep_orphans()
    directory = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = directory / "nosuid.bpf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    try:
        os.write(fd, program)
    finally:
        os.close(fd)
    return path
