"""Bounded, redacted diagnostics for child runs (DESIGN.md §4).

:class:`RunLog` is one run's log, ``<state>/sessions/<session>/logs/<owner>.log``: the
supervisor's own timestamped lines always; the child's stdout/stderr only when output recording
is on, or once the run has failed (its recent-output tail is flushed into the file then). The
file lives in a 0700 directory, is 0600, never follows a symlink, and never grows past its cap:
the oldest content is dropped and a ``[… N bytes dropped …]`` line says so. Every secret of the
supervisor's :class:`~orchestrator.governance._redaction.SecretSet` is replaced by
``[redacted]`` before anything reaches the tail, the file or a report, including a secret split
across output chunks. Nothing here reads the environment, so no environment or credential can be
captured.

:class:`RejectLog` is the opt-in JSONL record of refused requests, redacted and capped the same
way. Both write synchronously: lines are small and the cap bounds the work of one call.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import secrets as secrets_module
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

import attrs

from orchestrator.governance._redaction import Redactor, SecretSet, as_secret_set

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

FailureKind = Literal[
    "handshake-timeout",
    "exited",
    "killed",
    "idle",
    "max-total",
    "protocol",
    "launch",
    # A checked child's result still failed its JSON Schema after one correction (_checked):
    "invalid-result",
    # cmux surfaces classify their own launch failures (orchestrator.launch._cmux):
    "binary-missing",
    "socket-unreachable",
    "auth-rejected",
    "surface-creation-failed",
]
RejectKind = Literal[
    "policy",
    "lock-conflict",
    "dropped-frame",
    "egress",
    "control-refused",
    "hello-refused",
    "usage",
]

DEFAULT_CAP = 1 << 20
DEFAULT_TAIL_CAP = 8192
_MIN_CAP = 1024
# Compaction starts the kept part at a line boundary when one is this close.
_LINE_SLACK = 16384
_MAX_RECORD_ARGS = 8192
# A full filesystem: out of blocks or inodes, or over quota.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class LogPathError(Exception):
    """A log path is unsafe to write (a symlink, not ours, not a regular file or directory)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"open diagnostics log {path}: {reason}; remove it or choose another")
        self.path = path
        self.reason = reason


def _ensure_private_dir(path: Path) -> None:
    with contextlib.suppress(FileExistsError):  # whatever is there is checked below
        path.mkdir(mode=0o700, parents=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise LogPathError(path, "the directory is a symlink or not a directory")
    if info.st_uid != os.geteuid():
        raise LogPathError(path, f"the directory belongs to uid {info.st_uid}")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)  # ours, so tighten it rather than refuse


