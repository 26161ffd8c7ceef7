import collections

import pytest
import trio
import trio.testing

import ipc
from ipc import ChannelClosed, RemoteError, Reply, RequestTimeout

# -- request / response / events over a real socket ----------------------------------------


async def test_request_and_response_in_both_directions(connect, serve_channel, nursery):
    pair = await connect()
    server = await serve_channel(nursery, pair.server)
    client = await serve_channel(nursery, pair.client)
    with trio.fail_after(10):
        reply = await pair.client.request(ipc.Ownership(paths=["a"]))
        assert reply == Reply(ok=True, data={"type": "ownership", "n": 1})
        assert server.requests[0].body == ipc.Ownership(paths=["a"])
        assert server.requests[0].owner == "a1"
        reply = await pair.server.request(ipc.Prompt(text="go", turn=1))
        assert reply == Reply(ok=True, data={"type": "prompt", "n": 1})
        assert client.requests[0].body == ipc.Prompt(text="go", turn=1)


async def test_pipelined_events_arrive_in_order(connect, serve_channel, nursery):
    pair = await connect()
    server = await serve_channel(nursery, pair.server)
    with trio.fail_after(10):
        for index in range(500):
            await pair.client.send_event(ipc.Event(activity="status", text=str(index)))
        texts = [(await server.next_event()).body.text for _ in range(500)]
    assert texts == [str(index) for index in range(500)]
    assert pair.server.drops == collections.Counter()


async def test_an_error_reply_raises_remote_error(connect, serve_channel, nursery):
    async def refuse(envelope):
        return Reply(ok=False, error="ownership of a overlaps a2")

    pair = await connect()
    await serve_channel(nursery, pair.server, refuse)
    await serve_channel(nursery, pair.client)
    with trio.fail_after(10), pytest.raises(RemoteError, match="overlaps a2"):
        await pair.client.request(ipc.Ownership(paths=["a"]))


async def test_a_failing_handler_answers_with_an_error_and_keeps_serving(
    connect, serve_channel, nursery
):
    calls = []

    async def flaky(envelope):
        calls.append(envelope.type)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return Reply(ok=True)

    pair = await connect()
    await serve_channel(nursery, pair.server, flaky)
    await serve_channel(nursery, pair.client)
    with trio.fail_after(10):
        with pytest.raises(RemoteError, match="prompt failed: boom"):
            await pair.client.request(ipc.Prompt(text="x", turn=1))
        assert await pair.client.request(ipc.Steer(text="y")) == Reply(ok=True)


async def test_a_handler_returning_a_non_reply_is_an_error(connect, serve_channel, nursery):
    async def wrong(envelope):
        return ipc.Steer(text="not a response")

    pair = await connect()
    await serve_channel(nursery, pair.server, wrong)
    await serve_channel(nursery, pair.client)
    with trio.fail_after(10), pytest.raises(RemoteError, match="returned no reply"):
        await pair.client.request(ipc.Steer(text="y"))


async def test_an_oversize_response_becomes_an_error_reply(connect, serve_channel, nursery):
    async def huge(envelope):
        if isinstance(envelope.body, ipc.Steer):
            return Reply(ok=True, data={"blob": "x" * ipc.MAX_FRAME})
        return Reply(ok=True)

    pair = await connect()
    served = await serve_channel(nursery, pair.server, huge)
    served = await serve_channel(nursery, pair.client)
    with trio.fail_after(10):
        with pytest.raises(RemoteError, match="steer response could not be encoded"):
            await pair.client.request(ipc.Steer(text="y"))
        # The reader survived the handler's mistake.
        assert await pair.client.request(ipc.Abort()) == Reply(ok=True)
    assert not served.finished.is_set()


async def test_a_failing_event_handler_does_not_stop_the_reader(connect, serve_channel, nursery):
    seen = []

    async def on_event(envelope):
        seen.append(envelope.body.text)
        if envelope.body.text == "bad":
            raise ValueError("cannot render")

    pair = await connect()
    served = await serve_channel(nursery, pair.server, on_event=on_event)
    served = await serve_channel(nursery, pair.client)
    with trio.fail_after(10):
        await pair.client.send_event(ipc.Event(activity="status", text="bad"))
        await pair.client.send_event(ipc.Event(activity="status", text="good"))
        await pair.client.request(ipc.Abort())  # a round trip: both events were handled
    assert seen == ["bad", "good"]
    assert not served.finished.is_set()


