"""``Channel.send_event``: always a cancel point, a schedule point at least every few events."""

import itertools

import trio

import ipc
from ipc._channel import EVENTS_PER_YIELD

EVENT = ipc.Event(activity="status", text="tick")


def channel_pair() -> tuple[ipc.Channel, trio.SocketStream]:
    left, right = trio.socket.socketpair()
    channel = ipc.Channel(stream=trio.SocketStream(left), owner="a1", token="t" * 64)
    return channel, trio.SocketStream(right)


async def drain(peer: trio.SocketStream, frames: int) -> list[bytes]:
    decoder = ipc.FrameDecoder()
    bodies: list[bytes] = []
    while len(bodies) < frames:
        bodies += decoder.feed(await peer.receive_some())
    return bodies


async def test_a_loop_of_events_lets_other_tasks_run_every_few_events():
    channel, peer = channel_pair()
    sent = 0
    seen: list[int] = []  # how many events were sent each time the other task ran

    async def watcher() -> None:
        while True:
            seen.append(sent)
            await trio.lowlevel.checkpoint()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher)
            await trio.lowlevel.checkpoint()  # the watcher has started
            for _ in range(10 * EVENTS_PER_YIELD):
                await channel.send_event(EVENT)
                sent += 1
            nursery.cancel_scope.cancel()
        bodies = await drain(peer, 10 * EVENTS_PER_YIELD)
        await channel.aclose()
        await peer.aclose()
    assert len(bodies) == 10 * EVENTS_PER_YIELD
    gaps = [later - earlier for earlier, later in itertools.pairwise(seen)]
    # trio may run the two tasks of a batch in either order: two sends between looks at most.
    assert max(gaps) <= 2 * EVENTS_PER_YIELD
    assert len(seen) >= 10  # it ran about once per EVENTS_PER_YIELD events, not once in all


async def test_a_cancelled_send_writes_nothing_even_between_yields():
    channel, peer = channel_pair()
    with trio.fail_after(10):
        await channel.send_event(EVENT)  # the next event would not yield
        with trio.CancelScope() as scope:
            scope.cancel()
            await channel.send_event(ipc.Event(activity="status", text="never"))
        assert scope.cancelled_caught
        await channel.send_event(ipc.Event(activity="status", text="after"))
        bodies = await drain(peer, 2)
        assert not channel.closed
        await channel.aclose()
        await peer.aclose()
    texts = [ipc.decode_envelope(body).body.text for body in bodies]  # type: ignore[union-attr]
    assert texts == ["tick", "after"]