def _open_private(path: Path, flags: int) -> int:
    """Open (creating if asked) a 0600 regular file of ours, never through a symlink."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in {errno.ELOOP, errno.EISDIR}:
            raise LogPathError(path, "it is a symlink or a directory") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1:
        os.close(fd)
        raise LogPathError(path, "it is not a regular, singly linked file of ours")
    if stat.S_IMODE(info.st_mode) != 0o600:
        os.fchmod(fd, 0o600)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _utc_stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class _CappedFile:
    """An append-only private file that never exceeds ``cap`` bytes; the oldest content goes.

    Compaction keeps the newest half, so a flood rewrites the file once per ``cap / 2`` bytes
    rather than on every append. The rewrite is a fresh 0600 file put in place atomically.
    """

    def __init__(self, path: Path, cap: int, marker: Callable[[int], bytes]) -> None:
        if cap < _MIN_CAP:
            raise ValueError(f"log cap {cap} is below {_MIN_CAP} bytes; raise it")
        _ensure_private_dir(path.parent)
        os.close(_open_private(path, os.O_WRONLY | os.O_CREAT))
        self.path = path
        self._cap = cap
        self._marker = marker
        self._dropped = 0
        self._marker_size = 0  # our marker at the head of the file, if we compacted it
        #: Bytes a full disk kept out of the file (said in the file once space returns).
        self.unwritten = 0

    def append(self, data: bytes) -> None:
        """Append *data*; on a full disk it is counted, not raised (the run goes on)."""
        try:
            if self.unwritten:
                note = f"[… {self.unwritten} bytes not written: the disk was full …]\n"
                self._append(note.encode())
                self.unwritten = 0
            self._append(data)
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                raise
            self.unwritten += len(data)

    def _append(self, data: bytes) -> None:
        fd = _open_private(self.path, os.O_RDWR | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            if size + len(data) <= self._cap:
                _write_all(fd, data)
                return
            content = os.pread(fd, size, 0)[self._marker_size :] + data
        finally:
            os.close(fd)
        budget = self._cap // 2 - len(self._marker(self._dropped + len(content)))
        cut = max(1, len(content) - budget)
        newline = content.find(b"\n", cut - 1, cut + _LINE_SLACK)
        if 0 <= newline < len(content) - 1:
            cut = newline + 1  # start the kept part on a line of its own
        self._dropped += cut
        marker = self._marker(self._dropped)
        self._replace(marker + content[cut:])
        self._marker_size = len(marker)

    def _replace(self, data: bytes) -> None:
        temporary = self.path.with_name(f".{self.path.name}.{secrets_module.token_hex(4)}")
        fd = _open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.replace(temporary, self.path)
        except OSError:
            temporary.unlink(missing_ok=True)
            raise
        directory = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


@attrs.frozen(kw_only=True)
class FailureReport:
    """A classified failure: how the child ran, where its log is, what broke, its last output.

    ``already_reported`` is False exactly once per run — on the report the first
    :meth:`RunLog.fail` returns — so the parent is shown a failure once however many paths
    (watchdog, exit, disconnect) classify it.
    """

    kind: str
    transport: str
    log_path: Path
    error: str
    tail: str
    already_reported: bool = False

    def as_json(self) -> dict[str, str]:
        """The ``failure`` field of a record, ``peek`` and the handoff."""
        return {
            "kind": self.kind,
            "transport": self.transport,
            "log": str(self.log_path),
            "error": self.error,
            "tail": self.tail,
        }


@attrs.define(eq=False)
class RunLog:
    """One run's diagnostics log and recent-output tail; see the module docstring."""

    path: Path
    secrets: SecretSet = attrs.field(kw_only=True, repr=False, converter=as_secret_set)
    transport: str = attrs.field(kw_only=True)
    record_output: bool = attrs.field(default=False, kw_only=True)
    cap: int = attrs.field(default=DEFAULT_CAP, kw_only=True)
    tail_cap: int = attrs.field(default=DEFAULT_TAIL_CAP, kw_only=True)
    _scrubber: Redactor = attrs.field(init=False, repr=False)
    _file: _CappedFile = attrs.field(init=False, repr=False)
    _redactors: dict[str, Redactor] = attrs.field(factory=dict, init=False, repr=False)
    _tail: bytearray = attrs.field(factory=bytearray, init=False, repr=False)
    _report: FailureReport | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._scrubber = Redactor(self.secrets)
        self._file = _CappedFile(self.path, self.cap, _dropped_line)

    @property
    def tail(self) -> str:
        """The newest ``tail_cap`` bytes of redacted child output, decoded leniently.

        It includes output still held back in case it begins a secret, up to where it could.
        """
        pending = b"".join(redactor.preview() for redactor in self._redactors.values())
        # Scrubbed again: a secret the set learnt after this output arrived is hidden too.
        data = self.secrets.scrub_bytes(bytes(self._tail) + pending)[-self.tail_cap :]
        start = 0
        while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:
            start += 1  # skip a UTF-8 sequence the cap cut in half
        return data[start:].decode("utf-8", errors="replace")

    def write(self, line: str) -> None:
        """Append one timestamped supervisor line (embedded newlines are escaped)."""
        text = line.replace("\r", "\\r").replace("\n", "\\n")
        self._file.append(self._scrubber.once(f"{_utc_stamp()} {text}\n".encode()))

    def output(self, stream: str, data: bytes) -> None:
        """Take a chunk of the child's ``stream``: into the tail, and the file when recording."""
        redactor = self._redactors.get(stream)
        if redactor is None:
            redactor = self._redactors[stream] = Redactor(self.secrets)
        self._keep(redactor.feed(data))

    def flush(self) -> None:
        """The output has ended: release held-back bytes to the tail (and file, if recording).

        :meth:`fail` does this itself; call it when a run ends well and records its output.
        """
        for redactor in self._redactors.values():
            self._keep(redactor.flush())

    def fail(self, kind: str, error: str) -> FailureReport:
        """Classify the run's failure; the first call wins and flushes the tail into the file.

        Later calls log what they saw and return the first report with ``already_reported``.
        """
        if kind not in get_args(FailureKind):
            raise ValueError(f"classify a failure as {kind!r}: use one of {get_args(FailureKind)}")
        if self._report is not None:
            self.write(f"also classified as {kind}: {error}")
            return attrs.evolve(self._report, already_reported=True)
        self.flush()
        redacted = self._scrubber.once(error.encode()).decode(errors="replace")
        self.write(f"failed ({kind}) over {self.transport}: {redacted}")
        if not self.record_output:
            output = self.secrets.scrub_bytes(bytes(self._tail)) or b"(no output)"
            self._file.append(
                b"--- recent output ---\n" + output.rstrip(b"\n") + b"\n--- end of output ---\n"
            )
        self._report = FailureReport(
            kind=kind, transport=self.transport, log_path=self.path, error=redacted, tail=self.tail
        )
        return self._report

    def _keep(self, data: bytes) -> None:
        if not data:
            return
        self._tail += data
        del self._tail[: max(0, len(self._tail) - self.tail_cap)]
        # A failed run's later output (the drain after a kill) is evidence: persist it too.
        if self.record_output or self._report is not None:
            self._file.append(data)