async def test_sending_an_oversize_request_fails_locally_and_leaves_nothing_pending(connect):
    pair = await connect()
    with pytest.raises(ipc.FrameError):
        await pair.client.request(ipc.Steer(text="x" * ipc.MAX_FRAME))
    assert pair.client.statistics()["pending"] == 0
    assert not pair.client.closed


async def test_serve_refuses_a_second_reader(connect, serve_channel, nursery):
    pair = await connect()
    served = await serve_channel(nursery, pair.server)
    with pytest.raises(RuntimeError, match="one reader per connection"):
        await pair.server.serve(served.handle, served.on_event)


# -- closing and cancellation ----------------------------------------------------------------


async def test_peer_disconnect_rejects_every_pending_request(connect, serve_channel, nursery):
    started = []
    both_started = trio.Event()

    async def stall(envelope):
        # Close only once the server read both: unread data would turn EOF into a reset.
        started.append(envelope.type)
        if len(started) == 2:
            both_started.set()
        await trio.sleep_forever()

    pair = await connect()
    await serve_channel(nursery, pair.server, stall)
    client = await serve_channel(nursery, pair.client)
    errors = []

    async def ask(message, timeout):
        with pytest.raises(ChannelClosed) as caught:
            await pair.client.request(message, timeout=timeout)
        errors.append(str(caught.value))

    with trio.fail_after(10):
        async with trio.open_nursery() as waiting:
            waiting.start_soon(ask, ipc.Question(text="?"), None)
            waiting.start_soon(ask, ipc.Prompt(text="x", turn=1), 60)
            await both_started.wait()
            await pair.server.aclose("test hangs up")
        await client.wait_finished()
    assert sorted(errors) == [
        "prompt request to a1 rejected: peer closed",
        "question request to a1 rejected: peer closed",
    ]
    assert pair.client.statistics()["pending"] == 0
    assert pair.client.close_reason == "peer closed"


async def stall(envelope):
    await trio.sleep_forever()


async def test_close_rejects_pending_and_refuses_new_requests(connect, serve_channel, nursery):
    arrived = trio.Event()

    async def hold(envelope):
        arrived.set()
        await trio.sleep_forever()

    pair = await connect()
    await serve_channel(nursery, pair.server, hold)
    client = await serve_channel(nursery, pair.client)

    async def close_soon():
        await arrived.wait()
        pair.client.close("owner reaped")

    with trio.fail_after(10):
        nursery.start_soon(close_soon)
        with pytest.raises(ChannelClosed, match="spawn request to a1 rejected: owner reaped"):
            await pair.client.request(ipc.Spawn(agent="scout", task="t"), timeout=None)
        await client.wait_finished()
        with pytest.raises(ChannelClosed, match=r"is closed \(owner reaped\)"):
            await pair.client.request(ipc.Abort())
    assert pair.client.statistics() == {
        "drops": {},
        "pending": 0,
        "flagged": False,
        "closed": True,
    }


async def test_a_cancelled_requester_leaves_no_pending_entry(connect, serve_channel, nursery):
    pair = await connect()
    await serve_channel(nursery, pair.server, stall)
    await serve_channel(nursery, pair.client)
    with trio.fail_after(10):
        with trio.move_on_after(0.05) as scope:
            await pair.client.request(ipc.Question(text="?"), timeout=None)
    assert scope.cancelled_caught
    assert pair.client.statistics()["pending"] == 0
    assert not pair.client.closed


async def test_a_late_response_after_a_timeout_is_not_a_drop(connect, serve_channel, nursery):
    answered = trio.Event()

    async def slow(envelope):
        if isinstance(envelope.body, ipc.Prompt):
            await trio.sleep(0.3)
            answered.set()
        return Reply(ok=True)

    pair = await connect()
    await serve_channel(nursery, pair.server, slow)
    await serve_channel(nursery, pair.client)
    with trio.fail_after(10):
        with pytest.raises(
            RequestTimeout, match=r"prompt request to a1 got no response within 0\.05 s"
        ):
            await pair.client.request(ipc.Prompt(text="x", turn=1), timeout=0.05)
        await answered.wait()
        # Frames arrive in order: once this round trip is back, the late reply was handled.
        assert await pair.client.request(ipc.Abort()) == Reply(ok=True)
    assert pair.client.drops == collections.Counter()
    assert not pair.client.closed


