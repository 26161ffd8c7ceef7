"""The loop gate (pi-jar's advisor rule): a child repeating itself, or failing over and over.

Pure and synchronous: the core feeds it each tool call (tool name and a stable digest of its
input) and each result (a digest of the output, and whether it failed), and acts on the
:class:`Trip` it returns — the builtin agent refuses the call, a CLI backend is steered with
:attr:`Trip.line`. Rules:

- **repeat**: the same tool with the same input for the :data:`REPEATS`-th time within the
  last :data:`WINDOW` calls, *and* the last ``REPEATS - 1`` such calls returned the same result.
  A child polling a growing log (same input, different output) is making progress and never
  trips; one whose tool answers a repeat differently from the first call (Claude Code's
  ``Read`` says "unchanged" the second time) trips once the answers stop changing.
- **failures**: :data:`FAILURES` failing tool results in a row.

Both share a budget of :data:`INTERVENTIONS` per prompt (:meth:`LoopGate.new_prompt` resets
it); the trip past the budget has :attr:`Trip.stop` set: the child is stopped with an
``incomplete`` handoff.
"""

import collections
from typing import Final, Literal

import attrs

__all__ = ["FAILURES", "INTERVENTIONS", "REPEATS", "WINDOW", "LoopGate", "Trip"]

WINDOW: Final = 8
REPEATS: Final = 3
FAILURES: Final = 3
INTERVENTIONS: Final = 2


@attrs.frozen(kw_only=True)
class Trip:
    """One intervention: what tripped, the one line the child is told, and whether the
    per-prompt budget is spent (then the child is stopped instead)."""

    kind: Literal["repeat", "failures"]
    line: str
    stop: bool


@attrs.define(eq=False)
class _Call:
    tool: str
    input: str
    result: str | None = None
    pending: bool = True


@attrs.define(eq=False)
class LoopGate:
    """One child's loop gate."""

    _calls: collections.deque[_Call] = attrs.Factory(lambda: collections.deque(maxlen=WINDOW))
    _failing: int = 0
    interventions: int = 0
    #: The last trip's line, for ``peek`` (``looping``); ``""`` since the last prompt.
    last: str = ""

    def new_prompt(self) -> None:
        """A new prompt from the parent: history and the intervention budget start over."""
        self._calls.clear()
        self._failing = 0
        self.interventions = 0
        self.last = ""

    def on_call(self, tool: str, digest: str, *, blocking: bool = False) -> Trip | None:
        """A tool call begins; a :class:`Trip` when it repeats a call that got nowhere.

        With *blocking* (the builtin agent refuses a tripped call) the refused call gets no
        result of its own: it is recorded with the result it would have repeated, so the
        next identical call trips again.
        """
        earlier = [c for c in self._calls if c.tool == tool and c.input == digest]
        call = _Call(tool=tool, input=digest)
        self._calls.append(call)
        if len(earlier) + 1 < REPEATS:
            return None
        recent = earlier[-(REPEATS - 1) :]
        results = {c.result for c in recent}
        if None in results or len(results) != 1 or any(c.pending for c in recent):
            return None  # a result still unknown, or the output changed: progress
        if blocking:
            call.result, call.pending = earlier[-1].result, False
        return self._trip(
            "repeat",
            f"loop gate: {tool} was called with the same input {len(earlier) + 1} times in the "
            f"last {WINDOW} calls with the same result; stop repeating it and change approach",
        )

    def on_result(self, tool: str, digest: str, *, failed: bool) -> Trip | None:
        """A tool call of *tool* ended with output *digest*; a :class:`Trip` on the
        :data:`FAILURES`-th failure in a row."""
        for call in reversed(self._calls):
            if call.tool == tool and call.pending:
                call.result, call.pending = digest, False
                break
        if not failed:
            self._failing = 0
            return None
        self._failing += 1
        if self._failing < FAILURES:
            return None
        self._failing = 0
        return self._trip(
            "failures",
            f"loop gate: {FAILURES} tool calls failed in a row (last: {tool}); stop and "
            "rethink the approach before calling tools again",
        )

    def _trip(self, kind: Literal["repeat", "failures"], line: str) -> Trip:
        self.interventions += 1
        self.last = line
        return Trip(kind=kind, line=line, stop=self.interventions > INTERVENTIONS)
