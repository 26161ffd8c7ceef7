import attrs
import pytest
import trio
import trio.testing

from orchestrator.governance._watchdog import (
    DEFAULT_IDLE_MS,
    DEFAULT_MAX_TOTAL_MS,
    BudgetPolicy,
    Watchdog,
    WatchdogStats,
    resolve_policy,
)


@attrs.define
class Recorder:
    """Collects (kind, virtual time) for every timeout callback."""

    calls: list[tuple[str, float]] = attrs.Factory(list)

    def __call__(self, kind: str) -> None:
        self.calls.append((kind, trio.current_time()))


async def _started(
    nursery: trio.Nursery, idle_ms: int, max_total_ms: int
) -> tuple[Watchdog, Recorder]:
    recorder = Recorder()
    watchdog = Watchdog(BudgetPolicy(idle_ms=idle_ms, max_total_ms=max_total_ms), recorder)
    await nursery.start(watchdog.run)
    return watchdog, recorder


# --- policy ---


def test_defaults_are_the_design_numbers() -> None:
    assert BudgetPolicy() == BudgetPolicy(idle_ms=600_000, max_total_ms=1_200_000)
    assert (DEFAULT_IDLE_MS, DEFAULT_MAX_TOTAL_MS) == (600_000, 1_200_000)


def test_resolve_policy_accepts_a_valid_pair() -> None:
    assert resolve_policy(100, 86_400_000) == (
        BudgetPolicy(idle_ms=100, max_total_ms=86_400_000),
        None,
    )
    assert resolve_policy(5_000, 5_000) == (BudgetPolicy(idle_ms=5_000, max_total_ms=5_000), None)


@pytest.mark.parametrize(
    ("idle", "total", "cause"),
    [
        (True, 1_200_000, "integer"),
        (600_000, "1200000", "integer"),
        (600_000.0, 1_200_000, "integer"),
        (None, 1_200_000, "integer"),
        (99, 1_200_000, "idle_ms is outside 100..86400000 ms"),
        (600_000, 86_400_001, "max_total_ms is outside"),
        (-1, 1_200_000, "outside"),
        (900_000, 800_000, "idle_ms is longer than max_total_ms"),
    ],
)
def test_resolve_policy_falls_back_for_both_on_any_violation(
    idle: object, total: object, cause: str
) -> None:
    policy, warning = resolve_policy(idle, total)
    assert policy == BudgetPolicy(idle_ms=600_000, max_total_ms=1_200_000)
    assert warning is not None
    assert "\n" not in warning
    assert cause in warning
    assert f"idle_ms={idle!r} max_total_ms={total!r}" in warning
    assert "using the defaults 600000 ms idle / 1200000 ms max-total" in warning


def test_policy_refuses_invalid_values_when_built_directly() -> None:
    with pytest.raises(ValueError, match="longer"):
        BudgetPolicy(idle_ms=2_000, max_total_ms=1_000)
    with pytest.raises(TypeError, match="integer"):
        BudgetPolicy(idle_ms=True, max_total_ms=1_000)


# --- timing, on the autojump clock ---


async def test_idle_fires_after_exactly_the_idle_budget_of_silent_active_time(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    watchdog, recorder = await _started(nursery, 600, 10_000)
    watchdog.start_active()
    await trio.sleep(100)
    assert recorder.calls == [("idle", 0.6)]


async def test_a_question_pause_shifts_the_firing_by_exactly_the_pause(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    watchdog, recorder = await _started(nursery, 600, 10_000)
    watchdog.start_active()
    await trio.sleep(0.25)
    watchdog.pause_for_question()
    await trio.sleep(5)
    assert watchdog.statistics() == WatchdogStats(
        active_ms=250, idle_ms_remaining=350, total_ms_remaining=9_750, paused=True, fired=None
    )
    watchdog.resume_after_question()
    await trio.sleep(100)
    assert recorder.calls == [("idle", 5.6)]


async def test_max_total_counts_active_time_across_turns_not_the_gap(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    watchdog, recorder = await _started(nursery, 1_000, 1_500)
    watchdog.start_active()
    await trio.sleep(0.5)
    watchdog.heartbeat()
    await trio.sleep(0.5)
    watchdog.stop_active()
    await trio.sleep(100)
    assert recorder.calls == []
    watchdog.start_active()
    await trio.sleep(100)
    assert recorder.calls == [("max-total", 101.5)]


async def test_heartbeats_postpone_idle_but_not_max_total(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    watchdog, recorder = await _started(nursery, 500, 2_000)
    watchdog.start_active()
    while not recorder.calls:
        await trio.sleep(0.25)
        watchdog.heartbeat()
    assert recorder.calls == [("max-total", 2.0)]


async def test_silence_after_the_last_heartbeat_fires_idle_at_exactly_the_budget(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    watchdog, recorder = await _started(nursery, 500, 60_000)
    watchdog.start_active()
    await trio.sleep(0.375)
    watchdog.heartbeat()
    await trio.sleep(100)
    assert recorder.calls == [("idle", 0.875)]


async def test_a_new_turn_restarts_the_idle_budget(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    watchdog, recorder = await _started(nursery, 500, 60_000)
    watchdog.start_active()
    await trio.sleep(0.25)
    watchdog.stop_active()
    await trio.sleep(10)
    watchdog.start_active()
    await trio.sleep(100)
    assert recorder.calls == [("idle", 10.75)]


async def test_a_question_while_idle_between_turns_counts_nothing(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    watchdog, recorder = await _started(nursery, 500, 1_000)
    watchdog.pause_for_question()
    await trio.sleep(50)
    watchdog.resume_after_question()
    await trio.sleep(50)
    assert recorder.calls == []
    assert watchdog.statistics().active_ms == 0


async def test_fires_once_and_never_calls_back_again(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    recorder = Recorder()
    watchdog = Watchdog(BudgetPolicy(idle_ms=500, max_total_ms=1_000), recorder)
    watchdog.start_active()
    with trio.fail_after(10):
        await watchdog.run()  # returns once a budget has fired
    assert recorder.calls == [("idle", 0.5)]
    watchdog.start_active()
    watchdog.heartbeat()
    await trio.sleep(100)
    assert recorder.calls == [("idle", 0.5)]
    assert watchdog.statistics() == WatchdogStats(
        active_ms=500, idle_ms_remaining=500, total_ms_remaining=500, paused=False, fired="idle"
    )


async def test_max_total_wins_when_both_run_out_at_the_same_instant(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    watchdog, recorder = await _started(nursery, 1_000, 1_000)
    watchdog.start_active()
    await trio.sleep(10)
    assert recorder.calls == [("max-total", 1.0)]


async def test_state_set_before_run_starts_is_honoured(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    recorder = Recorder()
    watchdog = Watchdog(BudgetPolicy(idle_ms=500, max_total_ms=1_000), recorder)
    watchdog.start_active()
    await trio.sleep(0.25)
    await nursery.start(watchdog.run)
    await trio.sleep(10)
    assert recorder.calls == [("idle", 0.5)]


async def test_cancelling_run_stops_the_watch_without_a_callback(
    autojump_clock: trio.testing.MockClock,
) -> None:
    recorder = Recorder()
    watchdog = Watchdog(BudgetPolicy(idle_ms=500, max_total_ms=1_000), recorder)
    watchdog.start_active()
    with trio.move_on_after(0.25):
        await watchdog.run()
    await trio.sleep(10)
    assert recorder.calls == []
    assert watchdog.statistics().idle_ms_remaining == 0
    assert watchdog.statistics().fired is None
