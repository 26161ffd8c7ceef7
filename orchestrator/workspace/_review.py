"""Pre-images of the files a copy-back changed: review (diff), accept or revert them.

The store keeps, per absolute path, the file's state before the first copy-back that touched it
(its *baseline*: bytes and mode, or "did not exist") and the owner that changed it. Later
copy-backs of the same path keep the first baseline, so a diff is cumulative. Nothing here reads
or writes Git: revert puts files back on disk and never touches the index or a commit.

On disk, under ``root`` (mode 0700): ``entries/<key>.json`` says whose change it is and what
existed, ``blobs/<key>`` holds the pre-image bytes (a symlink's target), both 0600 and written by
atomic rename, with ``key`` the SHA-256 of the path. Every operation holds an ``flock`` on
``root/.lock``, so threads and processes sharing the directory see whole records, and the store
survives a supervisor restart.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import json
import os
import re
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from orchestrator.workspace._changes import ChangeStatus, Conflict
from orchestrator.workspace._pathguard import open_dir

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LINES = re.compile(rb"[^\n]*\n|[^\n]+")
_BINARY_SNIFF = 8000  # Git's heuristic: a NUL in the first 8000 bytes means binary


@attrs.frozen(kw_only=True)
class FileDiff:
    """One file's difference from its baseline; ``diff`` is a unified diff (or a binary note)."""

    path: str
    owner: str
    status: ChangeStatus
    diff: str


@attrs.frozen(kw_only=True)
class RevertResult:
    """Paths put back to their baseline, and those that could not be (with the reason)."""

    reverted: tuple[str, ...]
    failed: tuple[Conflict, ...]


@attrs.frozen(kw_only=True)
class _State:
    """A file as the store compares it: ``data`` is ``None`` when it does not exist."""

    data: bytes | None
    mode: int | None


@attrs.frozen(kw_only=True)
class _Entry:
    key: str
    path: str
    owner: str
    baseline: _State


def _read_state(path: Path) -> _State:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return _State(data=None, mode=None)
    if stat.S_ISLNK(st.st_mode):
        return _State(data=os.fsencode(os.readlink(path)), mode=st.st_mode)
    if stat.S_ISREG(st.st_mode):
        return _State(data=path.read_bytes(), mode=st.st_mode)
    return _State(data=b"", mode=st.st_mode)


def _status(base: _State, now: _State) -> ChangeStatus:
    if base.data is None:
        return "added"
    if now.data is None:
        return "deleted"
    if stat.S_IFMT(base.mode or 0) != stat.S_IFMT(now.mode or 0):
        return "type"
    return "mode" if base.data == now.data else "modified"


def _text(data: bytes) -> list[str] | None:
    """``data`` split into lines (split on LF only, ends kept); ``None`` if it is binary."""
    if b"\0" in data[:_BINARY_SNIFF]:
        return None
    try:
        return [line.decode() for line in _LINES.findall(data)]
    except UnicodeDecodeError:
        return None


def _render(path: str, base: _State, now: _State, context: int) -> str:
    """A Git-style unified diff from ``base`` to ``now``; ``/dev/null`` for a missing side."""
    old_name = path if base.data is not None else "/dev/null"
    new_name = path if now.data is not None else "/dev/null"
    head = ""
    if base.mode is not None and now.mode is not None and base.mode != now.mode:
        head = f"old mode {base.mode:o}\nnew mode {now.mode:o}\n"
    if base.data == now.data:
        return head
    old = _text(base.data or b"")
    new = _text(now.data or b"")
    if old is None or new is None:
        return f"{head}Binary files {old_name} and {new_name} differ\n"
    lines = difflib.unified_diff(old, new, old_name, new_name, n=context)
    body = "".join(
        line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n" for line in lines
    )
    return head + body


def _write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically with a 0600 file holding ``data``."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temp, _NEW_FLAGS, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    temp.replace(path)


def _remove_emptied(directory: Path) -> None:
    """Remove ``directory`` and its ancestors while they are empty, as copy-back does."""
    while directory != directory.parent:
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent


