"""A channel over a stream of a node link (``ipc._transport.MuxIO``): writes that go out at
once, frames the link's reader routes for the channel, over real sockets and real TLS."""

import collections
import logging
import os
import select

import pytest
import trio
import trio.testing

import ipc
from ipc import MuxLink, MuxStream
from ipc._dispatch import Dispatch
from ipc._mux import MAX_CHUNK
from ipc._tlsstream import TLSIO
from ipc._transport import MuxIO, transport_for
from tests.fakes._streams import linked, rng
from tests.fakes._tls import tls_pair
from tests.ipc.conftest import Served

CEILING = 20
OWNER = "a1"


def door(wire, serve_channel, nursery, served: dict[str, Served], **handlers):
    """An acceptor's on_open: hello, then a served channel kept in *served* by stream name."""

    async def on_open(stream: MuxStream) -> None:
        server, hello = await ipc.accept_hello(stream, wire.lookup, peer_checked=True)
        await server.reply(hello.corr, ipc.Reply(ok=True))
        served[stream.name] = await serve_channel(nursery, server, **handlers)
        await served[stream.name].finished.wait()

    return on_open


async def client(wire, opener: MuxLink, name: str, owner: str = OWNER) -> ipc.Channel:
    wire.owners.add(owner)
    channel, reply = await ipc.hello_on(
        opener.open(name), owner=owner, token=wire.token(owner), hello=ipc.Hello(pid=os.getpid())
    )
    assert reply.ok
    return channel


async def until(condition) -> None:
    with trio.fail_after(CEILING):
        while not condition():  # noqa: ASYNC110 - a sleeping poll reads best in a test
            await trio.sleep(0.01)


async def nothing(envelope: ipc.Envelope) -> ipc.Message:
    return ipc.Reply(ok=False, error="nothing here")


async def ignore(envelope: ipc.Envelope) -> None:
    return None


# -- writing -------------------------------------------------------------------------------


async def test_a_mux_stream_gets_the_link_transport_and_a_write_within_credit_never_yields(
    nursery,
):
    received = []

    async def on_open(stream: MuxStream) -> None:
        while data := await stream.receive_some():
            received.append(data)

    opener, _ = await linked(nursery, on_open, window=1024)
    io = transport_for(opener.open("s"))
    assert isinstance(io, MuxIO)
    with trio.testing.assert_no_checkpoints():
        assert io.try_send(b"") == 0  # no frame at all: an empty DATA breaks the link
        assert io.try_send(b"a" * 1000) == 1000
        assert io.try_send(b"b" * 100) == 24  # the rest of the window's credit, no more
        assert io.try_send(b"c") == 0
    with trio.fail_after(CEILING):
        await io.send_rest(b"b" * 100, 24)  # once the peer reads, its credit comes back
        await until(lambda: sum(map(len, received)) >= 1100)
    assert b"".join(received) == b"a" * 1000 + b"b" * 100


async def test_over_tls_a_frame_goes_on_the_wire_at_once_when_the_writer_is_idle(tmp_path, nursery):
    near, far = await tls_pair(tmp_path, nursery)
    link = MuxLink(near, opener=True)
    await nursery.start(link.run)
    await trio.sleep(0.05)  # the writer parks with nothing queued
    stream = link.open("s")  # its OPEN goes out at once too
    with trio.testing.assert_no_checkpoints():
        assert stream.try_send(b"hello") == 5
    # No task ran since: the bytes can only be on the wire if the write itself put them there.
    wanted = 9 + 1 + 9 + 5  # OPEN "s", then DATA "hello"
    got = b""
    while len(got) < wanted:
        assert select.select([far.socket], [], [], CEILING)[0], "nothing on the wire"
        got += far.socket.recv(65536)
    assert got.endswith(b"hello")
    await far.aclose()


