"""Reading and writing a parent's configuration files where ``fleet install`` says it does.

A project is somebody else's tree: a repository can commit ``.claude`` as a symlink to
``~/.claude``, or ``.mcp.json`` as one to a file outside the project, and an install that
followed it would write into the user's own settings (or anywhere else). In a *confined* place
(``--project``) every directory below the root is opened with ``O_NOFOLLOW`` one step at a time
(``openat``) and the file itself too, so a link anywhere on the way is refused in one line and
nothing is read or written through it, also when it appears between a check and the write. In
the user's own configuration (``--user``) a linked dotfile is the user's choice (a dotfiles
manager): it is followed, and its target is what changes.

Every file written is at most ``0644`` and every directory created at most ``0755``, whatever
the umask or the file's old mode: a file a parent runs commands from is never left writable by
group or others. Files are replaced atomically (a fresh ``O_EXCL`` temporary, then ``rename``).
"""

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import attrs

from orchestrator._errors import UsageError

FILE_MODE: Final = 0o644
DIR_MODE: Final = 0o755
NOT_SHARED: Final = 0o022  # group/other write bits: never set on what an install writes
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@attrs.frozen
class Place:
    """Where an install writes: *root*, and whether links below it are refused."""

    root: Path
    confined: bool

    def parts(self, path: Path) -> tuple[str, ...]:
        """*path*'s components below the root (a confined place refuses anything else)."""
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            raise UsageError(f"install: {path} is outside {self.root}") from None
        if any(part in {"", ".", ".."} for part in rel.parts):
            raise UsageError(f"install: {path} is not a plain path below {self.root}")
        return rel.parts


def _refuse(place: Place, path: Path) -> UsageError:
    return UsageError(
        f"install: {path} is a symbolic link inside {place.root}; fleet writes only inside the "
        "project and never through a link (remove the link, or install with --user)"
    )


@contextlib.contextmanager
def _directory(place: Place, parts: tuple[str, ...], made: list[Path] | None) -> Iterator[int]:
    """An fd of the directory *parts* below the root, each step opened without following a
    link; missing directories are created when *made* is given (and listed in it)."""
    fd = os.open(place.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        here = place.root
        for part in parts:
            here = here / part
            try:
                step = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if made is None:
                    raise
                os.mkdir(part, DIR_MODE, dir_fd=fd)
                made.append(here)
                step = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in {errno.ELOOP, errno.ENOTDIR}:
                    raise _refuse(place, here) from None
                raise
            os.close(fd)
            fd = step
        yield fd
    finally:
        os.close(fd)


def read(place: Place, path: Path) -> str | None:
    """The text of *path*, or ``None`` when it does not exist."""
    try:
        if not place.confined:
            return path.read_text(encoding="utf-8")
        parts = place.parts(path)
        with _directory(place, parts[:-1], None) as directory:
            try:
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(parts[-1], flags, dir_fd=directory)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise _refuse(place, path) from None
                raise
            with os.fdopen(fd, encoding="utf-8") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise UsageError(f"install: {path} is not a regular file")
                return handle.read()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise UsageError(f"install: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"install: {path}: {exc.strerror}") from None


def write(place: Place, path: Path, text: str) -> list[Path]:
    """Replace *path* with *text* atomically; the directories it had to create."""
    made: list[Path] = []
    parts: tuple[str, ...]
    if not place.confined and path.is_symlink():
        path = path.resolve()  # the user's linked dotfile stays a link: its target changes
    if not place.confined:
        for ancestor in reversed(path.parents):
            if not ancestor.exists():
                ancestor.mkdir(mode=DIR_MODE)  # Path.mkdir(parents=True) ignores mode above
                made.append(ancestor)
        root, parts = path.parent, (path.name,)
        place = Place(root, confined=True)  # the last step: no link may appear under us now
    else:
        parts = place.parts(path)
    try:
        with _directory(place, parts[:-1], made) as directory:
            _replace(directory, parts[-1], text)
    except OSError as exc:
        raise UsageError(f"install: {path}: {exc.strerror}") from None
    return made


def _replace(directory: int, name: str, text: str) -> None:
    try:
        old = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        mode = FILE_MODE
    else:
        if stat.S_ISLNK(old.st_mode):
            raise UsageError(f"install: {name} became a symbolic link; nothing was written")
        mode = stat.S_IMODE(old.st_mode)
    mode &= ~NOT_SHARED & ~stat.S_ISUID & ~stat.S_ISGID & ~stat.S_ISVTX
    temp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.fleet"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temp, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=directory)
        raise


def remove(place: Place, path: Path, created: frozenset[str]) -> list[Path]:
    """Delete *path*, then each parent directory named in *created* that it left empty."""
    if not place.confined:
        path.unlink()
        gone = []
        parent = path.parent
        while parent.name in created and not any(parent.iterdir()):
            parent.rmdir()
            gone.append(parent)
            parent = parent.parent
        return gone
    parts = place.parts(path)
    with _directory(place, parts[:-1], None) as directory:
        os.unlink(parts[-1], dir_fd=directory)
    gone = []
    for depth in range(len(parts) - 1, 0, -1):
        name = parts[depth - 1]
        if name not in created:
            break
        with _directory(place, parts[: depth - 1], None) as directory:
            try:
                os.rmdir(name, dir_fd=directory)
            except OSError:
                break  # not empty: somebody else's now
        gone.append(place.root.joinpath(*parts[:depth]))
    return gone