def _restore(path: str, base: _State) -> None:
    """Put ``base`` at ``path`` by atomic rename, never following a symlink on the way."""
    parent = Path(path).parent
    fd = open_dir(Path("/"), str(parent.relative_to("/")), created=[])
    name = Path(path).name
    try:
        if base.data is None:
            os.unlink(name, dir_fd=fd)
            _remove_emptied(parent)
            return
        temp = f".fleet-revert-{secrets.token_hex(8)}"
        if stat.S_ISLNK(base.mode or 0):
            os.symlink(os.fsdecode(base.data), temp, dir_fd=fd)
        else:
            out = os.open(temp, _NEW_FLAGS, 0o600, dir_fd=fd)
            try:
                view = memoryview(base.data)
                while view:
                    view = view[os.write(out, view) :]
                os.fchmod(out, stat.S_IMODE(base.mode or 0o644))
                os.fsync(out)
            finally:
                os.close(out)
        try:
            os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError:
            os.unlink(temp, dir_fd=fd)
            raise
    finally:
        os.close(fd)


@attrs.define(eq=False)
class ReviewStore:
    """The persistent pre-image store of one session (see the module doc). Thread-safe."""

    root: Path

    def __attrs_post_init__(self) -> None:
        for sub in (self.root, self.root / "entries", self.root / "blobs"):
            sub.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def record(self, owner: str, path: Path, preimage: bytes | None, mode: int | None) -> None:
        """Remember ``path``'s state before ``owner`` changed it, unless a baseline exists.

        ``preimage`` is the file's bytes (a symlink's target) or ``None`` if it did not exist;
        ``mode`` its ``st_mode``. ``path`` is made absolute and its directory resolved.
        """
        path = Path(os.path.realpath(path.parent)) / path.name
        key = hashlib.sha256(os.fsencode(path)).hexdigest()
        entry = self.root / "entries" / f"{key}.json"
        with self._locked():
            if entry.exists():
                return
            if preimage is not None:
                _write_private(self.root / "blobs" / key, preimage)
            meta = {"path": str(path), "owner": owner, "exists": preimage is not None}
            _write_private(entry, json.dumps(meta | {"mode": mode}).encode())

    def _entries(self, selector: Sequence[str]) -> list[_Entry]:
        entries = []
        for file in (self.root / "entries").glob("*.json"):
            meta = json.loads(file.read_bytes())
            path, owner = meta["path"], meta["owner"]
            if selector and not any(
                s in {owner, path} or path.startswith(s.rstrip("/") + "/") for s in selector
            ):
                continue
            data = (self.root / "blobs" / file.stem).read_bytes() if meta["exists"] else None
            baseline = _State(data=data, mode=meta["mode"])
            entries.append(_Entry(key=file.stem, path=path, owner=owner, baseline=baseline))
        return sorted(entries, key=lambda e: e.path)

    def _forget(self, entry: _Entry) -> None:
        (self.root / "entries" / f"{entry.key}.json").unlink()
        (self.root / "blobs" / entry.key).unlink(missing_ok=True)

    def diff(self, selector: Sequence[str] = (), context: int = 3) -> list[FileDiff]:
        """Files that differ from their baseline, for the owners or paths in ``selector``.

        An empty selector means all; a path selects the file or everything below a directory.
        Files back at their baseline drop out. ``context`` lines surround each change; a large
        number shows the whole file.
        """
        with self._locked():
            entries = self._entries(selector)
        diffs = []
        for entry in entries:
            now = _read_state(Path(entry.path))
            if now == entry.baseline:
                continue
            diffs.append(
                FileDiff(
                    path=entry.path,
                    owner=entry.owner,
                    status=_status(entry.baseline, now),
                    diff=_render(entry.path, entry.baseline, now, context),
                )
            )
        return diffs

    def accept(self, selector: Sequence[str] = ()) -> list[str]:
        """Forget the baselines of the selected files (keeping them as they are); their paths."""
        with self._locked():
            entries = self._entries(selector)
            for entry in entries:
                self._forget(entry)
        return [entry.path for entry in entries]

    def revert(self, selector: Sequence[str] = ()) -> RevertResult:
        """Put the selected files back to their baseline; a file the child created is deleted.

        Each file is replaced atomically; one that cannot be (its directory became a symlink,
        a directory now stands at its path, permissions) is reported and keeps its baseline.
        """
        reverted: list[str] = []
        failed: list[Conflict] = []
        with self._locked():
            for entry in self._entries(selector):
                try:
                    if _read_state(Path(entry.path)) != entry.baseline:
                        _restore(entry.path, entry.baseline)
                except OSError as exc:
                    reason = f"cannot restore it ({exc.strerror or exc}); put it back by hand"
                    failed.append(Conflict(path=entry.path, reason=reason))
                    continue
                self._forget(entry)
                reverted.append(entry.path)
        return RevertResult(reverted=tuple(reverted), failed=tuple(failed))