async def test_over_tls_frames_stay_whole_when_the_socket_fills_mid_write(
    tmp_path, nursery, monkeypatch
):
    """A write OpenSSL could not finish (the socket full) must go out again with the same
    bytes: frames from many streams, direct writes and the writer's batches, arrive whole and
    in order per stream."""
    unfinished: dict[int, bytes] = {}  # a TLSIO's write that OpenSSL did not finish
    retried = []
    try_send = TLSIO.try_send

    def checked(self, data):
        if id(self) in unfinished:  # OpenSSL's rule: the very same bytes, no more, no less
            assert bytes(data) == unfinished.pop(id(self)), "a started write retried otherwise"
            retried.append(len(data))
        sent = try_send(self, data)
        if not sent:
            unfinished[id(self)] = bytes(data)
        return sent

    monkeypatch.setattr(TLSIO, "try_send", checked)
    payloads = {f"s{n}": rng(n).randbytes(3 * 1024 * 1024 + n) for n in range(6)}
    received: dict[str, bytearray] = {name: bytearray() for name in payloads}
    reading = trio.Event()

    async def on_open(stream: MuxStream) -> None:
        await reading.wait()
        while data := await stream.receive_some():
            received[stream.name] += data

    opener, _ = await linked(nursery, on_open, await tls_pair(tmp_path, nursery))

    async def send(name: str, data: bytes) -> None:
        stream = opener.open(name)
        sizes = rng(name)
        view = memoryview(data)
        while view:
            size = sizes.choice([1, 100, 5000, MAX_CHUNK, 200_000])
            sent = stream.try_send(view[:size])  # what fits now, else the rest waits
            if sent < len(view[:size]):
                await stream.send_all(view[sent:size])
            view = view[size:]
            await trio.lowlevel.checkpoint()
        await stream.aclose()

    with trio.fail_after(CEILING * 3):
        async with trio.open_nursery() as senders:
            for name, data in payloads.items():
                senders.start_soon(send, name, data)
            await trio.sleep(0.5)  # the peer reads nothing yet: the socket fills
            reading.set()
        await until(lambda: all(len(received[name]) == len(payloads[name]) for name in payloads))
    assert retried, "the socket never filled: the test proves nothing"
    for name, data in payloads.items():
        assert received[name] == data, name


# -- reading: the link's reader routes for the channel --------------------------------------


async def test_events_stay_in_order_when_their_handler_makes_the_reader_take_over(
    wire, serve_channel, nursery
):
    """An event the reader must await hands the rest of the bytes to the channel's own
    reader; later frames, carried inline or buffered meanwhile, never overtake it."""
    seen: list[str] = []

    async def on_event(envelope: ipc.Envelope) -> None:
        if len(seen) % 7 == 0:
            await trio.sleep(0.001)  # the reader awaits: the link's reader cannot
        seen.append(envelope.body.text)  # type: ignore[union-attr]

    served: dict[str, Served] = {}
    opener, _ = await linked(nursery, door(wire, serve_channel, nursery, served, on_event=on_event))
    channel = await client(wire, opener, "child")
    nursery.start_soon(channel.serve, nothing, ignore)
    with trio.fail_after(CEILING):
        for n in range(300):
            await channel.send_event(ipc.Event(activity="status", text=f"e{n}"))
            if n % 50 == 49:
                assert await channel.request(ipc.Ownership(paths=["a"]))
        await until(lambda: len(seen) == 300)
    assert seen == [f"e{n}" for n in range(300)]
    assert len(served["child"].requests) == 6


class Steps(trio.abc.Instrument):
    """Counts each task's steps."""

    def __init__(self) -> None:
        self.counts: collections.Counter[trio.lowlevel.Task] = collections.Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.counts[task] += 1


def immediate_door(wire, nursery, readers: list[trio.lowlevel.Task], size: int = 0):
    """An acceptor's on_open that serves its channel on the stream's own task, answering
    ``ownership`` on the reader (as the supervisor does) with *size* bytes of data."""

    def immediate(body: ipc.Message) -> ipc.Message | None:
        if isinstance(body, ipc.Ownership):
            return ipc.Reply(ok=True, data={"paths": body.paths, "pad": "p" * size})
        return None

    async def on_open(stream: MuxStream) -> None:
        server, hello = await ipc.accept_hello(stream, wire.lookup, peer_checked=True)
        await server.reply(hello.corr, ipc.Reply(ok=True))
        readers.append(trio.lowlevel.current_task())
        await server.serve(nothing, ignore, immediate=immediate)

    return on_open


async def paths_answered(channel: ipc.Channel, paths: list[str]) -> object:
    """The paths an ``ownership`` request for *paths* was answered with."""
    reply = await channel.request(ipc.Ownership(paths=paths))
    assert isinstance(reply, ipc.Reply)
    return reply.data["paths"]