def _dropped_line(count: int) -> bytes:
    return f"[… {count} bytes dropped …]\n".encode()


def _dropped_record(count: int) -> bytes:
    return json.dumps({"kind": "dropped", "bytes": count}).encode() + b"\n"


@attrs.define(eq=False)
class RejectLog:
    """Opt-in JSONL log of refused requests: one redacted, size-bounded record per line."""

    path: Path
    secrets: SecretSet = attrs.field(kw_only=True, repr=False, converter=as_secret_set)
    cap: int = attrs.field(default=DEFAULT_CAP, kw_only=True)
    _redactor: Redactor = attrs.field(init=False, repr=False)
    _file: _CappedFile = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._redactor = Redactor(self.secrets)
        self._file = _CappedFile(self.path, self.cap, _dropped_record)

    def record(self, kind: RejectKind, owner: str, args: Mapping[str, Any]) -> None:
        """Append ``{"ts", "kind", "owner", "args"}``; args over 8 KiB become a clipped string."""
        scrubbed = self._scrub(args)
        text = json.dumps(scrubbed)
        if len(text) > _MAX_RECORD_ARGS:
            scrubbed = {"clipped": text[:_MAX_RECORD_ARGS], "bytes": len(text)}
        entry = {"ts": _utc_stamp(), "kind": kind, "owner": self._scrub(owner), "args": scrubbed}
        self._file.append(self._redactor.once(json.dumps(entry).encode()) + b"\n")

    def _scrub(self, value: object) -> Any:
        """Redact every string inside ``value``; anything not JSON-shaped becomes its repr."""
        if isinstance(value, str):
            raw = value.encode("utf-8", "surrogatepass")
            return self._redactor.once(raw).decode("utf-8", "surrogatepass")
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, Mapping):
            return {self._scrub(str(k)): self._scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._scrub(item) for item in value]
        return self._scrub(repr(value))
