"""A node's read-only checkouts: a reader snapshot checked out once, then linked for each reader.

Every reading child on a node gets a read-only checkout of the same snapshot when a batch of
them is spawned together (``orchestrator.core._shipping`` ships one bundle to all of them).
Checked out by Git for each child, that was six processes a child (64 scouts over four nodes:
384); written from a copy in memory, it was each file's bytes once a child (a 16 MB workspace:
a gigabyte for 64 scouts, most of their node hosts' time). A node process instead checks a
snapshot out once, into a store of its own beside its children's node directories (a 0700
``fleet-trees-PID-*`` directory in the node's root of them, hidden from every sandboxed child as
the whole root is), makes the files read-only there (0400/0500), and gives each reader a
checkout of its own directories and links whose files are hard links to the stored ones: no
file's bytes are copied, and a sandboxed reader's checkout is bound read-only into its view. A
file that cannot be linked (another file system) is copied from the store (``O_EXCL``, never
through a link).

A tree is keyed by its Git tree id, which the supervisor sends with the bundle: each batch's
bundle is a new snapshot commit, so a later batch of an unchanged workspace (a parent scouting
again before it edits) is checked out from the store with no Git process at all. The one
checkout of a tree is checked against its id (a bundle that holds another tree fails its
launch); without an id, the key is the bundle's SHA-256. At most :data:`KEPT` trees, each at
most :data:`MAX_TREE_BYTES`, are kept; an older tree's store is removed (the readers still
running keep their links to its files). A larger tree is not kept, and its children are checked
out by Git one by one. A store left by a node process that died is removed by the next one that
makes its own in that root.

Paths come from a Git tree (no ``..``, no absolute path, no ``.git``; Git refuses those), and
the snapshot is the supervisor's, not a child's: the store holds nothing a child wrote. An
unsandboxed child could change a stored file (it runs as the node's user, who owns them), as it
could change anything else of that user's on the node; a sandboxed one sees neither the store
nor a writable link to it.
"""

import collections
import contextlib
import hashlib
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from typing import Final

import attrs
import psutil

from orchestrator._trees import remove_tree
from orchestrator.launch._nodeplan import node_root

__all__ = ["KEPT", "MAX_TREE_BYTES", "STORE_PREFIX", "ReadTrees"]

#: The largest tree kept (the sum of its files' sizes).
MAX_TREE_BYTES: Final = 64 * 1024 * 1024
#: How many trees a node process keeps (the newest).
KEPT: Final = 2
#: A node process's store of trees: ``fleet-trees-PID-<random>`` in its root.
STORE_PREFIX: Final = "fleet-trees-"
_STORE_NAME = re.compile(rf"{re.escape(STORE_PREFIX)}(\d+)-\w+")


@attrs.frozen
class _Entry:
    path: str
    #: ``"file"`` (``executable``: its x bit), ``"link"`` (``target``) or ``"dir"``.
    kind: str
    target: str = ""
    executable: bool = False


@attrs.frozen
class _Tree:
    #: The directory holding the tree's files, read-only.
    store: str
    entries: list[_Entry]


class _TooLarge(Exception):
    pass


def _seal(root: str) -> list[_Entry]:
    """Every directory, file and link under *root* (its own paths are relative), each file
    made read-only (0400, or 0500 when executable) where it is."""
    entries, total = [], 0
    for top, dirs, files in os.walk(root):
        for name in sorted(dirs):
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                entries.append(_Entry(rel, "link", os.readlink(path)))
            else:
                entries.append(_Entry(rel, "dir"))
        for name in sorted(files):
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                entries.append(_Entry(rel, "link", os.readlink(path)))
                continue
            total += info.st_size
            if total > MAX_TREE_BYTES:
                raise _TooLarge
            executable = bool(info.st_mode & 0o100)
            os.chmod(path, 0o500 if executable else 0o400)
            entries.append(_Entry(rel, "file", executable=executable))
    return entries


def _write(tree: _Tree, work_tree: str) -> None:
    """Check *tree* out at *work_tree* (made here or empty): its files linked to the store's
    (copied where they cannot be); directories stay writable so the session's clean-up can
    remove them."""
    os.makedirs(work_tree, mode=0o700, exist_ok=True)
    for entry in tree.entries:
        path = os.path.join(work_tree, entry.path)
        if entry.kind == "dir":
            os.mkdir(path, 0o700)
        elif entry.kind == "link":
            os.symlink(entry.target, path)
        else:
            stored = os.path.join(tree.store, entry.path)
            try:
                os.link(stored, path, follow_symlinks=False)
            except OSError as exc:  # another file system (or too many links): a copy
                if isinstance(exc, FileExistsError):
                    raise
                _copy(stored, path, 0o500 if entry.executable else 0o400)


