"""Provider pacing: one gate per provider and model for the whole session.

Every model request the gateway relays takes its turn at its :class:`Gate` (keyed by the
upstream and the request's ``model``) first: it waits out a shared *cooldown*, then a slot
under the configured *rate* (requests per second; none: unpaced). A ``429`` or ``529`` answer
sets the cooldown for everyone — its ``Retry-After`` (seconds or an HTTP date; else
:data:`DEFAULT_COOLDOWN`) — and each waiter wakes with its own jitter, so a fan-out does not
stampede the provider the moment it reopens. The request that was refused is retried by the
gateway after the cooldown, unless the cooldown is longer than the configured *patience*: then
the ``429`` reaches the child (and a role's fallback takes over).
"""

import email.utils
import math
import random
import time
from collections.abc import Mapping
from typing import Final

import attrs
import trio

from orchestrator._errors import UsageError

__all__ = ["DEFAULT_COOLDOWN", "Gate", "Pacing", "parse_pacing", "retry_after"]

DEFAULT_COOLDOWN: Final = 1.0
#: The most a waiter adds to the cooldown, as a fraction of it (and at most 1 s).
JITTER: Final = 0.25
MAX_COOLDOWN: Final = 3600.0


def retry_after(value: str | None) -> float:
    """Seconds a ``Retry-After`` asks for (delta seconds or an HTTP date), bounded to
    [0, :data:`MAX_COOLDOWN`]; :data:`DEFAULT_COOLDOWN` when absent or unreadable."""
    if not value:
        return DEFAULT_COOLDOWN
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return DEFAULT_COOLDOWN
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return DEFAULT_COOLDOWN
    return min(max(seconds, 0.0), MAX_COOLDOWN)


@attrs.define(eq=False)
class Gate:
    """One provider/model's turn-taking (see the module docstring)."""

    key: str
    rate: float | None = None
    _next_slot: float = 0.0
    _cool_until: float = 0.0
    #: Requests waiting here now (``peek`` says so).
    waiting: int = 0

    @property
    def cooling(self) -> float:
        """Seconds of cooldown left (0: open)."""
        return max(0.0, self._cool_until - trio.current_time())

    async def turn(self) -> None:
        """Wait out the cooldown (with this waiter's jitter), then a slot under the rate."""
        self.waiting += 1
        try:
            while True:
                now = trio.current_time()
                if now < self._cool_until:
                    left = self._cool_until - now
                    await trio.sleep(left + random.uniform(0, min(1.0, JITTER * left)))  # noqa: S311
                    continue
                if self.rate:
                    slot = max(now, self._next_slot)
                    self._next_slot = slot + 1.0 / self.rate
                    if slot > now:
                        await trio.sleep_until(slot)
                        if trio.current_time() < self._cool_until:
                            continue  # a cooldown began while this one waited its slot
                return
        finally:
            self.waiting -= 1

    def cool(self, seconds: float) -> None:
        """A 429/529 said wait *seconds*: every request of this gate waits."""
        self._cool_until = max(self._cool_until, trio.current_time() + seconds)


@attrs.define(eq=False)
class Pacing:
    """The session's gates: *rate* requests per second each (None: unpaced), and the
    *patience* in seconds a request waits out a cooldown before its 429 goes to the child."""

    rate: float | None = None
    patience: float = 60.0
    gates: dict[str, Gate] = attrs.Factory(dict)

    def gate(self, upstream: str, model: str) -> Gate:
        key = f"{upstream} {model}".strip()
        gate = self.gates.get(key)
        if gate is None:
            gate = self.gates[key] = Gate(key=key, rate=self.rate)
        return gate


def parse_pacing(value: object) -> Pacing | None:
    """``subagents.pacing`` (``rate``: requests per second per provider/model; ``patience``:
    seconds a cooldown is waited out), or one :class:`UsageError` line; None when it is not
    configured (no gate: a 429 goes straight to the child, and a role's fallback takes over)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise UsageError("subagents.pacing must be a mapping of rate, patience")
    unknown = sorted(str(k) for k in value if k not in ("rate", "patience"))
    if unknown:
        raise UsageError(f"subagents.pacing: unknown key {unknown[0]!r} (one of rate, patience)")
    numbers: dict[str, float] = {}
    for key in ("rate", "patience"):
        item = value.get(key)
        if item is None:
            continue
        if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(item):
            raise UsageError(f"subagents.pacing: {key} {item!r} must be a number")
        if item < 0 or (key == "rate" and item == 0):
            raise UsageError(f"subagents.pacing: {key} {item!r} must be above 0")
        numbers[key] = float(item)
    return Pacing(rate=numbers.get("rate"), patience=numbers.get("patience", 60.0))
