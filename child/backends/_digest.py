"""Stable digests of tool inputs and outputs, for the supervisor's loop gate.

A digest is the first 16 hex digits of the SHA-256 of a value's canonical JSON (keys sorted,
no spaces; a string is hashed as itself), so the same call gives the same digest in every
backend and every process, and no tool input or output ever leaves the child whole.
"""

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = ["DIGEST_HEX", "digest", "digest_fields"]

DIGEST_HEX: Final = 16


def digest(value: object) -> str:
    """The digest of *value* (a string as it is; anything else as canonical JSON)."""
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
        )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_HEX]


def digest_fields(record: Mapping[str, Any], keys: Iterable[str]) -> str:
    """The digest of the *keys* of *record* it has (an event's stable part)."""
    return digest({key: record[key] for key in keys if key in record})
