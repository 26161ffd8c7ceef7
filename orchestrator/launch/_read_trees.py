"""A node's read-only checkouts: a reader snapshot checked out once, then written from memory.

Every reading child on a node gets a read-only checkout of the same snapshot when a batch of
them is spawned together (``orchestrator.core._shipping`` ships one bundle to all of them).
Checked out by Git for each child, that was six processes a child (64 scouts over four nodes:
384). A node process instead checks a snapshot out once, in a private temporary directory that
it removes at once, keeps the tree in memory (each file's path, mode and bytes; each link's
target), and writes each child's checkout from it: new directories, new 0400/0500 files
(``O_EXCL``, never through a link), links as links. A tree is keyed by its Git tree id, which
the supervisor sends with the bundle: each batch's bundle is a new snapshot commit, so a later
batch of an unchanged workspace (a parent scouting again before it edits) is written from the
tree kept here, with no Git process at all. The one checkout of a tree is checked against its
id (a bundle that holds another tree fails its launch); without an id, the key is the bundle's
SHA-256. At most :data:`KEPT` trees, each at most :data:`MAX_TREE_BYTES`, are kept. A larger
tree is not kept, and its children are checked out by Git one by one, as before.

Paths come from a Git tree (no ``..``, no absolute path, no ``.git``; Git refuses those), and
the snapshot is the supervisor's, not a child's: the cache holds nothing a child wrote.
"""

import collections
import hashlib
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from typing import Final

import attrs

__all__ = ["KEPT", "MAX_TREE_BYTES", "ReadTrees"]

#: The largest tree kept in memory (the sum of its files' sizes).
MAX_TREE_BYTES: Final = 64 * 1024 * 1024
#: How many trees a node process keeps (the newest).
KEPT: Final = 2


@attrs.frozen
class _Entry:
    path: str
    #: ``"file"`` (``data`` its bytes, ``executable`` its x bit), ``"link"`` (``data`` its
    #: target) or ``"dir"``.
    kind: str
    data: bytes = b""
    executable: bool = False


class _TooLarge(Exception):
    pass


def _read(root: str) -> list[_Entry]:
    """Every directory, file and link under *root* (its own paths are relative)."""
    entries, total = [], 0
    for top, dirs, files in os.walk(root):
        for name in sorted(dirs):
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                entries.append(_Entry(rel, "link", os.fsencode(os.readlink(path))))
            else:
                entries.append(_Entry(rel, "dir"))
        for name in sorted(files):
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                entries.append(_Entry(rel, "link", os.fsencode(os.readlink(path))))
                continue
            total += info.st_size
            if total > MAX_TREE_BYTES:
                raise _TooLarge
            with open(path, "rb") as handle:
                data = handle.read()
            entries.append(_Entry(rel, "file", data, bool(info.st_mode & 0o100)))
    return entries


def _write(entries: list[_Entry], work_tree: str) -> None:
    """Write *entries* under *work_tree* (made here or empty): files read-only, as a reader's
    checkout is; directories stay writable so the session's clean-up can remove them."""
    os.makedirs(work_tree, mode=0o700, exist_ok=True)
    for entry in entries:
        path = os.path.join(work_tree, entry.path)
        if entry.kind == "dir":
            os.mkdir(path, 0o700)
        elif entry.kind == "link":
            os.symlink(os.fsdecode(entry.data), path)
        else:
            mode = 0o500 if entry.executable else 0o400
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(path, flags, mode)
            with os.fdopen(fd, "wb") as handle:
                handle.write(entry.data)


@attrs.define(eq=False)
class ReadTrees:
    """The trees one node process keeps (see the module docstring)."""

    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _making: dict[str, threading.Lock] = attrs.field(factory=dict, init=False)
    _trees: "collections.OrderedDict[str, list[_Entry] | None]" = attrs.field(
        factory=collections.OrderedDict, init=False
    )

    def check_out(
        self,
        bundle: bytes | Callable[[], bytes],
        work_tree: str,
        extract: Callable[[bytes, str], str],
        tree: str = "",
    ) -> bool:
        """Write the snapshot in *bundle* (of Git tree *tree*, when known) at *work_tree*;
        ``extract(bundle, directory)`` checks it out at an empty *directory* the first time and
        says which tree it checked out. *bundle* may be a call that gives its bytes, made only
        when they are needed (a kept tree needs none). False: the tree is too large to keep,
        and nothing was written (the caller checks it out itself). ValueError: *bundle* holds
        another tree."""
        digest = tree
        if not digest:  # keyed by the bundle itself
            bundle = bundle() if callable(bundle) else bundle
            digest = hashlib.sha256(bundle).hexdigest()
        with self._lock:
            making = self._making.setdefault(digest, threading.Lock())
        with making:  # one extraction a snapshot; the others wait for it
            with self._lock:
                known = digest in self._trees
                entries = self._trees.get(digest)
                if known:
                    self._trees.move_to_end(digest)
            if not known:
                entries = self._extract(bundle, extract, tree)
                with self._lock:
                    self._trees[digest] = entries
                    while len(self._trees) > KEPT:
                        old, _ = self._trees.popitem(last=False)
                        self._making.pop(old, None)
        if entries is None:
            return False
        _write(entries, work_tree)
        return True

    @staticmethod
    def _extract(
        bundle: bytes | Callable[[], bytes], extract: Callable[[bytes, str], str], tree: str
    ) -> list[_Entry] | None:
        data = bundle() if callable(bundle) else bundle
        scratch = tempfile.mkdtemp(prefix="fleet-node-tree-")
        try:
            work_tree = os.path.join(scratch, "tree")
            got = extract(data, work_tree)
            if tree and got != tree:
                raise ValueError(f"the snapshot bundle holds tree {got}, not {tree}")
            return _read(work_tree)
        except _TooLarge:
            return None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
