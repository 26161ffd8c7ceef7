"""A remote child's resume context: the few files of its scratch its backend resumes from.

A child on a Ray node keeps its backend's session store in its node directory, which goes when
the child ends and is lost with its node. So at each turn end the supervisor has the node
:func:`gather` what the child's backend needs to resume — the builtin agent's transcript, Pi's
session file, Claude Code's session file, a Codex thread's rollout — and keeps that copy in the
session's state directory (:func:`keep`, in the child's own scratch place there, laid out as in
the node's scratch); a revive on any node ships it back into the new node directory's scratch
(:func:`restore`) before the child starts.

What the node directory holds is the child's to write, so the context is hostile input on both
sides: only regular files with one link are read, never through a symbolic link (every
directory is opened relative to its parent with ``O_NOFOLLOW``, so a link swapped in meanwhile
is not followed either), only the names a backend makes (each part ``[A-Za-z0-9._-]``, never
``.`` or ``..``) under the places it makes them, at most :data:`MAX_FILES` files and
:data:`CAP` bytes in all (over it, nothing is kept and the child cannot be revived: one line,
:class:`ContextRefused`), and a walk of at most :data:`WALK_LIMIT` entries. Everything is written
as new 0600 files in 0700 directories made for it, beneath one directory opened once.
"""

import contextlib
import ctypes
import errno
import fnmatch
import os
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

import ipc
from orchestrator._trees import remove_tree

__all__ = [
    "CAP",
    "REFUSED",
    "ContextRefused",
    "Want",
    "gather",
    "keep",
    "read_kept",
    "refuse",
    "restore",
    "wants",
]

