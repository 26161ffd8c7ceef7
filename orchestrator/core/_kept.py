"""A child's full report and a bounded copy of its transcript, kept until it is discarded.

``wait`` hands the parent a clipped report; ``fleet report aN`` (and the MCP ``report`` tool)
pages the whole of it, and of the transcript its backend wrote (the builtin agent's
``transcript.json``, Pi's session file, Claude Code's or Codex's newest session log). Both are
copied out of the child's scratch before the scratch is deleted at stop, into the session's
state directory (0700, files 0600, out of every child's sandbox view): a child that ended can be
read until ``fleet discard``. Reading from a scratch the child could write never follows a
link, and takes at most :data:`TRANSCRIPT_LIMIT` bytes (the newest).
"""

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Final

import attrs

import ipc
from orchestrator._errors import NotFound, UsageError

log = logging.getLogger("orchestrator")

__all__ = ["Kept"]

TRANSCRIPT_LIMIT: Final = 4 * 1024 * 1024
REPORT_LIMIT: Final = 1024 * 1024
PAGE: Final = 16_000
_NAMED: Final = ("transcript.json", "pi-session.jsonl")
_WALK_LIMIT: Final = 2000  # directory entries a transcript search looks at


@attrs.define(eq=False)
class Kept:
    """The session's kept reports and transcripts, one directory per child key."""

    root: Path

    def _dir(self, key: str) -> Path:
        if not key.startswith("a") or not key[1:].isdigit():
            raise UsageError(f"report: {key!r} is not a child key")
        return self.root / key

    def keep_report(self, key: str, text: str) -> None:
        """Write *key*'s latest full report (blocking)."""
        self._write(key, "report.md", text.encode("utf-8", "replace")[-REPORT_LIMIT:])

    def keep_transcript(self, key: str, scratch: Path) -> None:
        """Copy the newest transcript out of *scratch* (blocking; nothing found: nothing kept)."""
        data = read_transcript(scratch)
        if data is not None:
            self._write(key, "transcript", data)

    def forget(self, key: str) -> None:
        shutil.rmtree(self._dir(key), ignore_errors=True)

    def page(
        self, key: str, part: str, offset: int, *, live: str | None = None, scratch: Path | None
    ) -> dict[str, Any]:
        """One page of *part* (``report`` or ``transcript``) from character *offset*. *live* is
        the report a running child's record holds; *scratch* its scratch, read while it lives."""
        if part == "report":
            text = live if live is not None else self._read(key, "report.md")
        elif part == "transcript":
            data = read_transcript(scratch) if scratch is not None else None
            text = data.decode("utf-8", "replace") if data else self._read(key, "transcript")
        else:
            raise UsageError(f"report: part {part!r} is not report or transcript")
        if text is None:
            raise NotFound(f"report: {key} has no {part} kept (it never settled, or was discarded)")
        if offset < 0 or (offset and offset >= len(text)):
            raise UsageError(f"report: offset {offset} is past the end ({len(text)} characters)")
        end = min(len(text), offset + PAGE)
        return {
            "key": key,
            "part": part,
            "offset": offset,
            "text": text[offset:end],
            "next_offset": end if end < len(text) else None,
            "total": len(text),
        }

    def _write(self, key: str, name: str, data: bytes) -> None:
        """Keep *data* as *key*'s *name*. A copy that cannot be written (a full disk) is left
        out, said once in the log: it never fails the stop or settle that keeps it."""
        folder = self._dir(key)
        tmp = folder / f".{name}.tmp"
        try:
            ipc.ensure_private_dir(self.root)
            ipc.ensure_private_dir(folder)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            tmp.replace(folder / name)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            log.warning("report: %s's %s is not kept: %s", key, name, exc.strerror or exc)

    def _read(self, key: str, name: str) -> str | None:
        data = _read_file(self._dir(key) / name, TRANSCRIPT_LIMIT)
        return None if data is None else data.decode("utf-8", "replace")


def read_transcript(scratch: Path) -> bytes | None:
    """The newest transcript in a child's *scratch*, its last :data:`TRANSCRIPT_LIMIT` bytes."""
    for name in _NAMED:
        data = _read_file(scratch / name, TRANSCRIPT_LIMIT, inside=scratch)
        if data is not None:
            return data
    newest: tuple[float, Path] | None = None
    seen = 0
    for folder, dirs, files in os.walk(scratch, followlinks=False):
        seen += len(dirs) + len(files)
        if seen > _WALK_LIMIT:
            break
        for name in files:
            if name.endswith(".jsonl"):
                path = Path(folder) / name
                try:
                    mtime = path.lstat().st_mtime
                except OSError:
                    continue
                if newest is None or mtime > newest[0]:
                    newest = (mtime, path)
    return None if newest is None else _read_file(newest[1], TRANSCRIPT_LIMIT, inside=scratch)


def _read_file(path: Path, limit: int, *, inside: Path | None = None) -> bytes | None:
    """The last *limit* bytes of a regular file, never through a link; with *inside*, only
    a file that really is under that directory (a child may swap a folder for a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000:
            return None
        if inside is not None and not _under(fd, inside):
            return None
        if st.st_size > limit:
            os.lseek(fd, st.st_size - limit, os.SEEK_SET)
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _under(fd: int, folder: Path) -> bool:
    """Whether the open file *fd* lies under *folder* (Linux: by its /proc link; elsewhere by
    the real path of *folder*, which the sandbox keeps the child from replacing)."""
    try:
        where = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return True
    return where.startswith(os.path.realpath(folder) + os.sep)
