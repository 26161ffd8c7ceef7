"""Request deadlines (:mod:`ipc._requests`), in virtual time over in-memory streams."""

import collections
import math

import pytest
import trio
import trio.testing

import ipc
from ipc import Reply, RequestTimeout

SAMPLES: dict[str, ipc.Message] = {
    "prompt": ipc.Prompt(text="go", turn=1),
    "steer": ipc.Steer(text="left"),
    "abort": ipc.Abort(),
    "ask": ipc.Ask(text="btw?", turn=2),
    "answer": ipc.Answer(question="q1", text="yes"),
    "shutdown": ipc.Shutdown(),
    "renew": ipc.Renew(),
    "hello": ipc.Hello(pid=1),
    "event": ipc.Event(activity="status"),
    "settled": ipc.Settled(turn=1, text="## Summary"),
    "question": ipc.Question(text="which?"),
    "spawn": ipc.Spawn(agent="scout", task="look"),
    "ownership": ipc.Ownership(paths=["src/*.py"]),
    "discuss": ipc.Discuss(op="list"),
    "proxy": ipc.Proxy(tool="browser"),
    "reply": Reply(ok=True),
    "control": ipc.Control(op="peek"),
}
NEEDS_DEADLINE = sorted(set(SAMPLES) - ipc.NO_DEADLINE_TYPES)


def test_samples_cover_every_message_type():
    assert set(SAMPLES) == set(ipc.MESSAGE_TYPES)


def memory_channels(**options):
    left, right = trio.testing.memory_stream_pair()
    token = "t" * 64
    return (
        ipc.Channel(stream=left, owner="a1", token=token, **options),
        ipc.Channel(stream=right, owner="a1", token=token),
    )


async def test_the_default_deadline_fires_at_exactly_five_seconds(autojump_clock):
    channel, _silent_peer = memory_channels()
    start = trio.current_time()
    with pytest.raises(RequestTimeout, match="within 5 s"):
        await channel.request(ipc.Prompt(text="x", turn=1))
    assert trio.current_time() == start + 5.0
    assert ipc.DEFAULT_TIMEOUT == 5.0
    assert channel.statistics()["pending"] == 0


@pytest.mark.parametrize("timeout", [0.001, 0.25, 120.0])
async def test_a_custom_deadline_fires_exactly(timeout, autojump_clock):
    channel, _silent_peer = memory_channels()
    start = trio.current_time()
    with pytest.raises(RequestTimeout):
        await channel.request(ipc.Steer(text="x"), timeout=timeout)
    assert trio.current_time() == start + timeout


async def test_the_channel_default_deadline_is_configurable(autojump_clock):
    channel, _silent_peer = memory_channels(default_timeout=0.5)
    start = trio.current_time()
    with pytest.raises(RequestTimeout):
        await channel.request(ipc.Abort())
    assert trio.current_time() == start + 0.5


async def test_a_serving_channel_times_out_at_exactly_five_seconds(
    autojump_clock, serve_channel, nursery
):
    # While serve() runs, its deadline keeper (not a per-request scope) enforces deadlines.
    channel, _silent_peer = memory_channels()
    await serve_channel(nursery, channel)
    start = trio.current_time()
    with pytest.raises(RequestTimeout, match="within 5 s"):
        await channel.request(ipc.Prompt(text="x", turn=1))
    assert trio.current_time() == start + 5.0
    assert channel.statistics()["pending"] == 0


async def test_a_shorter_deadline_behind_a_longer_one_fires_first(
    autojump_clock, serve_channel, nursery
):
    channel, _silent_peer = memory_channels()
    await serve_channel(nursery, channel)
    start = trio.current_time()
    fired = {}

    async def ask(name, timeout):
        with pytest.raises(RequestTimeout):
            await channel.request(ipc.Abort(), timeout=timeout)
        fired[name] = trio.current_time() - start

    async with trio.open_nursery() as waiting:
        waiting.start_soon(ask, "long", 120.0)
        await trio.sleep(1.0)
        waiting.start_soon(ask, "short", 0.5)
    assert fired == {"short": 1.5, "long": 120.0}


async def test_a_response_inside_the_deadline_wins(autojump_clock, serve_channel, nursery):
    async def slow(envelope):
        await trio.sleep(4.999)
        return Reply(ok=True)

    channel, peer = memory_channels()
    await serve_channel(nursery, channel)
    await serve_channel(nursery, peer, slow)
    start = trio.current_time()
    assert await channel.request(ipc.Abort()) == Reply(ok=True)
    assert trio.current_time() == start + 4.999


async def test_a_response_after_the_deadline_is_discarded_quietly(
    autojump_clock, serve_channel, nursery
):
    async def slow(envelope):
        await trio.sleep(5.5)
        return Reply(ok=True)

    channel, peer = memory_channels()
    await serve_channel(nursery, channel)
    await serve_channel(nursery, peer, slow)
    start = trio.current_time()
    with pytest.raises(RequestTimeout):
        await channel.request(ipc.Abort())
    assert trio.current_time() == start + 5.0
    await trio.sleep(1.0)  # the late reply lands at 5.5
    assert channel.drops == collections.Counter()
    assert not channel.closed


@pytest.mark.parametrize("type_", sorted(ipc.NO_DEADLINE_TYPES))
async def test_question_and_spawn_may_wait_without_deadline(type_, autojump_clock):
    channel, _silent_peer = memory_channels()
    start = trio.current_time()
    with trio.move_on_after(10_000) as scope:
        await channel.request(SAMPLES[type_], timeout=None)
    assert scope.cancelled_caught  # still waiting long after any deadline would have fired
    assert trio.current_time() == start + 10_000
    assert channel.statistics()["pending"] == 0


@pytest.mark.parametrize("type_", NEEDS_DEADLINE)
async def test_every_other_type_must_have_a_deadline(type_):
    channel, _peer = memory_channels()
    with pytest.raises(ValueError, match=f"a '{type_}' request must have a deadline"):
        await channel.request(SAMPLES[type_], timeout=None)
    assert channel.statistics()["pending"] == 0


@pytest.mark.parametrize("timeout", [0.001, 0.5, 5.0, 120.0])
def test_check_timeout_accepts_the_range(timeout):
    assert ipc.check_timeout(timeout) == timeout


@pytest.mark.parametrize("timeout", [0.0, 0.0009, -1.0, 120.001, math.inf, math.nan])
def test_check_timeout_refuses_outside_the_range(timeout):
    with pytest.raises(ValueError, match=r"outside 0.001..120.0 s"):
        ipc.check_timeout(timeout)


@pytest.mark.parametrize("timeout", [0.0, 121.0])
async def test_out_of_range_deadlines_are_refused_per_request_and_per_channel(timeout):
    channel, _peer = memory_channels()
    with pytest.raises(ValueError, match="outside"):
        await channel.request(ipc.Abort(), timeout=timeout)
    with pytest.raises(ValueError, match="outside"):
        memory_channels(default_timeout=timeout)