async def test_an_immediate_answer_goes_out_on_the_links_reader_without_waking_the_channels(
    wire, nursery
):
    """The supervisor answers ``ownership``, ``renew`` and a builtin child's tool events on
    the reader; over a link, the link's reader writes that answer itself."""
    readers: list[trio.lowlevel.Task] = []
    opener, _ = await linked(nursery, immediate_door(wire, nursery, readers))
    channel = await client(wire, opener, "child")
    nursery.start_soon(channel.serve, nothing, ignore)
    assert await paths_answered(channel, ["warm"]) == ["warm"]
    steps = Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        with trio.fail_after(CEILING):
            for n in range(100):
                assert await paths_answered(channel, [f"p{n}"]) == [f"p{n}"]
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert steps.counts[readers[0]] <= 2, "the served channel's reader woke for its answers"


async def test_an_immediate_answer_beyond_the_streams_credit_is_finished_by_the_reader_in_order(
    wire, nursery
):
    """Answers larger than the stream's window: what the credit takes goes out at once, the
    rest is the channel's reader's to finish, and concurrent requests each get their own."""
    readers: list[trio.lowlevel.Task] = []
    opener, _ = await linked(
        nursery, immediate_door(wire, nursery, readers, size=3000), window=1024
    )
    channel = await client(wire, opener, "child")
    nursery.start_soon(channel.serve, nothing, ignore)
    answers: dict[int, object] = {}

    async def ask(n: int) -> None:
        answers[n] = await paths_answered(channel, [f"p{n}"])

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as asking:
            for n in range(40):
                asking.start_soon(ask, n)
    assert answers == {n: [f"p{n}"] for n in range(40)}
    assert not channel.closed


async def test_a_framing_error_closes_that_channel_and_spares_the_link(
    wire, serve_channel, nursery
):
    served: dict[str, Served] = {}
    opener, _ = await linked(nursery, door(wire, serve_channel, nursery, served))
    sibling = await client(wire, opener, "sibling", owner="a2")
    nursery.start_soon(sibling.serve, nothing, ignore)
    hostile = opener.open("hostile")
    await hostile.send_all(wire.frame(ipc.Hello(pid=os.getpid()), corr="0"))
    assert await hostile.receive_some()  # the hello's reply: the server channel serves now
    with trio.fail_after(CEILING):
        await until(lambda: "hostile" in served)
        await hostile.send_all(b"\xff\xff\xff\xff garbage")  # a length past any frame
        await served["hostile"].wait_finished()
        assert await hostile.receive_some() == b""  # its stream is closed, its link is not
        assert await sibling.request(ipc.Ownership(paths=["a"]))
    assert served["hostile"].channel.flagged
    assert served["hostile"].channel.close_reason == "framing error"


async def test_invalid_frames_are_dropped_and_counted_as_on_a_socket(wire, serve_channel, nursery):
    served: dict[str, Served] = {}
    opener, _ = await linked(nursery, door(wire, serve_channel, nursery, served))
    hostile = opener.open("hostile")
    await hostile.send_all(wire.frame(ipc.Hello(pid=os.getpid()), corr="0"))
    assert await hostile.receive_some()
    forged = wire.frame(ipc.Ownership(paths=["a"]), token="0" * 64)
    with trio.fail_after(CEILING):
        for _ in range(ipc.MAX_DROPS):
            await hostile.send_all(forged)
        await until(lambda: "hostile" in served)
        await served["hostile"].wait_finished()
    channel = served["hostile"].channel
    assert channel.drops == {"token": ipc.MAX_DROPS}
    assert channel.flagged
    assert served["hostile"].requests == []


async def test_a_failure_while_routing_closes_only_that_channel(
    wire, serve_channel, nursery, monkeypatch, caplog
):
    route = Dispatch.route

    def failing(self, frame):
        if self.channel.owner == "a1" and b"boom" in frame:
            raise RuntimeError("a bug in routing")
        return route(self, frame)

    monkeypatch.setattr(Dispatch, "route", failing)
    served: dict[str, Served] = {}
    opener, acceptor = await linked(nursery, door(wire, serve_channel, nursery, served))
    victim = await client(wire, opener, "victim")
    sibling = await client(wire, opener, "sibling", owner="a2")
    for channel in (victim, sibling):
        nursery.start_soon(channel.serve, nothing, ignore)
    with trio.fail_after(CEILING), caplog.at_level(logging.ERROR, logger="ipc"):
        assert await victim.request(ipc.Ownership(paths=["a"]))
        with pytest.raises(ipc.ChannelClosed):
            await victim.request(ipc.Steer(text="boom"))
        assert await sibling.request(ipc.Steer(text="boom"))  # not a1's: routed as ever
    assert served["victim"].channel.close_reason == "routing failed"
    assert "routing a frame from a1 failed" in caplog.text
    assert acceptor.open_streams == 1
