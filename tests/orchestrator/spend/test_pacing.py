"""Provider pacing as parts: Retry-After readings, the config, and one gate's turn-taking."""

import email.utils
import time

import pytest
import trio
import trio.testing

from orchestrator._errors import UsageError
from orchestrator.spend._pacing import DEFAULT_COOLDOWN, Pacing, parse_pacing, retry_after


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2", 2.0), ("0.5", 0.5), (None, DEFAULT_COOLDOWN), ("soon", DEFAULT_COOLDOWN),
     ("-3", 0.0), ("nan", DEFAULT_COOLDOWN), ("1e9", 3600.0)],
)  # fmt: skip
def test_retry_after_reads_seconds_and_is_bounded(value, expected) -> None:
    assert retry_after(value) == expected


def test_retry_after_reads_an_http_date() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < retry_after(when) <= 31


@pytest.mark.parametrize(
    ("value", "message"),
    [([], "must be a mapping"), ({"rate": 0}, "rate 0 must be above 0"),
     ({"patience": -1}, "patience -1 must be above 0"), ({"burst": 1}, "unknown key 'burst'"),
     ({"rate": True}, "rate True must be a number")],
)  # fmt: skip
def test_parse_pacing_refuses_in_one_line(value, message) -> None:
    with pytest.raises(UsageError, match=message):
        parse_pacing(value)


async def test_one_cooldown_holds_every_request_and_the_rate_spaces_them(autojump_clock) -> None:
    pacing = parse_pacing({"rate": 2, "patience": 10})
    assert pacing is not None
    assert parse_pacing(None) is None
    gate = pacing.gate("http://h:1", "m")
    assert pacing.gate("http://h:1", "m") is gate
    assert pacing.gate("http://h:1", "n") is not gate
    gate.cool(5.0)
    times: list[float] = []

    async def request() -> None:
        await gate.turn()
        times.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(request)
        await trio.testing.wait_all_tasks_blocked()
        assert gate.waiting == 4
    assert min(times) >= 5.0  # nobody before the cooldown ended
    spacing = [b - a for a, b in zip(sorted(times), sorted(times)[1:], strict=False)]
    assert all(gap >= 0.5 - 1e-9 for gap in spacing), spacing  # two a second
    assert Pacing().gate("x", "").rate is None