def _copy(source: str, path: str, mode: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(source, "rb") as read, os.fdopen(os.open(path, flags, mode), "wb") as out:
        shutil.copyfileobj(read, out)


@attrs.define(eq=False)
class ReadTrees:
    """The trees one node process keeps (see the module docstring). *root*: where its store
    is made (the node's root of node directories when not given)."""

    root: str = ""
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _making: dict[str, threading.Lock] = attrs.field(factory=dict, init=False)
    _trees: "collections.OrderedDict[str, _Tree | None]" = attrs.field(
        factory=collections.OrderedDict, init=False
    )
    _home: str = attrs.field(default="", init=False)
    #: Per store: the checkouts being written from it now; a store dropped meanwhile is
    #: removed by the last of them.
    _users: dict[str, int] = attrs.field(factory=dict, init=False)
    _dropped: set[str] = attrs.field(factory=set, init=False)

    def check_out(
        self,
        bundle: bytes | Callable[[], bytes],
        work_tree: str,
        extract: Callable[[bytes, str], str],
        tree: str = "",
    ) -> bool:
        """Check the snapshot in *bundle* (of Git tree *tree*, when known) out at *work_tree*;
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
                kept = self._trees.get(digest)
                if known:
                    self._trees.move_to_end(digest)
            if not known:
                kept = self._extract(bundle, extract, tree, digest)
                idle = []  # dropped stores no checkout is written from now
                with self._lock:
                    self._trees[digest] = kept
                    while len(self._trees) > KEPT:
                        old_key, old = self._trees.popitem(last=False)
                        self._making.pop(old_key, None)
                        if old is not None and old.store in self._users:
                            self._dropped.add(old.store)
                        elif old is not None:
                            idle.append(old.store)
                for store in idle:
                    remove_tree(store)
            if kept is None:
                return False
            with self._lock:
                self._users[kept.store] = self._users.get(kept.store, 0) + 1
        try:
            _write(kept, work_tree)
        finally:
            self._release(kept.store)
        return True

    def _release(self, store: str) -> None:
        """A checkout from *store* is written; the store goes if it was dropped meanwhile."""
        with self._lock:
            self._users[store] -= 1
            gone = not self._users[store] and store in self._dropped
            if not self._users[store]:
                del self._users[store]
            if gone:
                self._dropped.discard(store)
        if gone:
            remove_tree(store)

    def close(self) -> None:
        """Remove the store (the node process is ending)."""
        with self._lock:
            self._trees.clear()
            home, self._home = self._home, ""
        if home:
            remove_tree(home)

    def _store(self) -> str:
        """This process's store, made on first use (and a dead process's left in its root
        removed then)."""
        with self._lock:
            if not self._home:
                root = self.root or node_root()
                _sweep(root)
                self._home = tempfile.mkdtemp(prefix=f"{STORE_PREFIX}{os.getpid()}-", dir=root)
            return self._home

    def _extract(
        self,
        bundle: bytes | Callable[[], bytes],
        extract: Callable[[bytes, str], str],
        tree: str,
        key: str,
    ) -> _Tree | None:
        data = bundle() if callable(bundle) else bundle
        home = self._store()
        scratch = tempfile.mkdtemp(prefix="making-", dir=home)
        try:
            work_tree = os.path.join(scratch, "tree")
            got = extract(data, work_tree)
            if tree and got != tree:
                raise ValueError(f"the snapshot bundle holds tree {got}, not {tree}")
            entries = _seal(work_tree)
            store = os.path.join(home, key)
            os.rename(work_tree, store)
            return _Tree(store, entries)
        except _TooLarge:
            return None
        finally:
            remove_tree(scratch)


def _sweep(root: str) -> None:
    """Remove the stores in *root* of node processes of this user that are gone."""
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            found = _STORE_NAME.fullmatch(name)
            if found is None or psutil.pid_exists(int(found.group(1))):
                continue
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):  # gone meanwhile: another node process swept it
                info = os.lstat(path)
                if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
                    remove_tree(path)
