"""A carried child's relay (``orchestrator.launch._node_relay``): its socket pair and its
stream on a real link, bytes whole both ways, a child that never reads held to one window,
and every way one side ends closing the other."""

import socket

import pytest
import trio

import ipc
from ipc._mux import WINDOW
from orchestrator.launch._node_relay import CHUNK, Relay
from tests.fakes._streams import linked, receive_exactly, rng

CEILING = 20


def trio_socket(sock: socket.socket) -> trio.SocketStream:
    return trio.SocketStream(trio.socket.from_stdlib_socket(sock))


class Carried:
    """A node link (opener) whose streams the test relays, and the door's side of each."""

    def __init__(self) -> None:
        self.streams: dict[str, ipc.MuxStream] = {}
        self.opened = trio.Condition()
        self.opener: ipc.MuxLink
        self.acceptor: ipc.MuxLink

    async def start(self, nursery: trio.Nursery) -> None:
        self.opener, self.acceptor = await linked(nursery, self._on_open)

    async def _on_open(self, stream: ipc.MuxStream) -> None:
        async with self.opened:
            self.streams[stream.name] = stream
            self.opened.notify_all()
        await trio.sleep_forever()  # the test drives the door's side

    async def child(self, nursery: trio.Nursery, name: str) -> tuple[Relay, socket.socket]:
        """A relayed child: the relay running, and the child's end of its socket pair."""
        ours, theirs = socket.socketpair()
        relay = Relay(ours, self.opener.open(name))
        nursery.start_soon(relay.run)
        return relay, theirs

    async def door(self, name: str) -> ipc.MuxStream:
        async with self.opened:
            while name not in self.streams:
                await self.opened.wait()
        return self.streams[name]


@pytest.fixture
async def carried(nursery: trio.Nursery) -> Carried:
    link = Carried()
    await link.start(nursery)
    return link


async def test_bytes_cross_whole_both_ways_at_once(carried: Carried, nursery: trio.Nursery):
    up = rng("up").randbytes(5 * 1024 * 1024 + 3)
    down = rng("down").randbytes(4 * 1024 * 1024 + 7)
    _, theirs = await carried.child(nursery, "a1")
    child = trio_socket(theirs)
    received: dict[str, bytes] = {}

    async def send_in_pieces(stream: trio.abc.SendStream, data: bytes, seed: str) -> None:
        sizes, view = rng(seed), memoryview(data)
        while view:
            size = sizes.choice([1, 7, 300, CHUNK, 3 * CHUNK])
            await stream.send_all(view[:size])
            view = view[size:]

    async def door_side() -> None:
        door = await carried.door("a1")
        async with trio.open_nursery() as both:
            both.start_soon(send_in_pieces, door, down, "door")
            received["up"] = await receive_exactly(door, len(up))

    async def child_side() -> None:
        async with trio.open_nursery() as both:
            both.start_soon(send_in_pieces, child, up, "child")
            received["down"] = await receive_exactly(child, len(down))

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as sides:
            sides.start_soon(door_side)
            sides.start_soon(child_side)
    assert received == {"up": up, "down": down}
    await child.aclose()


async def test_a_child_that_never_reads_holds_one_window_and_loses_nothing(
    carried: Carried, nursery: trio.Nursery
):
    """The door's sends stall once the child's socket buffer, one pending chunk and the
    stream's window are full; a sibling on the same link is not slowed; then all arrives."""
    relay, theirs = await carried.child(nursery, "slow")
    _, sibling = await carried.child(nursery, "lively")
    data = rng("flood").randbytes(16 * 1024 * 1024)
    door = await carried.door("slow")
    sent = 0
    with trio.move_on_after(1.0):
        while sent < len(data):
            await door.send_all(data[sent : sent + CHUNK])
            sent += CHUNK
    assert 0 < sent < len(data), "the door was never held back"
    assert len(relay._pending) <= CHUNK
    # What left the door sits in the child's socket (its buffer, at most the send buffer of
    # the relay's end), the relay's one pending chunk and the stream's window: nothing else.
    socket_buffer = relay._connection.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    assert sent <= socket_buffer + CHUNK + WINDOW + CHUNK  # the last send_all, partly queued

    lively = await carried.door("lively")
    with trio.fail_after(CEILING):
        await lively.send_all(b"ping")
        assert await trio.to_thread.run_sync(sibling.recv, 4) == b"ping"

        async def rest() -> None:
            await door.send_all(data[sent:])

        nursery.start_soon(rest)
        child = trio_socket(theirs)
        assert await receive_exactly(child, len(data)) == data
    await child.aclose()
    sibling.close()


async def test_the_child_closing_closes_its_stream_and_spares_the_link(
    carried: Carried, nursery: trio.Nursery
):
    _, gone = await carried.child(nursery, "gone")
    _, stays = await carried.child(nursery, "stays")
    gone.sendall(b"last words")
    gone.close()
    with trio.fail_after(CEILING):
        door = await carried.door("gone")
        assert await receive_exactly(door, 10) == b"last words"
        assert await door.receive_some() == b""  # then its end of file
        other = await carried.door("stays")
        await other.send_all(b"still here")
        assert await trio.to_thread.run_sync(stays.recv, 10) == b"still here"
    assert carried.opener.open_streams == 1
    stays.close()


async def test_the_door_closing_the_stream_gives_the_child_its_end_of_file(
    carried: Carried, nursery: trio.Nursery
):
    _, theirs = await carried.child(nursery, "a1")
    with trio.fail_after(CEILING):
        door = await carried.door("a1")
        await door.send_all(b"bye")
        await door.aclose()
        child = trio_socket(theirs)
        assert await receive_exactly(child, 3) == b"bye"
        assert await child.receive_some() == b""
    await child.aclose()


async def test_a_child_dying_with_bytes_pending_ends_the_relay_quietly(
    carried: Carried, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
):
    relay, theirs = await carried.child(nursery, "dies")
    door = await carried.door("dies")
    with trio.move_on_after(0.5):  # the child reads nothing: bytes wait in the relay
        while True:
            await door.send_all(b"x" * CHUNK)
    assert relay._pending  # what its full socket did not take
    theirs.close()  # it dies with its socket full
    with trio.fail_after(CEILING):
        while await door.receive_some():
            pass  # the relay ends and closes the stream: the door sees its end
    assert carried.opener.open_streams == 0
    assert "Traceback" not in caplog.text


async def test_the_link_breaking_gives_every_child_its_end_of_file(
    carried: Carried, nursery: trio.Nursery
):
    children = [(await carried.child(nursery, f"c{n}"))[1] for n in range(3)]
    for n in range(3):
        await carried.door(f"c{n}")
    await carried.acceptor.aclose()
    with trio.fail_after(CEILING):
        for theirs in children:
            child = trio_socket(theirs)
            assert await child.receive_some() == b""
            await child.aclose()


async def test_a_child_that_stops_reading_for_good_ends_its_relay(
    carried: Carried, nursery: trio.Nursery
):
    """A child that shut its reading side down can never take its channel's bytes: the
    relay ends at the first it cannot write, though the child could still write."""
    _, theirs = await carried.child(nursery, "deaf")
    theirs.shutdown(socket.SHUT_RD)
    with trio.fail_after(CEILING):
        door = await carried.door("deaf")
        await door.send_all(b"hello?")
        assert await door.receive_some() == b""  # the relay ended and closed the stream
    theirs.close()