async def test_cancelling_a_send_mid_frame_closes_the_channel():
    left, right = trio.socket.socketpair()
    channel = ipc.Channel(stream=trio.SocketStream(left), owner="a1", token="t" * 64)
    peer = trio.SocketStream(right)
    with trio.fail_after(10):
        # Nobody reads the peer, so a near-limit frame cannot fit the socket buffer.
        with trio.move_on_after(0.2) as scope:
            await channel.send_event(ipc.Event(activity="status", text="x" * 900_000))
        assert scope.cancelled_caught
        assert channel.closed
        assert channel.close_reason == "send cancelled mid-frame"
        with pytest.raises(ChannelClosed):
            await channel.send_event(ipc.Event(activity="status", text="after"))
        # What did get out is a torn frame: exactly why the stream must not be reused.
        decoder = ipc.FrameDecoder()
        assert decoder.feed(await peer.receive_some()) == []
        assert decoder.buffered > 0
    await channel.aclose()
    await peer.aclose()


async def test_a_send_cancelled_before_writing_keeps_the_channel():
    left, right = trio.testing.memory_stream_pair()
    channel = ipc.Channel(stream=left, owner="a1", token="t" * 64)
    with trio.CancelScope() as scope:
        scope.cancel()
        await channel.send_event(ipc.Event(activity="status", text="never"))
    assert not channel.closed
    await channel.send_event(ipc.Event(activity="status", text="sent"))
    (frame,) = ipc.FrameDecoder().feed(await right.receive_some())
    assert ipc.decode_envelope(frame).body == ipc.Event(activity="status", text="sent")


# -- drops on an authenticated channel -------------------------------------------------------


def bad_frames(wire):
    return {
        "json": len(b"{not json").to_bytes(4, "big") + b"{not json",
        "schema": wire.raw_frame(wire.envelope("prompt", {"text": "missing turn"})),
        "type": wire.raw_frame(wire.envelope("format_disk", {})),
        "type-response-as-request": wire.frame(Reply(ok=True), kind="request"),
        "token": wire.frame(ipc.Steer(text="x"), token="0" * 64),
        "token-last-char": wire.frame(ipc.Steer(text="x"), token=near_miss(wire.token())),
        "owner": wire.frame(ipc.Steer(text="x"), owner="a2", token=wire.token("a1")),
        "corr": wire.frame(Reply(ok=True), kind="response", corr="999"),
    }


def near_miss(token):
    """*token* with only its last character changed."""
    return token[:-1] + ("0" if token[-1] != "0" else "1")


REASONS = {
    "json": "json",
    "schema": "schema",
    "type": "type",
    "type-response-as-request": "type",
    "token": "token",
    "token-last-char": "token",
    "owner": "owner",
    "corr": "corr",
}


@pytest.mark.parametrize("case", list(REASONS))
async def test_each_invalid_frame_is_dropped_and_counted(case, raw_session, wire, nursery):
    session = await raw_session(nursery)
    frame = bad_frames(wire)[case]
    with trio.fail_after(10):
        await session.stream.send_all(frame)
        await session.sync()
        assert session.server.drops == collections.Counter({REASONS[case]: 1})
        assert session.served.requests == []
        assert not session.server.closed
        # The peer is never told why: after EOF the server sends nothing, then closes too.
        await session.stream.send_eof()
        assert await session.reader.rest() == b""


async def test_an_event_of_a_response_type_is_a_type_drop(raw_session, wire, nursery):
    session = await raw_session(nursery)
    with trio.fail_after(10):
        await session.stream.send_all(wire.frame(Reply(ok=True), kind="event", corr=""))
        await session.sync()
    assert session.server.drops == collections.Counter({"type": 1})


