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


async def test_a_socket_stream_gets_the_descriptor_transport():
    left, right = socket_pair()
    memory_left, _memory_right = trio.testing.memory_stream_pair()
    assert isinstance(transport_for(left), SocketIO)
    assert isinstance(transport_for(memory_left), StreamIO)
    await left.aclose()
    await right.aclose()


async def test_a_write_that_fits_does_not_yield_and_arrives_whole():
    left, right = socket_pair()
    io = SocketIO(socket=left.socket)
    with trio.testing.assert_no_checkpoints():
        await io.send(b"frame bytes")
    with trio.fail_after(CEILING):
        assert await right.receive_some() == b"frame bytes"
    assert not io.yields
    assert not io.torn
    await left.aclose()
    await right.aclose()


async def test_a_write_larger_than_the_buffer_waits_for_the_reader():
    left, right = socket_pair()
    io = SocketIO(socket=left.socket)
    data = bytes(range(256)) * 8192  # 2 MiB: several socket buffers
    received = bytearray()

    async def read_all() -> None:
        while len(received) < len(data):
            received.extend(await right.receive_some())

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await io.send(data)
    assert received == data
    await left.aclose()
    await right.aclose()


async def test_a_write_cancelled_after_part_of_it_went_out_is_torn():
    left, right = socket_pair()
    io = SocketIO(socket=left.socket)
    with trio.fail_after(CEILING), trio.move_on_after(0.1) as scope:
        await io.send(b"x" * 2_000_000)  # nobody reads: only part of it fits
    assert scope.cancelled_caught
    assert io.torn
    await left.aclose()
    await right.aclose()


async def test_a_write_cancelled_before_any_byte_went_out_is_not_torn():
    left, right = socket_pair()
    fill(left)
    io = SocketIO(socket=left.socket)
    with trio.fail_after(CEILING), trio.move_on_after(0.1) as scope:
        await io.send(b"frame")
    assert scope.cancelled_caught
    assert not io.torn
    await left.aclose()
    await right.aclose()


async def test_receive_returns_data_then_empty_bytes_at_eof():
    left, right = socket_pair()
    io = SocketIO(socket=left.socket)
    with trio.fail_after(CEILING):
        await right.send_all(b"abc")
        assert await io.receive() == b"abc"
        await right.aclose()
        assert await io.receive() == b""
    await left.aclose()


async def test_closing_the_stream_wakes_a_parked_reader_with_closed_resource_error():
    left, right = socket_pair()
    io = SocketIO(socket=left.socket)

    async def close_soon() -> None:
        await trio.testing.wait_all_tasks_blocked()
        await left.aclose()

    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(close_soon)
            with pytest.raises(trio.ClosedResourceError):
                await io.receive()
    with pytest.raises(trio.ClosedResourceError):
        await io.send(b"after close")
    await right.aclose()


async def test_a_reset_connection_is_a_broken_resource():
    left, right = socket_pair()
    io = SocketIO(socket=left.socket)
    await right.aclose()

    async def write_until_refused() -> None:
        for _ in range(100):  # the first write may still be accepted
            await io.send(b"x" * 65536)

    with trio.fail_after(CEILING), pytest.raises(trio.BrokenResourceError, match="send failed"):
        await write_until_refused()
    await left.aclose()


async def test_any_stream_cancelled_in_send_all_counts_as_torn():
    left, _right = trio.testing.lockstep_stream_pair()
    io = StreamIO(stream=left)
    with trio.fail_after(CEILING), trio.move_on_after(0.05) as scope:
        await io.send(b"frame")  # a lockstep stream waits for a reader that never comes
    assert scope.cancelled_caught
    assert io.torn
    assert io.yields
