"""Usage read from the model responses the gateway relays: the ledger's own count.

A :class:`Meter` is fed a response's bytes as they pass (:meth:`Meter.feed`), whole JSON or
``text/event-stream``, and says at the end what the response billed (:meth:`Meter.usage`). It
knows the three wire shapes the children speak:

- Anthropic Messages: ``usage`` with ``input_tokens``, ``output_tokens``,
  ``cache_read_input_tokens`` and ``cache_creation_input_tokens``; streamed, ``message_start``
  carries the input side and ``message_delta`` the (cumulative) output tokens.
- OpenAI Chat Completions: ``usage`` with ``prompt_tokens`` (cached ones included, split off
  from ``prompt_tokens_details.cached_tokens``) and ``completion_tokens``; streamed, the last
  chunk carries it.
- OpenAI Responses: ``usage`` with ``input_tokens`` (cached included, in
  ``input_tokens_details.cached_tokens``) and ``output_tokens``; streamed, in the
  ``response.completed`` event's ``response``.

Counts that are not whole numbers >= 0 count 0, so a hostile upstream cannot unspend either.
The meter reads at most :data:`MAX_HELD` bytes of one event or body; what is larger is relayed
unread (and the response counts what was read).
"""

import json
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

__all__ = ["MAX_HELD", "Meter", "Metered"]

#: The largest JSON body or single SSE event the meter holds to read.
MAX_HELD: Final = 4 << 20
_NO_USAGE: Final = re.compile(rb'"usage"\s*:\s*null')


@attrs.frozen(kw_only=True)
class Metered:
    """One response's bill: ``input_tokens`` is uncached input only."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    model: str = ""

    @property
    def tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    @property
    def empty(self) -> bool:
        return self.tokens == 0


def _count(usage: object, key: str) -> int:
    value = usage.get(key) if isinstance(usage, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@attrs.define
class Meter:
    """What one relayed response billed (see the module docstring)."""

    streaming: bool = False
    _held: bytearray = attrs.Factory(bytearray)
    _overflow: bool = False
    _parts: dict[str, int] = attrs.Factory(dict)
    _model: str = ""
    #: How far :attr:`_held` was searched for an event's end already.
    _scanned: int = 0

    def feed(self, data: bytes) -> None:
        if self._overflow:
            if not self.streaming:
                return
            end = data.find(b"\n\n")
            if end < 0:
                return
            self._overflow, data = False, data[end + 2 :]
        self._held += data
        if self.streaming:
            self._events()
        if len(self._held) > MAX_HELD:
            self._held.clear()
            self._overflow, self._scanned = True, 0

    def usage(self) -> Metered:
        """The response's bill so far (call once the response ended)."""
        if not self.streaming and self._held and not self._overflow:
            self._read(bytes(self._held))
            self._held.clear()
        elif self.streaming and self._held.strip():
            self._event(bytes(self._held))
            self._held.clear()
        return Metered(
            input_tokens=self._parts.get("input", 0),
            output_tokens=self._parts.get("output", 0),
            cache_read_tokens=self._parts.get("cache_read", 0),
            cache_write_tokens=self._parts.get("cache_write", 0),
            model=self._model[:200],
        )

    def _events(self) -> None:
        while True:
            start = max(0, self._scanned - 3)
            ends = (self._held.find(b"\n\n", start), self._held.find(b"\r\n\r\n", start))
            cut = min((i for i in ends if i >= 0), default=-1)
            if cut < 0:
                self._scanned = len(self._held)
                return
            width = 4 if self._held[cut : cut + 4] == b"\r\n\r\n" else 2
            block = bytes(self._held[:cut])
            del self._held[: cut + width]
            self._scanned = 0
            self._event(block)

    def _event(self, block: bytes) -> None:
        # Only an event that carries usage (or names the model) is worth reading: a text
        # delta is skipped on two substring searches, before any copy.
        if b'"usage"' not in block:
            if self._model or b'"model"' not in block[:300]:
                return
        elif self._model and block.count(b'"usage"') == 1 and _NO_USAGE.search(block):
            return  # OpenAI's chunks say ``"usage": null`` until the last one
        lines = block.replace(b"\r\n", b"\n").split(b"\n")
        data = b"\n".join(line[5:].lstrip(b" ") for line in lines if line.startswith(b"data:"))
        # Only an event that carries usage (or names the model) is worth parsing: a text
        # delta's JSON is skipped, so a long stream costs a substring search per event.
        if b'"usage"' in data or b'"model"' in data[:200]:
            self._read(data)

    def _read(self, data: bytes) -> None:
        try:
            payload = json.loads(data)
        except ValueError:
            return
        if isinstance(payload, Mapping):
            self._take(payload)

    def _take(self, payload: Mapping[str, Any]) -> None:
        kind = payload.get("type")
        if kind == "message_start":  # Anthropic, streamed: the input side
            self._take(_mapping(payload.get("message")))
            return
        if kind == "message_delta":  # Anthropic, streamed: cumulative output tokens
            usage = _mapping(payload.get("usage"))
            if "output_tokens" in usage:
                self._parts["output"] = _count(usage, "output_tokens")
            for key, part in (
                ("input_tokens", "input"),
                ("cache_read_input_tokens", "cache_read"),
                ("cache_creation_input_tokens", "cache_write"),
            ):
                if _count(usage, key):
                    self._parts[part] = _count(usage, key)
            return
        if isinstance(kind, str) and kind.startswith("response.") and "response" in payload:
            self._take(_mapping(payload.get("response")))  # Responses, streamed
            return
        model = payload.get("model")
        if isinstance(model, str) and model:
            self._model = model
        if not isinstance(payload.get("usage"), Mapping):
            return
        usage = _mapping(payload.get("usage"))
        if "prompt_tokens" in usage:  # Chat Completions
            prompt = _count(usage, "prompt_tokens")
            cached = min(
                prompt, _count(_mapping(usage.get("prompt_tokens_details")), "cached_tokens")
            )
            self._parts.update(
                input=prompt - cached, output=_count(usage, "completion_tokens"), cache_read=cached
            )
        elif "input_tokens_details" in usage or "total_tokens" in usage:  # Responses
            given = _count(usage, "input_tokens")
            cached = min(
                given, _count(_mapping(usage.get("input_tokens_details")), "cached_tokens")
            )
            self._parts.update(
                input=given - cached, output=_count(usage, "output_tokens"), cache_read=cached
            )
        else:  # Anthropic Messages: input_tokens is uncached input already
            self._parts.update(
                input=_count(usage, "input_tokens"),
                output=max(self._parts.get("output", 0), _count(usage, "output_tokens")),
                cache_read=_count(usage, "cache_read_input_tokens"),
                cache_write=_count(usage, "cache_creation_input_tokens"),
            )
