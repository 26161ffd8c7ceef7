"""The discussion paper's file: one compact UTF-8 JSON sheet of entries, bounded and atomic.

A sheet (format ``fleet-paper/1``) names its incarnation (``paper``), the newest id ever given
(``last``) and its entries, oldest first. Entries hold at most ``MAX_TEXT`` chars, at most
``MAX_ENTRIES`` are kept and the file never exceeds ``MAX_FILE_BYTES``: :func:`pack_sheet`
evicts the oldest until it fits. :func:`read_sheet` reads anything this module could not have
written (bad JSON, coerced types, a symlink, a FIFO, an oversized file) as empty and corrupt;
:func:`write_atomic` replaces the file atomically, keeping a corrupt predecessor aside.
"""

import contextlib
import errno
import json
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Literal

import attrs
import cattrs

MAX_TEXT: Final = 1600
MAX_ENTRIES: Final = 64
MAX_FILE_BYTES: Final = 64 * 1024
_FORMAT: Final = "fleet-paper/1"
AGENT_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}")
ENTRY_ID: Final = re.compile(r"d[1-9][0-9]{0,9}")


def _entry_text(_: object, attribute: "attrs.Attribute[Any]", value: str) -> None:
    if (cause := text_fault(value)) is not None:
        raise ValueError(f"{attribute.name}: {cause}")


def _matching(pattern: re.Pattern[str]) -> Callable[[object, "attrs.Attribute[Any]", Any], None]:
    def validate(_: object, attribute: "attrs.Attribute[Any]", value: str | None) -> None:
        if value is not None and pattern.fullmatch(value) is None:
            raise ValueError(f"{attribute.name} {value!r} does not match {pattern.pattern}")

    return validate


def text_fault(text: str) -> str | None:
    if not text.strip():
        return "text is empty"
    if len(text) > MAX_TEXT:
        return f"text is {len(text)} chars, over the {MAX_TEXT}-char limit"
    try:
        text.encode()
    except UnicodeEncodeError:  # lone surrogates survive JSON decoding, not UTF-8 encoding
        return "text is not valid Unicode"
    return None


@attrs.frozen(kw_only=True)
class Entry:
    """One question or answer. An answer's ``to`` is the asker and ``question`` the question id."""

    id: str = attrs.field(validator=_matching(ENTRY_ID))
    kind: Literal["question", "answer"]
    author: str = attrs.field(validator=_matching(AGENT_NAME))
    to: str | None = attrs.field(validator=_matching(AGENT_NAME))
    question: str | None = attrs.field(validator=_matching(ENTRY_ID))
    text: str = attrs.field(validator=_entry_text)
    at: float

    def __attrs_post_init__(self) -> None:
        if (self.kind == "answer") != (self.question is not None):
            msg = f"{self.kind} {self.id} has question={self.question!r}"
            raise ValueError(msg)

    @property
    def number(self) -> int:
        return int(self.id[1:])

    def render(self) -> str:
        if self.kind == "answer":
            return f"{self.id} {self.author} answers {self.question}: {self.text}"
        return f"{self.id} {self.author} asks {self.to or 'everyone'}: {self.text}"


@attrs.frozen(kw_only=True)
class Sheet:
    """The whole file. ``paper`` names this incarnation of the file; ``last`` is the newest id."""

    format: str
    paper: str
    last: int
    entries: tuple[Entry, ...]

    def find(self, entry_id: str) -> Entry | None:
        return next((entry for entry in self.entries if entry.id == entry_id), None)


_EMPTY: Final = Sheet(format=_FORMAT, paper="", last=0, entries=())


def _exactly(*kinds: type[Any]) -> Callable[[Any, type[Any]], Any]:
    # cattrs would coerce 5 to "5" and "1.5" to 1.5; a file that needs coercion is not ours.
    def structure(value: Any, target: type[Any]) -> Any:
        if isinstance(value, bool) or not isinstance(value, kinds):
            msg = f"expected {target.__name__}, got {type(value).__name__}"
            raise TypeError(msg)
        return target(value)

    return structure


_converter = cattrs.Converter(forbid_extra_keys=True)
_converter.register_structure_hook(str, _exactly(str))
_converter.register_structure_hook(int, _exactly(int))
_converter.register_structure_hook(float, _exactly(int, float))


def _parse(data: bytes) -> Sheet | None:
    """The sheet in ``data``, or None when it is not a paper this module could have written."""
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict):
            return None
        sheet = _converter.structure(raw, Sheet)
    except (ValueError, TypeError, RecursionError, cattrs.errors.CattrsError):
        return None
    numbers = [entry.number for entry in sheet.entries]
    if (
        sheet.format != _FORMAT
        or not sheet.paper
        or len(numbers) > MAX_ENTRIES
        or numbers != sorted(set(numbers))
        or sheet.last < max(numbers, default=0)
    ):
        return None
    return sheet


def read_sheet(path: Path) -> tuple[Sheet, bool]:
    """The sheet at ``path`` and whether the file there is corrupt (missing is not corrupt).

    Raises ``OSError`` when the file exists but cannot be read: that is not corruption.
    """
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the supervisor.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return _EMPTY, False
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        return _EMPTY, True  # a symlink is never ours: we replace the path, we never link it
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _EMPTY, True
        with open(fd, "rb", closefd=False) as file:
            data = file.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    sheet = _parse(data) if len(data) <= MAX_FILE_BYTES else None
    return (_EMPTY, True) if sheet is None else (sheet, False)


def pack_sheet(sheet: Sheet) -> tuple[Sheet, bytes]:
    """``sheet`` with its oldest entries evicted until it fits, and its compact UTF-8 bytes."""
    # Entries are encoded one by one so eviction is arithmetic, not repeated whole-file dumps.
    bodies = [_dump(_converter.unstructure(entry)) for entry in sheet.entries]
    fields = _converter.unstructure(attrs.evolve(sheet, entries=()))
    del fields["entries"]
    head = _dump(fields)[:-1] + b',"entries":['
    start = max(0, len(bodies) - MAX_ENTRIES)
    size = len(head) + sum(len(body) + 1 for body in bodies[start:]) + 1  # commas, then "]}"
    while size > MAX_FILE_BYTES:
        size -= len(bodies[start]) + 1
        start += 1
    data = head + b",".join(bodies[start:]) + b"]}"
    return attrs.evolve(sheet, entries=sheet.entries[start:]), data


def _dump(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def write_atomic(path: Path, data: bytes, *, set_aside: bool) -> None:
    """Atomically replace ``path`` with ``data`` (0600), keeping a corrupt predecessor aside."""
    if set_aside:
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, path.with_name(f"{path.name}.corrupt"))
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with open(fd, "wb") as file:
            os.fchmod(fd, 0o600)  # the umask may have narrowed it; never widened
            file.write(data)
            file.flush()
            os.fsync(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
