import socket

import pytest
import trio
import trio.testing

from ipc._transport import SocketIO, StreamIO, transport_for

CEILING = 10


def socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    left, right = trio.socket.socketpair()
    return trio.SocketStream(left), trio.SocketStream(right)


def fill(stream: trio.SocketStream) -> None:
    """Write into *stream*'s socket until the kernel takes no more."""
    raw = socket.socket(fileno=stream.socket.fileno())
    try:
        while True:
            raw.send(b"x" * 65536)
    except BlockingIOError:
        pass
    finally:
        raw.detach()  # the trio socket still owns the descriptor


async def receive(io: SocketIO | StreamIO) -> bytes:
    """What the channel's reader does: wait, then read (again after a spurious wake-up)."""
    while True:
        await io.wait()
        data = io.read()
        if data is not None:
            return data


async def send(io: SocketIO | StreamIO, data: bytes) -> bool:
    """What the channel does: write what fits now, then the rest; whether it waited."""
    sent = io.try_send(data)
    if sent == len(data):
        return False
    await io.send_rest(data, sent)
    return True


async def test_a_socket_stream_gets_the_descriptor_transport():
    left, right = socket_pair()
    memory_left, _memory_right = trio.testing.memory_stream_pair()
    assert isinstance(transport_for(left), SocketIO)
    assert isinstance(transport_for(memory_left), StreamIO)
    await left.aclose()
    await right.aclose()


async def test_a_write_that_fits_does_not_yield_and_arrives_whole():
    left, right = socket_pair()
    io = SocketIO(stream=left)
    with trio.testing.assert_no_checkpoints():
        assert io.try_send(b"frame bytes") == len(b"frame bytes")
    with trio.fail_after(CEILING):
        assert await right.receive_some() == b"frame bytes"
    assert not io.torn
    await left.aclose()
    await right.aclose()


async def test_a_write_larger_than_the_buffer_waits_for_the_reader():
    left, right = socket_pair()
    io = SocketIO(stream=left)
    data = bytes(range(256)) * 8192  # 2 MiB: several socket buffers
    received = bytearray()

    async def read_all() -> None:
        while len(received) < len(data):
            received.extend(await right.receive_some())

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            assert await send(io, data)
    assert received == data
    await left.aclose()
    await right.aclose()


async def test_a_write_cancelled_after_part_of_it_went_out_is_torn():
    left, right = socket_pair()
    io = SocketIO(stream=left)
    with trio.fail_after(CEILING), trio.move_on_after(0.1) as scope:
        await send(io, b"x" * 2_000_000)  # nobody reads: only part of it fits
    assert scope.cancelled_caught
    assert io.torn
    await left.aclose()
    await right.aclose()


async def test_a_write_cancelled_before_any_byte_went_out_is_not_torn():
    left, right = socket_pair()
    fill(left)
    io = SocketIO(stream=left)
    assert io.try_send(b"frame") == 0
    with trio.fail_after(CEILING), trio.move_on_after(0.1) as scope:
        await io.send_rest(b"frame", 0)
    assert scope.cancelled_caught
    assert not io.torn
    await left.aclose()
    await right.aclose()


async def test_receive_returns_data_then_empty_bytes_at_eof():
    left, right = socket_pair()
    io = SocketIO(stream=left)
    with trio.fail_after(CEILING):
        await right.send_all(b"abc")
        assert await receive(io) == b"abc"
        await right.aclose()
        assert await receive(io) == b""
    await left.aclose()


async def test_closing_wakes_a_parked_reader_and_refuses_later_writes():
    left, right = socket_pair()
    io = SocketIO(stream=left)

    async def close_soon() -> None:
        await trio.testing.wait_all_tasks_blocked()
        await io.aclose()

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(close_soon)
            with pytest.raises(trio.ClosedResourceError):
                await receive(io)
    with pytest.raises(trio.ClosedResourceError):
        io.try_send(b"after close")
    await right.aclose()


class CloseBeforeStep(trio.abc.Instrument):
    """Close the transport just before *task* runs again: after its wake-up, before its read."""

    def __init__(self, io: SocketIO, task: trio.lowlevel.Task) -> None:
        self.io = io
        self.task = task

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.io._closed = True  # what aclose() does first, before the stream closes
            self.io.stream.socket.close()
            trio.lowlevel.remove_instrument(self)


async def test_a_close_between_wake_up_and_read_is_seen_before_reading():
    left, right = socket_pair()
    io = SocketIO(stream=left)
    outcome = []

    async def reader(task_status: trio.TaskStatus[trio.lowlevel.Task]) -> None:
        task_status.started(trio.lowlevel.current_task())
        with pytest.raises(trio.ClosedResourceError):
            await receive(io)
        outcome.append("refused")

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            task = await nursery.start(reader)
            await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.add_instrument(CloseBeforeStep(io, task))
            await right.send_all(b"data")
    assert outcome == ["refused"]
    await left.aclose()
    await right.aclose()


async def test_a_reset_connection_is_a_broken_resource():
    left, right = socket_pair()
    io = SocketIO(stream=left)
    await right.aclose()

    async def write_until_refused() -> None:
        for _ in range(100):  # the first write may still be accepted
            await send(io, b"x" * 65536)

    with trio.fail_after(CEILING), pytest.raises(trio.BrokenResourceError, match="send failed"):
        await write_until_refused()
    await left.aclose()


async def test_any_stream_cancelled_in_send_all_counts_as_torn():
    left, _right = trio.testing.lockstep_stream_pair()
    io = StreamIO(stream=left)
    assert io.try_send(b"frame") == 0  # a stream's send_all always awaits
    with trio.fail_after(CEILING), trio.move_on_after(0.05) as scope:
        await io.send_rest(b"frame", 0)  # a lockstep stream waits for a reader that never comes
    assert scope.cancelled_caught
    assert io.torn
