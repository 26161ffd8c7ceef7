"""Path rules for copying a child's changes into the parent workspace.

A changed path is a ``/``-separated string relative to a workspace root, exactly as Git prints it.
Before anything is written the copy-back refuses a path that is lexically unsafe (absolute, ``..``,
empty or ``.`` components), that names Git metadata in any spelling a file system may fold to
``.git``, whose existing ancestor is a symlink (dangling or not) or a file, or that would create a
name differing from an existing sibling only by Unicode normalization or by a typographic lookalike.
A symlink the child creates must point inside the workspace and outside Git metadata.

The checks answer with a one-phrase reason (``None`` when the path is fine) so the caller can list
every refused path at once. :func:`open_dir` is the enforcement at the moment of use: it walks every
ancestor with ``O_NOFOLLOW`` and hands back a directory descriptor, so a symlink swapped in after
the checks makes the operation fail instead of writing through it.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
import unicodedata
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from pathlib import Path

# Code points HFS+ ignores when comparing names, so ".g\u200cit" is ".git" there.
_HFS_IGNORABLE = dict.fromkeys(
    map(ord, "\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"),
) | dict.fromkeys(map(ord, "\u206a\u206b\u206c\u206d\u206e\u206f\ufeff"))
# NTFS 8.3 short names of ".git" ("GIT~1"); trailing dots and spaces and ":stream" suffixes fold.
_NTFS_SHORT_NAME = re.compile(r"git~\d+")
# Typographic characters a model or an OS substitutes for ASCII: curly quotes, the narrow
# no-break space macOS puts before AM/PM in screenshot names, other spaces, dashes.
_LOOKALIKES = str.maketrans(
    dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u02bc\uff07", "'")
    | dict.fromkeys("\u201c\u201d\u201e\u201f\u2033\uff02", '"')
    | dict.fromkeys("\u00a0\u2002\u2003\u2007\u2009\u200a\u202f\u205f\u3000", " ")
    | dict.fromkeys("\u2010\u2011\u2012\u2013\u2212\ufe63\uff0d", "-")
)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def fold_name(name: str) -> str:
    """One path component as the most forgiving file system compares it: Unicode NFC, HFS+
    ignorable code points dropped, NTFS ``:stream`` suffixes and trailing dots and spaces cut,
    case folded."""
    name = unicodedata.normalize("NFC", name.translate(_HFS_IGNORABLE))
    return name.split(":", 1)[0].rstrip(". ").casefold()


def is_git_metadata(name: str) -> bool:
    """Whether one path component is ``.git`` under any case, HFS+ or NTFS folding."""
    folded = fold_name(name)
    return folded == ".git" or _NTFS_SHORT_NAME.fullmatch(folded) is not None


def lexical_problem(path: str) -> str | None:
    """Why ``path`` can never be copied back, judged from the string alone; ``None`` if it can."""
    if not path:
        return "empty path"
    if path.startswith("/"):
        return "absolute path"
    if "\0" in path:
        return "NUL byte in path"
    for part in path.split("/"):
        if part in {"", ".", ".."}:
            return f"path has a {part or 'empty'!r} component"
        if is_git_metadata(part):
            return f"path is inside Git metadata ({part!r})"
    return None


def link_target_problem(path: str, target: str) -> str | None:
    """Why a symlink at ``path`` pointing to ``target`` may not enter the workspace."""
    if target.startswith("/"):
        return f"symlink to absolute path {target!r}"
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == ".." or resolved.startswith("../"):
        return f"symlink target {target!r} escapes the workspace"
    if any(is_git_metadata(part) for part in resolved.split("/")):
        return f"symlink target {target!r} is inside Git metadata"
    return None


def open_dir(root: Path, dir_rel: str, created: list[str] | None = None) -> int:
    """Open ``root/dir_rel`` without following any symlink below ``root``; the caller closes it.

    With ``created`` given, missing directories are made (mode 0777 less the umask) and their
    relative paths appended in creation order, so the caller can remove them again. Raises
    ``OSError``: ``ELOOP``/``ENOTDIR`` when an ancestor is a symlink or a file, ``ENOENT`` when
    one is missing and ``created`` is ``None``.
    """
    fd = os.open(root, _DIR_FLAGS)
    done = ""
    try:
        for part in dir_rel.split("/") if dir_rel else ():
            done = posixpath.join(done, part)
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if created is None:
                    raise
                os.mkdir(part, 0o777, dir_fd=fd)
                created.append(done)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def lstat_below(root: Path, path: str) -> os.stat_result | None:
    """``lstat`` of ``root/path`` reached without following symlinks.

    ``None`` when the entry or an ancestor is missing, or an ancestor is not a real directory:
    what Git itself treats as "not in the work tree".
    """
    try:
        fd = open_dir(root, posixpath.dirname(path))
    except OSError as exc:
        if exc.errno in {errno.ENOENT, errno.ENOTDIR, errno.ELOOP}:
            return None
        raise
    try:
        return os.stat(posixpath.basename(path), dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


def ancestor_problem(root: Path, path: str) -> str | None:
    """Why an existing ancestor of ``root/path`` makes it unsafe to reach (a symlink or a file)."""
    done = ""
    for part in path.split("/")[:-1]:
        done = posixpath.join(done, part)
        try:
            mode = os.stat(root / done, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(mode):
            return f"ancestor {done!r} is a symlink"
        if not stat.S_ISDIR(mode):
            return f"ancestor {done!r} is not a directory"
    return None


def _fold(name: str) -> str:
    return unicodedata.normalize("NFC", name).translate(_LOOKALIKES)


def _collision(dir_rel: str, part: str, names: frozenset[str]) -> str | None:
    nfc = unicodedata.normalize("NFC", part)
    folded = _fold(part)
    for name in sorted(names):
        shown = posixpath.join(dir_rel, name)
        if unicodedata.normalize("NFC", name) == nfc:
            return f"Unicode-normalization twin of existing {shown!r}"
        if _fold(name) == folded:
            return f"lookalike of existing {shown!r} (typographic quote, space or dash)"
    return None


@attrs.define(eq=False)
class SiblingCheck:
    """Refuses new names that collide with an existing sibling under a workspace root.

    Remembers each directory listing it reads, so checking a few hundred paths lists each
    directory once. Not shared between threads.
    """

    root: Path
    _names: dict[str, frozenset[str] | None] = attrs.field(init=False, factory=dict)

    def problem(self, path: str) -> str | None:
        """Why a component of ``path`` that does not exist yet would twin an existing name."""
        dir_rel = ""
        for part in path.split("/"):
            names = self._listing(dir_rel)
            if names is None:
                return None  # the directory does not exist: nothing to collide with
            if part not in names:
                return _collision(dir_rel, part, names)
            dir_rel = posixpath.join(dir_rel, part)
        return None

    def _listing(self, dir_rel: str) -> frozenset[str] | None:
        if dir_rel not in self._names:
            try:
                fd = open_dir(self.root, dir_rel)
            except OSError:
                self._names[dir_rel] = None
            else:
                try:
                    self._names[dir_rel] = frozenset(os.listdir(fd))
                finally:
                    os.close(fd)
        return self._names[dir_rel]


def twins_within(paths: list[str]) -> dict[str, str]:
    """Paths of one change set that are the same name under Unicode normalization: path → reason."""
    by_form: dict[str, list[str]] = {}
    for path in paths:
        by_form.setdefault(unicodedata.normalize("NFC", path), []).append(path)
    return {
        path: f"Unicode-normalization twin of changed path {other!r}"
        for group in by_form.values()
        if len(group) > 1
        for path in group
        for other in group
        if other != path
    }