#: The most a remote child's resume context may hold (its transcript or session files).
CAP = 64 * 1024 * 1024
#: The most files it may hold.
MAX_FILES = 256
#: The most directory entries a walk of the node's scratch looks at.
WALK_LIMIT = 10_000
#: In a kept place: why this child's context was not kept (written by the supervisor only; no
#: backend makes a file of that name at the top of its scratch).
REFUSED = "context-refused"
#: One part of a kept file's path.
_PART = re.compile(r"[A-Za-z0-9._-]{1,255}")
#: A Claude Code session id or a Codex thread id, as it may appear in a file name.
_ID = re.compile(r"[A-Za-z0-9-]{1,128}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: ``renameat2`` (:func:`_exchange`): the C library, its "relative to the working directory"
#: and its flag that swaps the two paths.
_LIBC = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
#: A file a keep in place (``_replace_one``, :func:`ipc.write_private`) writes before its
#: rename, left by one that died.
_LEFTOVER = re.compile(r"\.[A-Za-z0-9._-]+\.\d+\.[0-9a-f]+\.tmp")


class ContextRefused(RuntimeError):
    """A child's context will not be kept (over the cap, too many files): one line."""


@attrs.frozen
class Want:
    """Files a backend resumes from: named *pattern*, directly in *root* (a path below the
    scratch, as parts) or, *deep*, anywhere below it."""

    root: tuple[str, ...]
    pattern: str
    deep: bool = False

    def holds(self, parts: tuple[str, ...]) -> bool:
        """Whether a kept file at *parts* (below the scratch) is one of these."""
        depth = len(self.root)
        if parts[:depth] != self.root or not fnmatch.fnmatchcase(parts[-1], self.pattern):
            return False
        return len(parts) > depth + 1 if self.deep else len(parts) == depth + 1


def wants(backend: str, resume: str) -> list[Want]:
    """What *backend* resumes from (*resume*: its session or thread id, for Claude Code and
    Codex); none for a backend that cannot be revived, or an id that is not one."""
    if backend == "builtin":
        return [Want((), "transcript.json")]
    if backend == "pi":
        return [Want((), "pi-session.jsonl")]
    if not _ID.fullmatch(resume):
        return []
    if backend == "claude":  # projects/<the cwd's slug>/<id>.jsonl
        return [Want(("claude", "home", ".claude", "projects"), f"{resume}.jsonl", deep=True)]
    if backend == "codex":  # sessions/YYYY/MM/DD/rollout-…-<id>.jsonl
        return [Want(("codex", "config", "codex", "sessions"), f"*{resume}*.jsonl", deep=True)]
    return []


def _name(parts: tuple[str, ...]) -> str:
    return "/".join(parts)


def _parts(name: str) -> tuple[str, ...]:
    """*name*'s parts, each checked (no ``.``, ``..``, empty or odd part): ValueError."""
    parts = tuple(name.split("/"))
    if not parts or any(p in {".", ".."} or not _PART.fullmatch(p) for p in parts):
        raise ValueError(f"{name!r} is not a context file's name")
    return parts


def _open_dir(at: int, parts: tuple[str, ...]) -> int | None:
    """The directory *parts* below the directory *at*, each opened without following a link;
    ``None`` when one is missing, a link or not a directory."""
    fd = os.dup(at)
    for part in parts:
        try:
            below = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = below
    return fd


def _read(at: int, name: str, room: int) -> bytes | None:
    """Regular file *name* in the directory *at*, at most *room* + 1 bytes of it; ``None`` for
    a link, a non-regular file or one with other links."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=at)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            return None
        return handle.read(room + 1)


def _found(top: int, want: Want) -> Iterator[tuple[tuple[str, ...], int, str]]:
    """Each candidate of *want* below *top*: its parts, its directory's fd and its name."""
    root = _open_dir(top, want.root)
    if root is None:
        return
    try:
        if not want.deep:  # a name, not a pattern
            yield (*want.root, want.pattern), root, want.pattern
            return
        seen = 0
        for folder, dirs, files, at in os.fwalk(".", dir_fd=root, follow_symlinks=False):
            seen += len(dirs) + len(files)
            if seen > WALK_LIMIT:
                raise ContextRefused(f"its scratch holds over {WALK_LIMIT} entries")
            below = tuple(p for p in folder.split("/") if p not in {"", "."})
            for name in sorted(files):
                parts = (*want.root, *below, name)
                if fnmatch.fnmatchcase(name, want.pattern) and all(
                    _PART.fullmatch(p) for p in parts
                ):
                    yield parts, at, name
    finally:
        os.close(root)


def gather(scratch: str, needs: list[Want], cap: int = CAP) -> dict[str, bytes]:
    """The files of *needs* in the directory *scratch* (name below it → bytes); raises
    :class:`ContextRefused` past *cap* bytes or :data:`MAX_FILES` files. Runs on the node."""
    got: dict[str, bytes] = {}
    total = 0
    top = os.open(scratch, _DIR_FLAGS)
    try:
        for want in needs:
            for parts, at, name in _found(top, want):
                data = _read(at, name, cap - total)
                if data is None:
                    continue
                total += len(data)
                if total > cap:
                    raise ContextRefused(over(cap))
                got[_name(parts)] = data
                if len(got) > MAX_FILES:
                    raise ContextRefused(f"its context is over {MAX_FILES} files")
    finally:
        os.close(top)
    return got


def over(cap: int) -> str:
    """The one line of a context over *cap*."""
    return f"its context (transcript or session files) is over the {cap}-byte cap"


def _checked(files: Mapping[str, bytes], needs: list[Want] | None, cap: int) -> None:
    """Refuse *files* (ValueError, ContextRefused) unless each is a context file's name (one of
    *needs*, when given) and they are within the caps."""
    if len(files) > MAX_FILES:
        raise ContextRefused(f"its context is over {MAX_FILES} files")
    if sum(len(data) for data in files.values()) > cap:
        raise ContextRefused(over(cap))
    for name in files:
        parts = _parts(name)
        if needs is not None and not any(want.holds(parts) for want in needs):
            raise ValueError(f"{name!r} is not a file its backend resumes from")


def _write_beneath(top: int, name: str, data: bytes) -> None:
    """*data* as the new 0600 file *name* below the directory *top*; its directories made
    0700 on the way (an existing one is used only if it is a directory, not a link)."""
    *folders, leaf = _parts(name)
    fd = os.dup(top)
    try:
        for part in folders:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            below = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = below
        out = os.open(leaf, _NEW_FLAGS, 0o600, dir_fd=fd)
        with os.fdopen(out, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        os.close(fd)


def restore(scratch: str, files: Mapping[str, bytes], cap: int = CAP) -> None:
    """Write *files* (a kept context) below the directory *scratch* (a new node directory's,
    still empty of them): new 0600 files, 0700 directories. Runs on the node."""
    _checked(files, None, cap)
    top = os.open(scratch, _DIR_FLAGS)
    try:
        for name, data in files.items():
            _write_beneath(top, name, data)
    finally:
        os.close(top)


def _fresh(place: str, *, sweep: bool = True) -> str:
    """A new 0700 directory beside *place* (not yet there), for :func:`keep` to fill; what an
    earlier supervisor that died mid-keep left beside it is removed first (*sweep*: a keep's
    second directory, made once the first has swept, does not look again)."""
    parent, base = os.path.split(place)
    if sweep:
        left = re.compile(rf"\.{re.escape(base)}\.(\d+)\.\d+")
        with contextlib.suppress(OSError):
            for name in os.listdir(parent):
                found = left.fullmatch(name)
                if found and int(found.group(1)) != os.getpid():
                    remove_tree(os.path.join(parent, name))
    for n in range(100):
        candidate = os.path.join(parent, f".{base}.{os.getpid()}.{n}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(candidate, 0o700)
            return candidate
    raise FileExistsError(f"no fresh directory beside {place}")


def _swap_in(fresh: str, place: str) -> None:
    """*fresh* as *place*: exchanged with the copy before in one step (a supervisor killed
    meanwhile leaves one copy or the other at *place*, never none), or, where the file system
    cannot exchange, moved aside and in."""
    if not os.path.lexists(place):
        os.rename(fresh, place)
    elif _exchange(fresh, place):
        remove_tree(fresh)  # now the copy before
    else:
        old = _fresh(place, sweep=False)  # keep and refuse swept beside it just now
        os.rename(place, old)  # onto the empty directory just made
        os.rename(fresh, place)
        remove_tree(old)


def _exchange(one: str, other: str) -> bool:
    """``renameat2(RENAME_EXCHANGE)``: swap the two paths atomically. ``False`` where the C
    library or the file system cannot (nothing changed); any other failure raises."""
    renameat2 = getattr(_LIBC, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(one), _AT_FDCWD, os.fsencode(other), _RENAME_EXCHANGE):
        code = ctypes.get_errno()
        if code in {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP}:
            return False
        raise OSError(code, os.strerror(code), other)
    return True


def keep(place: str, files: Mapping[str, bytes], needs: list[Want], cap: int = CAP) -> None:
    """Keep *files* (what :func:`gather` sent for *needs*) as the directory *place* (a child's
    own scratch place in the state directory), replacing what was kept there: written into a
    fresh directory beside it and swapped in, or, for a backend that resumes from one file
    kept there before, that file replaced in place (:func:`_replace_one`). ValueError or
    :class:`ContextRefused` for files that are not such a context, and nothing is changed."""
    _checked(files, needs, cap)
    if _replace_one(place, files, needs):
        return
    fresh = _fresh(place)
    try:
        top = os.open(fresh, _DIR_FLAGS)
        try:
            for name, data in files.items():
                _write_beneath(top, name, data)
        finally:
            os.close(top)
        _swap_in(fresh, place)
    except BaseException:
        remove_tree(fresh)
        raise


def _replace_one(place: str, files: Mapping[str, bytes], needs: list[Want]) -> bool:
    """For a backend that resumes from one named file (the builtin agent's transcript, Pi's
    session) whose copy at *place* holds that file and nothing else but leftovers of a keep
    that died: the file in *files* written beside it, made durable and renamed over it
    (:func:`ipc.write_private`: a third of the system calls of a swap, which a turn end of
    every remote child pays). Whether it did; ``False`` leaves *place* as it was."""
    if len(needs) != 1 or needs[0].deep or needs[0].root or set(files) != {needs[0].pattern}:
        return False
    name = needs[0].pattern
    try:
        top = os.open(place, _DIR_FLAGS)
    except OSError:  # not kept yet (or not a directory): the swap makes it
        return False
    try:
        listed = os.listdir(top)
        if name not in listed:
            return False
        for other in listed:
            if other == name:
                continue
            if not _LEFTOVER.fullmatch(other):
                return False  # a refusal, or a file of another layout: the swap replaces all
            os.unlink(other, dir_fd=top)
    finally:
        os.close(top)
    ipc.write_private(Path(place) / name, files[name])
    return True


def refuse(place: str, line: str) -> None:
    """Nothing of the child's context is kept at *place* any more, and :data:`REFUSED` there
    says why in *line*: it cannot be revived."""
    fresh = _fresh(place)
    top = os.open(fresh, _DIR_FLAGS)
    try:
        _write_beneath(top, REFUSED, " ".join(line.split()).encode())
    finally:
        os.close(top)
    _swap_in(fresh, place)


def refused(place: str) -> str:
    """Why the context kept at *place* was refused ("" when it was not)."""
    try:
        fd = os.open(place, _DIR_FLAGS)
    except OSError:
        return ""
    try:
        data = _read(fd, REFUSED, 4096)
    finally:
        os.close(fd)
    return "" if data is None else data[:4096].decode(errors="replace").strip()


def read_kept(place: str, needs: list[Want], cap: int = CAP) -> dict[str, bytes]:
    """The context kept at *place* (what :func:`restore` ships to a new node): the files of
    *needs* there, as :func:`gather` reads them."""
    try:
        return gather(place, needs, cap)
    except FileNotFoundError:
        return {}
