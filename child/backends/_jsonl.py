"""Bounded JSON Lines, as the agent CLIs (Pi RPC, Claude stream-json, Codex) speak them.

Records are split on ``\\n`` bytes only — never ``str.splitlines``, which also splits on
U+2028 and friends that JSON strings may carry raw — and a trailing ``\\r`` is stripped. A
record longer than the cap is not buffered: its bytes are skipped up to the next newline and it
comes out as an :class:`Oversize` record that keeps only its ``type`` (sniffed from its first
bytes), so a huge ``agent_end`` still settles a turn while its body is dropped.
"""

import json
import logging
import re
from collections import deque
from typing import Any, Final

import attrs
import trio

MAX_RECORD_BYTES: Final = 16 * 1024 * 1024
_READ_SIZE: Final = 65536
_HEAD_BYTES: Final = 512
log = logging.getLogger("child")

_TYPE_FIELD: Final = re.compile(rb'"(?:type|method)"\s*:\s*"([A-Za-z0-9_./-]{1,64})"')


@attrs.frozen(kw_only=True)
class Oversize:
    """A record that exceeded the cap: its size and its first bytes, nothing else."""

    size: int
    head: bytes

    @property
    def kind(self) -> str:
        """The record's ``type`` (or ``method``) when its first bytes name one, else ``""``."""
        match = _TYPE_FIELD.search(self.head)
        return match.group(1).decode() if match else ""


@attrs.define(eq=False)
class LineSplitter:
    """Sans-IO splitter: feed bytes, take complete records (bytes, or :class:`Oversize`)."""

    max_bytes: int = MAX_RECORD_BYTES
    _buffer: bytearray = attrs.Factory(bytearray)
    _skipped: int = 0  # > 0: inside an oversize record; its bytes seen so far
    _head: bytes = b""

    def feed(self, data: bytes | bytearray) -> list[bytes | Oversize]:
        """Add *data*; return every record it completed, in order."""
        out: list[bytes | Oversize] = []
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            self._add(data[start:end])
            if newline < 0:
                break
            out.extend(self._take())
            start = newline + 1
        return out

    def close(self) -> list[bytes | Oversize]:
        """End of stream: a last record without its newline is still a record."""
        return self._take()

    def _add(self, chunk: bytes | bytearray) -> None:
        if self._skipped:
            self._skipped += len(chunk)
            return
        if len(self._buffer) + len(chunk) <= self.max_bytes:
            self._buffer += chunk
            return
        # Over the cap: keep only the head (to name the record) and count the rest.
        self._head = bytes(self._buffer[:_HEAD_BYTES] + chunk[:_HEAD_BYTES])[:_HEAD_BYTES]
        self._skipped = len(self._buffer) + len(chunk)
        self._buffer.clear()

    def _take(self) -> list[bytes | Oversize]:
        if self._skipped:
            record = Oversize(size=self._skipped, head=self._head)
            self._skipped, self._head = 0, b""
            return [record]
        line = bytes(self._buffer).removesuffix(b"\r")
        self._buffer.clear()
        return [line] if line.strip() else []


def decode(line: bytes) -> dict[str, Any] | None:
    """One record's JSON object; ``None`` for a line that is not one (CLIs print stray lines)."""
    try:
        value = json.loads(line)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


@attrs.define(eq=False)
class RecordReader:
    """Reads JSON objects (or :class:`Oversize` records) from a byte stream, one at a time.

    Cancellation-safe: a :meth:`receive` cancelled while waiting loses nothing, so one reader
    can serve a CLI's whole life across turns. Lines that are not JSON objects are logged and
    skipped.
    """

    stream: trio.abc.ReceiveStream
    max_bytes: int = MAX_RECORD_BYTES
    _splitter: LineSplitter = attrs.field(init=False)
    _ready: deque[bytes | Oversize] = attrs.Factory(deque)
    _eof: bool = False

    def __attrs_post_init__(self) -> None:
        self._splitter = LineSplitter(max_bytes=self.max_bytes)

    async def receive(self) -> dict[str, Any] | Oversize | None:
        """The next record; ``None`` at end of stream (and on every call after it)."""
        while True:
            while self._ready:
                record = self._ready.popleft()
                if isinstance(record, Oversize):
                    log.warning("dropped a %d-byte record (%r)", record.size, record.kind)
                    return record
                value = decode(record)
                if value is not None:
                    return value
                log.info("ignored a line that is not a JSON object: %r", record[:200])
            if self._eof:
                return None
            data = await self.stream.receive_some(_READ_SIZE)
            if data:
                self._ready.extend(self._splitter.feed(data))
            else:
                self._eof = True
                self._ready.extend(self._splitter.close())


def encode(message: dict[str, Any]) -> bytes:
    """One record to send: compact ASCII JSON (no raw newline or U+2028), newline-ended."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"
