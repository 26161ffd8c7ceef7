"""The builtin agent's transcript: its conversation, kept where a revived child finds it.

After each turn the whole conversation is written to the loadout's ``resume`` file (in the
child's own scratch, which no other child sees): a same-directory temp file, mode 0600,
fsynced, then renamed over the old one, so a crash at any instant leaves the previous turn's
transcript or this one's, never a torn one. A revived child (``restarted`` in its loadout)
starts from it; a transcript that is missing or not a conversation is refused in one line.
"""

import json
from pathlib import Path
from typing import Any, Final

import ipc

__all__ = ["TRANSCRIPT_VERSION", "TranscriptError", "load_transcript", "save_transcript"]

TRANSCRIPT_VERSION: Final = 1


class TranscriptError(Exception):
    """The transcript a revive needs cannot be used; the message says why, in one line."""


def save_transcript(path: Path, messages: list[dict[str, Any]]) -> str:
    """Replace *path* with *messages*, atomically (blocking: call it from a thread); the text
    written (ASCII JSON)."""
    text = json.dumps({"version": TRANSCRIPT_VERSION, "messages": messages})
    ipc.write_private(path, text.encode())  # the scratch is ours and 0700: the loadout's writer
    return text


def load_transcript(path: Path) -> list[dict[str, Any]]:
    """The conversation saved at *path*, or :class:`TranscriptError`."""
    try:
        obj = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise TranscriptError(f"transcript {path} is gone; the child cannot be revived") from None
    except (OSError, ValueError) as exc:
        raise TranscriptError(f"transcript {path} is unreadable: {exc}") from None
    if not isinstance(obj, dict) or obj.get("version") != TRANSCRIPT_VERSION:
        raise TranscriptError(f"transcript {path} is not a version {TRANSCRIPT_VERSION} transcript")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
    ):
        raise TranscriptError(f"transcript {path} holds no conversation")
    return messages
