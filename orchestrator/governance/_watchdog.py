"""Idle and max-total budgets for one child (DESIGN.md §4).

Both budgets count *active* time only: time while a turn is running (between
:meth:`Watchdog.start_active` and :meth:`Watchdog.stop_active`) and the parent does not owe the
child an answer (between :meth:`Watchdog.pause_for_question` and
:meth:`Watchdog.resume_after_question`). Max-total is the cumulative active time across every
turn. Idle is the active time since the last heartbeat or turn start, so a child that works in
silence still times out. The policy is global and validated as a whole by
:func:`resolve_policy`; it is never a spawn parameter.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import attrs
import trio

if TYPE_CHECKING:
    from collections.abc import Callable

DEFAULT_IDLE_MS = 600_000
DEFAULT_MAX_TOTAL_MS = 1_200_000
# 100 ms lets tests use tiny budgets; 24 h is past any sensible unattended turn.
MIN_BUDGET_MS = 100
MAX_BUDGET_MS = 86_400_000

TimeoutKind = Literal["idle", "max-total"]

_NS_PER_MS = 1_000_000


def _check_budget(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    del instance
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an integer number of milliseconds")
    if not MIN_BUDGET_MS <= value <= MAX_BUDGET_MS:
        raise ValueError(f"{attribute.name} is outside {MIN_BUDGET_MS}..{MAX_BUDGET_MS} ms")


def _check_not_inverted(
    instance: BudgetPolicy, attribute: attrs.Attribute[int], value: int
) -> None:
    del attribute
    if instance.idle_ms > value:
        raise ValueError("idle_ms is longer than max_total_ms")


@attrs.frozen(kw_only=True)
class BudgetPolicy:
    """Both budgets in milliseconds; each in ``MIN_BUDGET_MS..MAX_BUDGET_MS``, idle ≤ max-total."""

    idle_ms: int = attrs.field(default=DEFAULT_IDLE_MS, validator=_check_budget)
    max_total_ms: int = attrs.field(
        default=DEFAULT_MAX_TOTAL_MS, validator=[_check_budget, _check_not_inverted]
    )


def resolve_policy(idle_ms: object, max_total_ms: object) -> tuple[BudgetPolicy, str | None]:
    """Validate the configured pair as a whole.

    Returns the policy and None, or — when either value is not an integer (booleans included),
    is out of range, or idle is longer than max-total — the default policy for *both* budgets
    and a one-line warning naming the offending values.
    """
    if isinstance(idle_ms, int) and isinstance(max_total_ms, int):
        try:
            return BudgetPolicy(idle_ms=idle_ms, max_total_ms=max_total_ms), None
        except (TypeError, ValueError) as exc:  # booleans, range, inversion
            cause = str(exc)
    else:
        cause = "both must be integer numbers of milliseconds"
    return BudgetPolicy(), (
        f"watchdog budgets idle_ms={idle_ms!r} max_total_ms={max_total_ms!r}: {cause}; "
        f"using the defaults {DEFAULT_IDLE_MS} ms idle / {DEFAULT_MAX_TOTAL_MS} ms max-total "
        f"(set both as integers in {MIN_BUDGET_MS}..{MAX_BUDGET_MS} ms with idle <= max-total)"
    )


@attrs.frozen(kw_only=True)
class WatchdogStats:
    """A snapshot: active time so far, what is left of each budget, and whether it fired."""

    active_ms: int
    idle_ms_remaining: int
    total_ms_remaining: int
    paused: bool
    fired: TimeoutKind | None


def _now_ns() -> int:
    # Whole nanoseconds keep the bookkeeping exact: deadlines land on the decimal instant the
    # budgets describe instead of drifting by float error across many segments.
    return round(trio.current_time() * 1e9)


@attrs.define(eq=False)
class Watchdog:
    """One child's budgets. ``on_timeout(kind)`` is called at most once, from :meth:`run`.

    The state-changing methods may be called before :meth:`run` starts and after it returns;
    once a budget has fired they only update state and never call back again.
    """

    policy: BudgetPolicy
    on_timeout: Callable[[TimeoutKind], None]
    _active: bool = attrs.field(default=False, init=False)
    _question: bool = attrs.field(default=False, init=False)
    _fired: TimeoutKind | None = attrs.field(default=None, init=False)
    # Active nanoseconds counted before the current segment, overall and since the last touch.
    _total_ns: int = attrs.field(default=0, init=False)
    _idle_ns: int = attrs.field(default=0, init=False)
    # When the current counting segment started, or None while nothing counts.
    _since_ns: int | None = attrs.field(default=None, init=False)
    _scope: trio.CancelScope | None = attrs.field(default=None, init=False)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch until a budget runs out, report it once and return; or until cancelled."""
        task_status.started()
        while True:
            try:
                with trio.CancelScope(deadline=self._deadline()) as self._scope:
                    await trio.sleep_forever()
            finally:
                self._scope = None
            kind = self._expired()
            if kind is not None:
                self._change(fired=kind)
                self.on_timeout(kind)
                return

    def start_active(self) -> None:
        """A turn starts: both budgets count, and the idle budget starts afresh."""
        self._change(active=True, touch=True)

    def stop_active(self) -> None:
        """The turn settled, paused or went idle: neither budget counts."""
        self._change(active=False)

    def heartbeat(self) -> None:
        """Activity from the child (the caller throttles): the idle budget starts afresh."""
        self._change(touch=True)

    def pause_for_question(self) -> None:
        """The parent owes the child an answer: both budgets stop counting."""
        self._change(question=True)

    def resume_after_question(self) -> None:
        """The question was answered or cancelled: the budgets count again if a turn is active."""
        self._change(question=False)

    def statistics(self) -> WatchdogStats:
        running = self._running_ns()
        return WatchdogStats(
            active_ms=(self._total_ns + running) // _NS_PER_MS,
            idle_ms_remaining=max(0, self._idle_left_ns() - running) // _NS_PER_MS,
            total_ms_remaining=max(0, self._total_left_ns() - running) // _NS_PER_MS,
            paused=self._question,
            fired=self._fired,
        )

    def _running_ns(self) -> int:
        return 0 if self._since_ns is None else _now_ns() - self._since_ns

    def _idle_left_ns(self) -> int:
        return self.policy.idle_ms * _NS_PER_MS - self._idle_ns

    def _total_left_ns(self) -> int:
        return self.policy.max_total_ms * _NS_PER_MS - self._total_ns

    def _change(
        self,
        *,
        active: bool | None = None,
        question: bool | None = None,
        touch: bool = False,
        fired: TimeoutKind | None = None,
    ) -> None:
        """Close the running segment, apply the change, open a new segment if time counts."""
        running = self._running_ns()
        self._total_ns += running
        self._idle_ns = 0 if touch else self._idle_ns + running
        self._active = self._active if active is None else active
        self._question = self._question if question is None else question
        self._fired = self._fired or fired
        counting = self._active and not self._question and self._fired is None
        self._since_ns = _now_ns() if counting else None
        if self._scope is not None:
            self._scope.deadline = self._deadline()

    def _deadline(self) -> float:
        if self._since_ns is None:
            return math.inf
        return (self._since_ns + min(self._idle_left_ns(), self._total_left_ns())) / 1e9

    def _expired(self) -> TimeoutKind | None:
        running = self._running_ns()
        if self._since_ns is None:
            return None
        # Max-total wins a tie: it is the hard limit and the one the user is likelier to tune.
        if self._total_left_ns() - running <= 0:
            return "max-total"
        if self._idle_left_ns() - running <= 0:
            return "idle"
        return None
