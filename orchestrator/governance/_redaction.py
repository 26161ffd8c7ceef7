"""Redaction: every secret the supervisor holds, replaced by ``[redacted]`` wherever it shows.

A :class:`SecretSet` is the supervisor's one growing set of secrets — the session key, the
control token and every child token, raw and hex — that every run log, the reject log and every
control reply consult; a secret added later (a new child's token) is redacted from then on in
logs opened before it. :class:`_Redactor` hides secrets in a byte stream that arrives in
arbitrary chunks, a secret split across chunks included.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = ["REDACTED", "SecretSet", "as_secret_set"]

REDACTED: Final = b"[redacted]"
# A stream that stops this far into a secret still hides the fragment (a child killed mid-print).
MIN_FRAGMENT: Final = 8


def _secret_forms(secrets: Sequence[str | bytes]) -> tuple[bytes, ...]:
    forms: set[bytes] = set()
    for secret in secrets:
        if isinstance(secret, str):
            forms.add(secret.encode())
        else:
            forms.update((secret, secret.hex().encode(), secret.hex().upper().encode()))
    forms.discard(b"")
    return tuple(sorted(forms, key=len, reverse=True))  # the longest wins at one position


class SecretSet:
    """Every secret the supervisor holds, shared by all its logs and growing as it runs.

    Each child's token is added before it is written anywhere, so a log or tail made earlier
    redacts a later child's token too: every :class:`RunLog` and :class:`RejectLog` of a
    supervisor consults the one set. Secrets are never removed (a retired child's token stays
    secret). :meth:`scrub` and :meth:`scrub_value` redact text and JSON-shaped values.
    """

    def __init__(self, secrets: Iterable[str | bytes] = ()) -> None:
        self._secrets: list[str | bytes] = []
        self.version = 0
        self._forms: tuple[bytes, ...] = ()
        self._pattern: re.Pattern[bytes] | None = None
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str | bytes) -> None:
        """Redact *secret* (a str as is; bytes raw and as hex) everywhere from now on."""
        if not secret or secret in self._secrets:
            return
        self._secrets.append(secret)
        self._forms = _secret_forms(self._secrets)
        self._pattern = re.compile(b"|".join(map(re.escape, self._forms)))
        self.version += 1

    @property
    def forms(self) -> tuple[bytes, ...]:
        """Every byte form to replace, longest first."""
        return self._forms

    @property
    def pattern(self) -> re.Pattern[bytes] | None:
        return self._pattern

    def scrub_bytes(self, data: bytes) -> bytes:
        return data if self._pattern is None else self._pattern.sub(REDACTED, data)

    def scrub(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        raw = text.encode("utf-8", "surrogatepass")
        scrubbed = self._pattern.sub(REDACTED, raw)
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
        self._version = -1
        self._forms: tuple[bytes, ...] = ()
        self._pattern: re.Pattern[bytes] | None = None
        self._longest = 0
        self._pending = b""

    def _refresh(self) -> None:
        if self._version != self._secrets.version:
            self._version = self._secrets.version
            self._forms = self._secrets.forms
            self._pattern = self._secrets.pattern
            self._longest = len(self._forms[0]) if self._forms else 0

    def once(self, data: bytes) -> bytes:
        self._refresh()
        return data if self._pattern is None else self._pattern.sub(REDACTED, data)

    def feed(self, data: bytes) -> bytes:
        self._refresh()
        if self._pattern is None:
            return data
        buffer = self._pending + data
        out = bytearray()
        done = 0
        for match in self._pattern.finditer(buffer):
            if match.start() + self._longest > len(buffer):
                break  # a longer secret might still match here once more bytes arrive
            out += buffer[done : match.start()] + REDACTED
            done = match.end()
        cut = max(done, len(buffer) - self._longest + 1)
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
        for size in range(min(len(data), self._longest - 1), minimum - 1, -1):
            if any(form.startswith(data[-size:]) for form in self._forms):
                return size
        return 0
