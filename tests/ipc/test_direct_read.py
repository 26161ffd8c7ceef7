"""A requester that asks again at once reads its own response: no hand-off from the reader.

The serving channel here asks a hand-driven peer (the raw session's client socket), over a
Unix socket and over TLS on TCP (the door). Its first request is answered through the
reader; every request that follows at once is read by the requesting task itself
(``Channel.direct_reads``), with the same routing, deadline, ordering and close rules.
"""

import collections
import os

import pytest
import trio

import ipc
from ipc import ChannelClosed, Reply, RequestTimeout

PROMPT = ipc.Prompt(text="go", turn=1)
CEILING = 10


@pytest.fixture(params=["unix", "tls"])
def raw_session(request):
    """Each test over a Unix socket and over the TLS door's stream."""
    return request.getfixturevalue("raw_session" if request.param == "unix" else "raw_tls_session")


async def answer(session, count: int) -> None:
    """The peer answers *count* requests, each as it comes."""
    for _ in range(count):
        envelope = await session.reader.next()
        await session.stream.send_all(
            session.wire.frame(Reply(ok=True), kind="response", corr=envelope.corr)
        )


async def test_requests_back_to_back_are_read_by_the_requester(raw_session, nursery):
    session = await raw_session(nursery)
    nursery.start_soon(answer, session, 30)
    with trio.fail_after(CEILING):
        for _ in range(30):
            assert await session.server.request(PROMPT) == Reply(ok=True)
    # The first goes through the reader; it lends the socket for the ones that follow.
    assert session.server.direct_reads >= 25
    assert session.server.drops == collections.Counter()


async def test_a_direct_read_keeps_its_deadline_and_a_late_answer_is_no_drop(raw_session, nursery):
    session = await raw_session(nursery)
    server = session.server
    with trio.fail_after(CEILING):
        nursery.start_soon(answer, session, 1)
        await server.request(PROMPT)
        with pytest.raises(RequestTimeout):
            await server.request(PROMPT, timeout=0.2)  # read, never answered
        assert server.direct_reads == 1
        assert not server.closed
        late = await session.reader.next()
        await session.stream.send_all(
            session.wire.frame(Reply(ok=True), kind="response", corr=late.corr)
        )
        await session.sync()
        assert server.drops == collections.Counter()
        nursery.start_soon(answer, session, 1)
        assert await server.request(PROMPT) == Reply(ok=True)


async def test_what_comes_before_the_response_is_handled_first_in_order(raw_session, nursery):
    session = await raw_session(nursery)
    server, wire = session.server, session.wire
    with trio.fail_after(CEILING):
        nursery.start_soon(answer, session, 1)
        await server.request(PROMPT)

        async def peer() -> None:
            envelope = await session.reader.next()
            # One chunk: an event, a request of the peer's, another event, then the response.
            await session.stream.send_all(
                wire.event("e1")
                + wire.frame(ipc.Ownership(paths=["a"]), corr="p1")
                + wire.event("e2")
                + wire.frame(Reply(ok=True), kind="response", corr=envelope.corr)
            )

        nursery.start_soon(peer)
        assert await server.request(PROMPT) == Reply(ok=True)
        assert server.direct_reads == 1
        # The reader handled both events before it delivered the response.
        assert [event.body.text for event in session.served.events_so_far()] == ["e1", "e2"]
        # The peer's request went to the handler (which runs in a task of its own).
        response = await session.reader.next()
        assert (response.kind, response.corr) == ("response", "p1")
        assert [request.corr for request in session.served.requests] == ["p1"]
        nursery.start_soon(answer, session, 1)
        assert await server.request(PROMPT) == Reply(ok=True)
    assert server.drops == collections.Counter()


async def test_a_cancelled_direct_read_gives_the_socket_back(raw_session, nursery):
    session = await raw_session(nursery)
    server = session.server
    with trio.fail_after(CEILING):
        nursery.start_soon(answer, session, 1)
        await server.request(PROMPT)
        with trio.move_on_after(0.1) as scope:
            await server.request(PROMPT)  # read, never answered
        assert scope.cancelled_caught
        assert server.direct_reads == 1
        assert server.statistics()["pending"] == 0
        await session.reader.next()  # the abandoned request
        # The reader reads again: an event is handled, a new request answered.
        await session.sync("after")
        nursery.start_soon(answer, session, 1)
        assert await server.request(PROMPT) == Reply(ok=True)
    assert server.drops == collections.Counter()


async def test_the_peer_closing_during_a_direct_read_rejects_the_request(raw_session, nursery):
    session = await raw_session(nursery)
    server = session.server
    with trio.fail_after(CEILING):
        nursery.start_soon(answer, session, 1)
        await server.request(PROMPT)

        async def hang_up() -> None:
            await session.reader.next()
            await session.stream.aclose()

        nursery.start_soon(hang_up)
        with pytest.raises(ChannelClosed):
            await server.request(PROMPT)
        assert server.direct_reads == 1
        await session.served.wait_finished()
    assert server.closed
    assert server.close_reason == "peer closed"


async def test_a_framing_error_during_a_direct_read_flags_the_channel(raw_session, nursery):
    session = await raw_session(nursery)
    server = session.server
    with trio.fail_after(CEILING):
        nursery.start_soon(answer, session, 1)
        await server.request(PROMPT)

        async def break_framing() -> None:
            await session.reader.next()
            await session.stream.send_all(b"\x00\x00\x00\x00")  # a zero-length frame

        nursery.start_soon(break_framing)
        with pytest.raises(ChannelClosed):
            await server.request(PROMPT)
        assert server.direct_reads == 1
        await session.served.wait_finished()
    assert server.flagged
    assert server.close_reason == "framing error"


async def test_closing_the_channel_wakes_a_direct_read_and_releases_its_descriptor(
    raw_session, nursery
):
    session = await raw_session(nursery)
    server = session.server
    with trio.fail_after(CEILING):
        nursery.start_soon(answer, session, 1)
        await server.request(PROMPT)
        lent_fds: list[int] = []

        async def close_while_read() -> None:
            await session.reader.next()  # asked, and now read by the requester itself
            lent_fds.append(server._io.lender.duplicate)
            server.close("test closes")

        nursery.start_soon(close_while_read)
        with pytest.raises(ChannelClosed, match="test closes"):
            await server.request(PROMPT)
        await session.served.wait_finished()
    assert server.direct_reads == 1
    assert lent_fds[0] is not None
    assert server._io.lender.duplicate is None
    with pytest.raises(OSError):  # the duplicate descriptor was closed, not leaked
        os.fstat(lent_fds[0])