async def test_a_second_response_to_one_request_is_a_corr_drop(raw_session, wire, nursery):
    session = await raw_session(nursery)
    result = []

    async def ask():
        result.append(await session.server.request(ipc.Prompt(text="x", turn=1)))

    with trio.fail_after(10):
        nursery.start_soon(ask)
        request = await session.reader.next()
        answer = wire.frame(Reply(ok=True), kind="response", corr=request.corr)
        await session.stream.send_all(answer + answer)
        await session.sync()
    assert result == [Reply(ok=True)]
    assert session.server.drops == collections.Counter({"corr": 1})


async def test_sixteen_drops_close_and_flag_the_channel(raw_session, wire, nursery):
    session = await raw_session(nursery)
    frames = list(bad_frames(wire).values())
    with trio.fail_after(10):
        for index in range(ipc.MAX_DROPS - 1):
            await session.stream.send_all(frames[index % len(frames)])
        await session.sync()
        assert sum(session.server.drops.values()) == ipc.MAX_DROPS - 1
        assert not session.server.flagged
        assert not session.server.closed
        # The 16th drop closes; a valid request right behind it is never handled.
        await session.stream.send_all(frames[0] + wire.frame(ipc.Steer(text="late"), corr="5"))
        await session.served.wait_finished()
        assert await session.reader.rest() == b""
    assert session.server.flagged
    assert session.server.closed
    assert session.server.close_reason == "16 invalid frames"
    assert session.served.requests == []
    assert ipc.MAX_DROPS == 16


@pytest.mark.parametrize(
    "header",
    [b"\x00\x00\x00\x00", (ipc.MAX_FRAME + 1).to_bytes(4, "big")],
    ids=["zero", "oversize"],
)
async def test_a_framing_error_closes_the_connection_at_once(header, raw_session, wire, nursery):
    session = await raw_session(nursery)
    with trio.fail_after(10):
        await session.stream.send_all(header + wire.event("never"))
        await session.served.wait_finished()
        assert await session.reader.rest() == b""
    assert session.server.closed
    assert session.server.flagged
    assert session.server.close_reason == "framing error"
    assert session.served.events_so_far() == []


# -- replay ------------------------------------------------------------------------------------


async def test_a_replayed_request_returns_the_recorded_response(raw_session, wire, nursery):
    session = await raw_session(nursery)
    request = wire.frame(ipc.Ownership(paths=["a"]), corr="7")
    with trio.fail_after(10):
        await session.stream.send_all(request)
        first = await session.reader.next_raw()
        await session.stream.send_all(request)
        second = await session.reader.next_raw()
    assert first == second
    assert ipc.decode_envelope(first).body == Reply(ok=True, data={"type": "ownership", "n": 1})
    assert len(session.served.requests) == 1


async def test_a_replay_while_the_first_still_runs_yields_one_response(raw_session, wire, nursery):
    started = trio.Event()
    release = trio.Event()
    calls = []

    async def gated(envelope):
        calls.append(envelope.corr)
        started.set()
        await release.wait()
        return Reply(ok=True, data={"corr": envelope.corr})

    session = await raw_session(nursery, gated)
    request = wire.frame(ipc.Ownership(paths=["a"]), corr="7")
    with trio.fail_after(10):
        await session.stream.send_all(request)
        await started.wait()
        await session.stream.send_all(request)
        await session.sync()  # the duplicate has been seen
        release.set()
        await session.stream.send_all(wire.frame(ipc.Abort(), corr="8"))
        answers = [(await session.reader.next()).corr for _ in range(2)]
        await session.stream.send_eof()
        assert await session.reader.rest() == b""
    assert answers == ["7", "8"]
    assert calls == ["7", "8"]


async def test_the_replay_cache_is_bounded(raw_session, wire, nursery):
    session = await raw_session(nursery)
    limit = ipc._requests.REPLAY_CACHE
    with trio.fail_after(30):
        for corr in range(limit + 1):
            await session.stream.send_all(wire.frame(ipc.Abort(), corr=str(corr)))
            await session.reader.next()
        # corr "0" fell out of the cache, so it runs again; the newest is still remembered.
        await session.stream.send_all(wire.frame(ipc.Abort(), corr=str(limit)))
        await session.reader.next()
        assert len(session.served.requests) == limit + 1
        await session.stream.send_all(wire.frame(ipc.Abort(), corr="0"))
        await session.reader.next()
    assert len(session.served.requests) == limit + 2
