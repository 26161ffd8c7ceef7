"""Redaction: every secret the supervisor holds, replaced by ``[redacted]`` wherever it shows.

A :class:`SecretSet` is the supervisor's one growing set of secrets — the session key, the
control token and every child token, raw and hex — that every run log, the reject log and every
control reply consult; a secret added later (a new child's token) is redacted from then on in
logs opened before it. :class:`Redactor` hides secrets in a byte stream that arrives in
arbitrary chunks, a secret split across chunks included.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = ["REDACTED", "SecretSet", "as_secret_set"]

REDACTED: Final = b"[redacted]"
# A stream that stops this far into a secret still hides the fragment (a child killed mid-print).
MIN_FRAGMENT: Final = 8


def _secret_forms(secret: str | bytes) -> set[bytes]:
    if isinstance(secret, str):
        forms = {secret.encode()}
    else:
        forms = {secret, secret.hex().encode(), secret.hex().upper().encode()}
    forms.discard(b"")
    return forms


# A form this shaped (a child token: 64 hex characters) is looked up in a set inside every hex
# run rather than compiled into the alternation, so a new child's token costs a set insert.
_HEX: Final = re.compile(rb"[0-9a-fA-F]{16,}")


class SecretSet:
    """Every secret the supervisor holds, shared by all its logs and growing as it runs.

    Each child's token is added before it is written anywhere, so a log or tail made earlier
    redacts a later child's token too: every :class:`RunLog` and :class:`RejectLog` of a
    supervisor consults the one set. Secrets are never removed (a retired child's token stays
    secret: a log or a kept transcript may still hold it). :meth:`scrub` and
    :meth:`scrub_value` redact text and JSON-shaped values.

    Adding is incremental: a hex-shaped form (every child token) goes into a set per length,
    found by sliding over each hex run of the text; only the few other forms (a session key's
    raw bytes) make a compiled alternation. A map of thousands of rows neither recompiles a
    growing pattern on each spawn nor fills ``re``'s pattern cache with them.
    """

    def __init__(self, secrets: Iterable[str | bytes] = ()) -> None:
        self._seen: set[str | bytes] = set()
        self.version = 0
        self._hex: dict[int, set[bytes]] = {}
        self._other: set[bytes] = set()
        self._pattern: re.Pattern[bytes] | None = None
        self._sorted: list[bytes] = []  # every form, sorted: a prefix is found by bisection
        self.longest = 0
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str | bytes) -> None:
        """Redact *secret* (a str as is; bytes raw and as hex) everywhere from now on."""
        if not secret or secret in self._seen:
            return
        self._seen.add(secret)
        other = False
        for form in _secret_forms(secret):
            if form in self._other or form in self._hex.get(len(form), ()):
                continue
            if _HEX.fullmatch(form):
                self._hex.setdefault(len(form), set()).add(form)
            else:
                self._other.add(form)
                other = True
            bisect.insort(self._sorted, form)
            self.longest = max(self.longest, len(form))
        if other:
            forms = sorted(self._other, key=len, reverse=True)  # the longest wins at one place
            self._pattern = re.compile(b"|".join(map(re.escape, forms)))
        self.version += 1

    @property
    def empty(self) -> bool:
        return not self._sorted

    def spans(self, data: bytes) -> list[tuple[int, int]]:
        """Where secrets are in *data*: ordered, disjoint (overlapping finds are joined)."""
        found: list[tuple[int, int]] = []
        if self._pattern is not None:
            found.extend(m.span() for m in self._pattern.finditer(data))
        if self._hex:
            lengths = sorted(self._hex, reverse=True)
            for run in _HEX.finditer(data):
                begin, end = run.span()
                at = begin
                while at < end:
                    for size in lengths:
                        if at + size <= end and data[at : at + size] in self._hex[size]:
                            found.append((at, at + size))
                            at += size
                            break
                    else:
                        at += 1
        if len(found) < 2:
            return found
        found.sort()
        merged = [found[0]]
        for start, stop in found[1:]:
            if start < merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
            else:
                merged.append((start, stop))
        return merged

    def scrub_bytes(self, data: bytes) -> bytes:
        spans = self.spans(data) if self._sorted else []
        if not spans:
            return data
        out = bytearray()
        done = 0
        for start, stop in spans:
            out += data[done:start] + REDACTED
            done = stop
        return bytes(out + data[done:])

    def begins_secret(self, piece: bytes) -> bool:
        """Whether some secret's form begins with *piece*."""
        at = bisect.bisect_left(self._sorted, piece)
        return at < len(self._sorted) and self._sorted[at].startswith(piece)

    def scrub(self, text: str) -> str:
        if not self._sorted or not text:
            return text
        raw = text.encode("utf-8", "surrogatepass")
        scrubbed = self.scrub_bytes(raw)
        return text if scrubbed == raw else scrubbed.decode("utf-8", "surrogatepass")

    def scrub_value(self, value: Any) -> Any:
        """*value* with every string in it (keys too) scrubbed; other leaves kept as they are."""
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, Mapping):
            return {self.scrub_value(k): self.scrub_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub_value(item) for item in value]
        return value


def as_secret_set(secrets: SecretSet | Sequence[str | bytes]) -> SecretSet:
    return secrets if isinstance(secrets, SecretSet) else SecretSet(secrets)


class Redactor:
    """Replaces every secret in a byte stream that arrives in arbitrary chunks.

    Up to ``longest - 1`` bytes are held back after each chunk: they may be the start of a
    secret whose end is still to come. The secrets are those of a shared :class:`SecretSet`,
    re-read whenever it has grown.
    """

    def __init__(self, secrets: SecretSet) -> None:
        self._secrets = secrets
        self._pending = b""

    def once(self, data: bytes) -> bytes:
        return self._secrets.scrub_bytes(data)

    def feed(self, data: bytes) -> bytes:
        secrets = self._secrets
        if secrets.empty:
            return data
        longest = secrets.longest
        buffer = self._pending + data
        out = bytearray()
        done = 0
        for start, stop in secrets.spans(buffer):
            if start + longest > len(buffer):
                break  # a longer secret might still match here once more bytes arrive
            out += buffer[done:start] + REDACTED
            done = stop
        cut = max(done, len(buffer) - longest + 1)
        out += buffer[done:cut]
        self._pending = buffer[cut:]
        return bytes(out)

    def flush(self) -> bytes:
        """Release what is held back; a trailing piece of a secret is replaced too."""
        rest = self.once(self._pending)
        self._pending = b""
        size = self._fragment(rest, MIN_FRAGMENT)
        return rest[: len(rest) - size] + REDACTED if size else rest

    def preview(self) -> bytes:
        """What is held back, short of anything that could begin a secret."""
        rest = self.once(self._pending)
        return rest[: len(rest) - self._fragment(rest, 1)]

    def _fragment(self, data: bytes, minimum: int) -> int:
        """The length of the longest end of ``data`` that begins a secret, if ``minimum`` long."""
        for size in range(min(len(data), self._secrets.longest - 1), minimum - 1, -1):
            if self._secrets.begins_secret(data[-size:]):
                return size
        return 0
