"""TLS on the socket itself (``ipc._tlsstream``): what a trio stream must do, over real TLS."""

import os
import ssl

import pytest
import trio

from ipc import SocketTLSStream, tls_over
from ipc._tlsstream import TLSIO
from ipc._transport import transport_for
from tests.fakes._tls import TestCA, tls_pair


async def test_a_large_message_crosses_while_the_other_way_is_busy_too(tmp_path):
    payload = bytes(range(256)) * 8192  # 2 MiB: many records each way
    async with trio.open_nursery() as nursery:
        client, server = await tls_pair(tmp_path, nursery)
        got: dict[str, bytes] = {"client": b"", "server": b""}

        async def read(name: str, stream: SocketTLSStream) -> None:
            while len(got[name]) < len(payload):
                chunk = await stream.receive_some(65536)
                assert chunk, "closed early"
                got[name] += chunk

        async with trio.open_nursery() as both:  # send and receive at once, on both ends
            both.start_soon(client.send_all, payload)
            both.start_soon(server.send_all, payload[::-1])
            both.start_soon(read, "server", server)
            both.start_soon(read, "client", client)
        assert got == {"server": payload, "client": payload[::-1]}
        assert client.peer_certificate()  # the server's, in DER
        await client.aclose()
        assert await server.receive_some(10) == b""  # the peer's close is an end of stream
        await server.aclose()


async def test_a_closed_stream_refuses_use_and_a_second_sender_is_busy(tmp_path):
    async with trio.open_nursery() as nursery:
        client, server = await tls_pair(tmp_path, nursery)
        broken = trio.Event()

        async def hog() -> None:
            with pytest.raises(trio.BrokenResourceError):
                await client.send_all(b"x" * (64 << 20))  # blocks: nobody reads, then reset
            broken.set()

        nursery.start_soon(hog)
        await trio.sleep(0.2)
        with pytest.raises(trio.BusyResourceError):
            await client.send_all(b"y")
        await server.aclose()  # the peer goes away mid-send: the sender learns it
        with pytest.raises(trio.ClosedResourceError):
            await server.receive_some(1)
        with trio.fail_after(10):
            await broken.wait()
    await client.aclose()


async def test_a_peer_that_is_not_tls_breaks_the_handshake(tmp_path):
    ca = TestCA()
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:

        async def plain() -> None:
            tcp = await trio.open_tcp_stream("127.0.0.1", port)
            await tcp.send_all(b"GET / HTTP/1.0\r\n\r\n")
            assert await tcp.receive_some(100) == b""  # closed, not reset
            await tcp.aclose()

        nursery.start_soon(plain)
        server = tls_over(await listener.accept(), ca.server_context(), server_side=True)
        with pytest.raises(trio.BrokenResourceError):
            await server.do_handshake()
        await server.aclose()
    await listener.aclose()


async def test_the_channels_tls_transport_moves_large_frames_both_ways_at_once(tmp_path):
    # What the channel does over the door: whole-frame writes (try now, then the rest,
    # retried with the same bytes as OpenSSL requires) while the other side reads.
    payload = bytes(range(256)) * 32768  # 8 MiB: the socket buffers fill, writes must wait
    async with trio.open_nursery() as nursery:
        client, server = await tls_pair(tmp_path, nursery)
        ends = {"client": transport_for(client), "server": transport_for(server)}
        assert all(isinstance(io, TLSIO) for io in ends.values())
        got = {"client": bytearray(), "server": bytearray()}

        async def write(name: str, data: bytes) -> None:
            io = ends[name]
            for start in range(0, len(data), 1 << 20):  # 1 MiB frames
                frame = data[start : start + (1 << 20)]
                sent = io.try_send(frame)
                if sent != len(frame):
                    await io.send_rest(frame, sent)

        async def read(name: str, size: int) -> None:
            io = ends[name]
            while len(got[name]) < size:
                await io.wait()
                data = io.read()
                if data is None:
                    continue
                assert data, "closed early"
                got[name] += data

        with trio.fail_after(60):
            async with trio.open_nursery() as both:
                both.start_soon(write, "client", payload)
                both.start_soon(write, "server", payload[::-1])
                both.start_soon(read, "server", len(payload))
                both.start_soon(read, "client", len(payload))
        assert bytes(got["server"]) == payload
        assert bytes(got["client"]) == payload[::-1]
        await ends["client"].aclose()
        await ends["server"].wait()
        assert ends["server"].read() == b""
        await ends["server"].aclose()
        with pytest.raises(trio.ClosedResourceError):
            ends["server"].read()


async def test_a_write_that_needs_a_read_first_polls_instead_of_spinning(tmp_path, monkeypatch):
    # OpenSSL may say a write must wait for the peer's data (SSLWantReadError). The socket is
    # writable all the while, so waiting on writability would retry the write at once, over
    # and over, until the read came: a core busy for as long. The retry polls instead.
    async with trio.open_nursery() as nursery:
        client, server = await tls_pair(tmp_path, nursery)
        sock, io = client.socket, transport_for(client)
        real_send, calls = sock.send, []
        until = trio.current_time() + 0.1

        def send(data: bytes) -> int:
            calls.append(len(data))
            if trio.current_time() < until:
                raise ssl.SSLWantReadError("the peer's key update first")
            return real_send(data)

        monkeypatch.setattr(sock, "send", send)
        frame = b"f" * 1000
        assert io.try_send(frame) == 0
        await io.send_rest(frame, 0)
        assert len(calls) < 150, f"{len(calls)} write attempts in 0.1 s: it spun"
        assert await server.receive_some(2000) == frame  # the bytes went, once, whole
        await client.aclose()
        await server.aclose()


async def test_a_lender_reads_what_openssl_already_decrypted_without_waiting(tmp_path):
    # A requester the reader lent the stream to (ipc._lending) waits like the reader: on the
    # socket only when OpenSSL holds nothing decrypted. Bytes of a record read in part are no
    # longer on the socket; waiting on it for them would wait for the request's deadline.
    async with trio.open_nursery() as nursery:
        client, server = await tls_pair(tmp_path, nursery)
        io = transport_for(server)
        assert isinstance(io, TLSIO)
        await client.send_all(b"r" * 5000)  # one record
        await io.wait()
        assert io.read(1000) == b"r" * 1000  # the other 4000 stay decrypted in OpenSSL
        assert server.socket.pending() == 4000
        with trio.fail_after(1):
            await io.lend_wait()
        assert io.read() == b"r" * 4000
        lender = io.lender
        assert lender.duplicate is None  # it never needed to wait on the socket
        await client.send_all(b"s")
        with trio.fail_after(5):
            await io.lend_wait()  # now it does, on its own duplicate of the descriptor
        held = io.lender.duplicate
        assert held is not None
        assert io.read() == b"s"
        await io.aclose()
        assert io.lender.duplicate is None  # the close released it
        with pytest.raises(OSError):  # closed, not leaked
            os.fstat(held)
        await client.aclose()
