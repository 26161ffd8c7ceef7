"""Many streams over one link (``ipc._mux``): real socket pairs, honest and hostile peers."""

import os
import struct

import pytest
import trio

import ipc
from ipc import MuxError, MuxLink, MuxStream
from ipc._mux import CLOSE, CREDIT, DATA, MAX_CHUNK, OPEN
from tests.fakes._streams import linked, receive_exactly, rng, socket_pair

CEILING = 20
HEADER = struct.Struct(">IBI")


def frame(stream_id: int, kind: int, payload: bytes = b"") -> bytes:
    """A frame as a hand-written peer would send it (no checks)."""
    return HEADER.pack(stream_id, kind, len(payload)) + payload


def credit(stream_id: int, increment: int) -> bytes:
    return frame(stream_id, CREDIT, struct.pack(">I", increment))


def parse(data: bytes) -> list[tuple[int, int, bytes]]:
    """Every frame in *data*, which must hold whole frames only."""
    frames, start = [], 0
    while start < len(data):
        stream_id, kind, length = HEADER.unpack_from(data, start)
        start += HEADER.size
        frames.append((stream_id, kind, data[start : start + length]))
        start += length
    assert start == len(data)
    return frames


class Recording(trio.abc.Stream):
    """A stream that keeps a copy of everything sent through it."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.sent = bytearray()

    async def send_all(self, data):
        self.sent += data
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self):
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None):
        return await self.inner.receive_some(max_bytes)

    async def aclose(self):
        await self.inner.aclose()


async def echo(stream: MuxStream) -> None:
    while data := await stream.receive_some():
        await stream.send_all(data)


async def receive_all(stream: trio.abc.ReceiveStream) -> bytes:
    got = bytearray()
    while chunk := await stream.receive_some():
        got += chunk
    return bytes(got)


async def until_broken(stream: MuxStream) -> None:
    with pytest.raises(trio.BrokenResourceError):
        await receive_all(stream)


async def round_trip(stream: MuxStream, message: bytes) -> None:
    await stream.send_all(message)
    assert await receive_exactly(stream, len(message)) == message


# -- honest peers ---------------------------------------------------------------------------


async def test_fifty_streams_each_get_exactly_their_own_bytes_back(nursery):
    opener, _ = await linked(nursery, echo)
    sizes = rng(7)
    payloads = {
        f"child-{n}": rng(n).randbytes(200 * 1024 + sizes.randrange(1000)) for n in range(50)
    }
    streams = {name: opener.open(name) for name in payloads}
    assert opener.open_streams == 50
    got: dict[str, bytes] = {}

    async def send(name: str) -> None:
        data, start, chunks = payloads[name], 0, rng(name)
        while start < len(data):
            size = chunks.choice([1, 7, 100, 4096, 65535, 65536, 65537, 150_000])
            await streams[name].send_all(data[start : start + size])
            start += size

    async def converse(name: str) -> None:
        async with trio.open_nursery() as both:
            both.start_soon(send, name)
            got[name] = await receive_exactly(streams[name], len(payloads[name]))
        await streams[name].aclose()

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as all_of_them:
            for name in payloads:
                all_of_them.start_soon(converse, name)
    assert got == payloads
    assert opener.open_streams == 0


async def test_a_stalled_reader_holds_one_window_and_never_blocks_its_siblings(nursery):
    window = 64 * 1024
    drain = trio.Event()
    at_acceptor: dict[str, MuxStream] = {}
    drained: list[bytes] = []
    done = trio.Event()

    async def on_open(stream: MuxStream) -> None:
        at_acceptor[stream.name] = stream
        if stream.name == "stalled":
            await drain.wait()
            drained.append(await receive_all(stream))
            done.set()
        else:
            await echo(stream)

    opener, _ = await linked(nursery, on_open, window=window)
    stalled, lively = opener.open("stalled"), opener.open("lively")
    payload = rng(1).randbytes(3 * window + 123)
    pushed = trio.Event()

    async def push() -> None:
        await stalled.send_all(payload)
        pushed.set()
        await stalled.aclose()

    with trio.fail_after(CEILING):
        nursery.start_soon(push)
        for n in range(50):
            await round_trip(lively, b"ping %d " % n * 40)
        assert not pushed.is_set()  # its send waits for credit...
        assert len(at_acceptor["stalled"]._buffer) == window  # ...with exactly a window buffered
        assert stalled._credit == 0
        drain.set()
        await pushed.wait()
        await done.wait()
    assert drained == [payload]


async def test_a_short_exchange_sends_no_credit_and_a_long_one_few(nursery):
    recorded: list[Recording] = []

    def wrap(stream: trio.abc.Stream) -> Recording:
        recorded.append(Recording(stream))
        return recorded[-1]

    opener, _ = await linked(nursery, echo, wrap=wrap)
    short, long_ = opener.open("short"), opener.open("long")
    with trio.fail_after(CEILING):
        for n in range(5):
            await round_trip(short, bytes([n]) * 100)
        await trio.sleep(0.05)  # anything the acceptor would still write
        kinds = [kind for end in recorded for _, kind, _ in parse(bytes(end.sent))]
        assert kinds.count(DATA) == 10
        assert kinds.count(CREDIT) == 0

        payload = rng(2).randbytes(1 << 20)
        async with trio.open_nursery() as both:
            both.start_soon(long_.send_all, payload)
            got = bytearray()
            while len(got) < len(payload):
                got += await long_.receive_some(1000)  # a thousand small reads
        assert got == payload
    kinds = [kind for end in recorded for _, kind, _ in parse(bytes(end.sent))]
    # 1 MiB each way, a grant per quarter window (64 KiB) consumed: 16 each way at most.
    assert 8 <= kinds.count(CREDIT) <= 32


async def test_max_streams_refuses_the_one_beyond_without_calling_on_open(nursery):
    release = trio.Event()
    called: list[str] = []
    again_called = trio.Event()

    async def on_open(stream: MuxStream) -> None:
        called.append(stream.name)
        if stream.name == "again":
            again_called.set()
        await release.wait()

    opener, acceptor = await linked(nursery, on_open, max_streams=3)
    streams = [opener.open(f"s{n}") for n in range(4)]
    with trio.fail_after(CEILING):
        assert await streams[3].receive_some() == b""  # CLOSE: too many streams
        with pytest.raises(trio.BrokenResourceError, match="too many streams"):
            await streams[3].send_all(b"x")
        assert sorted(called) == ["s0", "s1", "s2"]
        assert acceptor.open_streams == 3
        release.set()  # their on_open returns: each is closed, making room
        for stream in streams[:3]:
            assert await stream.receive_some() == b""
        again = opener.open("again")
        await again.send_all(b"hi")
        await again_called.wait()
    assert sorted(called) == ["again", "s0", "s1", "s2"]


async def test_the_peers_close_gives_the_rest_then_eof_and_an_own_close_refuses_use(nursery):
    last_words = rng(3).randbytes(100_000)

    async def on_open(stream: MuxStream) -> None:
        await stream.send_all(last_words)
        await stream.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await stream.send_all(b"x")

    opener, _ = await linked(nursery, on_open)
    stream = opener.open("one")
    with trio.fail_after(CEILING):
        await stream.wait_send_all_might_not_block()  # the credit is there at once
        assert await receive_all(stream) == last_words  # all of it, then the CLOSE
        assert opener.open_streams == 0
        assert await stream.receive_some() == b""
        with pytest.raises(trio.BrokenResourceError, match="closed by the peer"):
            await stream.send_all(b"too late")
        await stream.aclose()
        await stream.aclose()  # idempotent
        with pytest.raises(trio.ClosedResourceError):
            await stream.receive_some()
        with pytest.raises(trio.ClosedResourceError):
            await stream.send_all(b"x")
        with pytest.raises(trio.ClosedResourceError):
            await stream.wait_send_all_might_not_block()


async def test_an_own_close_wakes_a_parked_receiver_and_streams_are_trio_streams(nursery):
    opener, _ = await linked(nursery, echo)
    stream = opener.open("one")
    with trio.fail_after(CEILING):
        await stream.send_all(b"abcdef")
        assert await receive_exactly(stream, 2) == b"ab"  # max_bytes is honoured
        assert await stream.receive_some() == b"cdef"
        with pytest.raises(ValueError, match="max_bytes"):
            await stream.receive_some(0)
        async with trio.open_nursery() as inner:

            async def parked() -> None:
                with pytest.raises(trio.ClosedResourceError):
                    await stream.receive_some()

            inner.start_soon(parked)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await stream.receive_some()
            await stream.aclose()
    a, b = socket_pair()
    with pytest.raises(ValueError, match="opener"):
        MuxLink(a, opener=False).open("x")
    await a.aclose()
    await b.aclose()


async def test_cancelled_send_waiting_for_credit_leaves_the_link_whole(nursery):
    window = 32 * 1024
    drain = trio.Event()
    drained: list[bytes] = []
    both_drained = trio.Event()
    failures: list[BaseException] = []

    async def on_open(stream: MuxStream) -> None:
        if stream.name.startswith("stuck"):
            await drain.wait()
            drained.append(await receive_all(stream))
            if len(drained) == 2:
                both_drained.set()
        else:
            await echo(stream)

    async def serve(link: MuxLink, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            await link.run(on_open, task_status=task_status)
        except BaseException as exc:
            failures.append(exc)
            raise

    a, b = socket_pair()
    opener = MuxLink(a, opener=True, window=window)
    await nursery.start(serve, MuxLink(b, opener=False, window=window))
    await nursery.start(opener.run)
    torn, whole, lively = opener.open("stuck-torn"), opener.open("stuck-whole"), opener.open("e")
    with trio.fail_after(CEILING):
        with trio.move_on_after(0.2) as scope:  # half queued, then waits for credit: cancelled
            await torn.send_all(b"t" * (2 * window))
        assert scope.cancelled_caught
        with pytest.raises(trio.BrokenResourceError, match="cancelled halfway"):
            await torn.send_all(b"more")

        await whole.send_all(b"w" * window)  # exactly its credit: queued whole
        with trio.move_on_after(0.2) as scope:  # nothing of it queued when cancelled
            await whole.send_all(b"+")
        assert scope.cancelled_caught

        for n in range(20):
            await round_trip(lively, b"%d" % n * 1000)
        drain.set()
        await whole.send_all(b"+")  # still usable: the credit comes back once drained
        await whole.aclose()
        await torn.aclose()
        await both_drained.wait()
    assert sorted(drained) == sorted([b"t" * window, b"w" * window + b"+"])
    assert failures == []
    await round_trip(lively, b"still here")


async def test_a_channel_runs_over_mux_streams_hello_and_token_included(nursery, wire):
    async def door(stream: MuxStream) -> None:
        server, hello = await ipc.accept_hello(stream, wire.lookup, peer_checked=True)
        await server.reply(hello.corr, ipc.Reply(ok=True))

        async def handle(envelope: ipc.Envelope) -> ipc.Message:
            return ipc.Reply(ok=True, data={"owner": envelope.owner, "stream": stream.name})

        async def on_event(envelope: ipc.Envelope) -> None:
            pass

        await server.serve(handle, on_event)

    opener, _ = await linked(nursery, door)
    with trio.fail_after(CEILING):
        for owner in ("a1", "a2"):
            wire.owners.add(owner)
            client, reply = await ipc.hello_on(
                opener.open(f"child-{owner}"),
                owner=owner,
                token=wire.token(owner),
                hello=ipc.Hello(pid=os.getpid(), backend="test"),
            )
            assert reply.ok
            await nursery.start(client.serve, door, door)  # the client answers nothing here
            answer = await client.request(ipc.Ownership(paths=["a"]))
            assert answer == ipc.Reply(ok=True, data={"owner": owner, "stream": f"child-{owner}"})
            await client.aclose()
        with pytest.raises(ipc.HandshakeError):
            await ipc.hello_on(
                opener.open("impostor"),
                owner="a1",
                token="0" * 64,
                hello=ipc.Hello(pid=os.getpid()),
            )


# -- the link's end -------------------------------------------------------------------------


async def raw_acceptor(window: int = 256 * 1024):
    """An opener link serving one end; the test plays the acceptor on the other."""
    a, raw = socket_pair()
    return MuxLink(a, opener=True, window=window), raw


async def test_a_lost_connection_breaks_every_stream_after_its_buffered_data():
    link, raw = await raw_acceptor()
    one, two = link.open("one"), link.open("two")
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.run)  # returns: the EOF is clean, between frames
            opens = parse(await raw.receive_some())
            assert opens == [(1, OPEN, b"one"), (2, OPEN, b"two")]
            await raw.send_all(frame(1, DATA, b"hello") + frame(2, DATA, b"world"))
            await raw.aclose()
        assert await one.receive_some() == b"hello"
        assert await two.receive_some() == b"world"
        for stream in (one, two):
            with pytest.raises(trio.BrokenResourceError, match="mux link ended"):
                await stream.receive_some()
            with pytest.raises(trio.BrokenResourceError):
                await stream.send_all(b"x")
        with pytest.raises(trio.BrokenResourceError):
            link.open("three")
    assert link.open_streams == 0


async def test_a_link_aclose_breaks_its_streams_and_ends_run(nursery):
    opener, acceptor = await linked(nursery, echo)
    stream = opener.open("one")
    with trio.fail_after(CEILING):
        await round_trip(stream, b"before")
        await acceptor.aclose()
        with pytest.raises(trio.BrokenResourceError):
            await stream.receive_some()
        with pytest.raises(trio.BrokenResourceError):
            await stream.send_all(b"after")


# -- hostile peers --------------------------------------------------------------------------

WINDOW = 1024
ATTACKS = {
    "data beyond credit": frame(2, OPEN, b"a")
    + frame(2, DATA, b"x" * (WINDOW - 1))
    + frame(2, DATA, b"yy"),
    "a 100 MB payload announced": frame(2, OPEN, b"a") + HEADER.pack(2, DATA, 100_000_000),
    "data longer than a chunk": frame(2, OPEN, b"a") + HEADER.pack(2, DATA, MAX_CHUNK + 1),
    "unknown kind": frame(2, OPEN, b"a") + frame(2, 9),
    "reused id": frame(1, OPEN, b"again"),
    "decreasing id": frame(3, OPEN, b"a") + frame(2, OPEN, b"b"),
    "id zero": frame(0, OPEN, b"a"),
    "data for a never-opened id": frame(7, DATA, b"x"),
    "credit for a never-opened id": credit(7, 1),
    "close for a never-opened id": frame(7, CLOSE),
    "credit of zero": frame(2, OPEN, b"a") + credit(2, 0),
    "credit to 2**31": frame(2, OPEN, b"a") + credit(2, (1 << 31) - WINDOW),
    "short credit": frame(2, OPEN, b"a") + frame(2, CREDIT, b"\0\0\1"),
    "empty data": frame(2, OPEN, b"a") + frame(2, DATA),
    "empty name": frame(2, OPEN),
    "oversized name": frame(2, OPEN, b"n" * 257),
    "name not UTF-8": frame(2, OPEN, b"\xff\xfe"),
    "oversized close reason": frame(1, CLOSE, b"r" * 257),
    "eof inside a frame": frame(2, OPEN, b"a") + HEADER.pack(2, DATA, 10) + b"12345",
}


@pytest.mark.parametrize("name", ATTACKS)
async def test_a_violation_ends_the_link_and_breaks_every_other_stream(name):
    attack = ATTACKS[name]
    raw, sock = socket_pair()
    link = MuxLink(sock, opener=False, window=WINDOW)
    victim_opened = trio.Event()
    outcome: dict[str, str] = {}

    async def on_open(stream: MuxStream) -> None:
        if stream.name != "victim":
            return
        victim_opened.set()
        with pytest.raises(trio.BrokenResourceError) as caught:
            await stream.receive_some()
        outcome["receive"] = str(caught.value)
        with pytest.raises(trio.BrokenResourceError):
            await stream.send_all(b"x")
        outcome["send"] = "broken"

    async def attacker() -> None:
        await raw.send_all(frame(1, OPEN, b"victim"))
        await victim_opened.wait()
        await raw.send_all(attack)
        if name == "eof inside a frame":
            await raw.send_eof()  # every other attack keeps its connection open

    with trio.fail_after(5):  # a 100 MB payload is refused from its header, never awaited
        async with trio.open_nursery() as nursery:
            nursery.start_soon(attacker)
            with pytest.raises(MuxError) as caught:
                await link.run(on_open)
        # The link closed its connection (after, at most, closing the stream "a" it served).
        assert {kind for _, kind, _ in parse(await receive_all(raw))} <= {CLOSE}
    assert outcome["send"] == "broken"
    assert str(caught.value) in outcome["receive"]
    if name == "a 100 MB payload announced":
        assert "100000000-byte payload" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert link.open_streams == 0
    await raw.aclose()


@pytest.mark.parametrize(
    "attack",
    [frame(1, OPEN, b"x"), frame(2, DATA, b"x"), credit(5, 1)],
    ids=["open from the acceptor", "data for an id never opened", "credit beyond the last id"],
)
async def test_an_acceptor_cannot_open_or_invent_streams(attack):
    link, raw = await raw_acceptor()
    victim = link.open("victim")
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(raw.send_all, attack)
            with pytest.raises(MuxError):
                await link.run()
        with pytest.raises(trio.BrokenResourceError):
            await victim.receive_some()
        with pytest.raises(trio.BrokenResourceError):
            await victim.send_all(b"x")
    await raw.aclose()


async def test_frames_for_a_stream_closed_since_are_dropped(nursery):
    link, raw = await raw_acceptor(window=WINDOW)
    await nursery.start(link.run)
    closed, alive = link.open("closed"), link.open("alive")
    await closed.aclose()
    with trio.fail_after(CEILING):
        await raw.send_all(
            frame(1, DATA, b"late") + credit(1, 5) + frame(1, CLOSE) + frame(2, DATA, b"ok")
        )
        assert await alive.receive_some() == b"ok"
    assert link.open_streams == 1
    await raw.aclose()


async def test_a_peer_that_floods_without_reading_ends_the_link(monkeypatch):
    # Every OPEN beyond max_streams costs the acceptor a CLOSE to write; a peer that never
    # reads them would make that queue grow without end.
    monkeypatch.setattr("ipc._mux._MAX_BACKLOG", 50_000)
    raw, sock = socket_pair()
    link = MuxLink(sock, opener=False, max_streams=1)
    flood = b"".join(frame(n, OPEN, b"f") for n in range(1, 200_000))

    async def flooder() -> None:
        with pytest.raises(trio.BrokenResourceError):
            await raw.send_all(flood)  # it reads nothing back

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flooder)
            with pytest.raises(MuxError, match="does not read"):
                await link.run(until_broken)
    await raw.aclose()


async def test_a_reset_connection_raises_from_run_and_breaks_the_streams():
    link, raw = await raw_acceptor()
    stream = link.open("one")
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:

            async def reset() -> None:
                await trio.testing.wait_all_tasks_blocked()  # the OPEN sits unread at raw
                await raw.aclose()  # closing with unread bytes resets the connection

            nursery.start_soon(reset)
            with pytest.raises(trio.BrokenResourceError, match="connection broke"):
                await link.run()
        with pytest.raises(trio.BrokenResourceError, match="connection broke"):
            await stream.receive_some()


async def test_cancelling_run_breaks_the_streams_and_closes_the_connection():
    link, raw = await raw_acceptor()
    stream = link.open("one")
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            await nursery.start(link.run)
            assert parse(await raw.receive_some()) == [(1, OPEN, b"one")]
            nursery.cancel_scope.cancel()
        with pytest.raises(trio.BrokenResourceError):
            await stream.receive_some()
        assert await raw.receive_some() == b""
    await raw.aclose()


async def test_an_acceptor_without_on_open_refuses_every_stream(nursery):
    a, b = socket_pair()
    opener = MuxLink(a, opener=True)
    acceptor = MuxLink(b, opener=False)
    await nursery.start(acceptor.run)
    await nursery.start(opener.run)
    stream = opener.open("one")
    with trio.fail_after(CEILING):
        assert await stream.receive_some() == b""
        with pytest.raises(trio.BrokenResourceError, match="not accepting streams"):
            await stream.send_all(b"x")
    assert acceptor.open_streams == 0


async def test_max_streams_counts_a_stream_until_its_on_open_returns():
    # A peer that closes each stream at once must not pile up on_open tasks.
    raw, sock = socket_pair()
    link = MuxLink(sock, opener=False, max_streams=2)
    release = trio.Event()
    called: list[str] = []

    async def on_open(stream: MuxStream) -> None:
        called.append(stream.name)
        await release.wait()

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            await nursery.start(link.run, on_open)
            await raw.send_all(frame(1, OPEN, b"a") + frame(1, CLOSE) + frame(2, OPEN, b"b"))
            await raw.send_all(frame(2, CLOSE) + frame(3, OPEN, b"c"))
            received = b""
            while (3, CLOSE, b"too many streams") not in parse(received):
                received += await raw.receive_some()
            assert sorted(called) == ["a", "b"]
            assert link.open_streams == 0  # both closed by the peer, their tasks still running
            release.set()
            await trio.testing.wait_all_tasks_blocked()
            await raw.send_all(frame(4, OPEN, b"d"))  # room again
            while len(called) < 3:
                await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert called[2] == "d"
    await raw.aclose()
