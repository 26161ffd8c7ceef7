import errno
import os
import pwd
import shutil
import socket
import struct
import tempfile

import pytest
import trio

import ipc
from ipc import HandshakeError


async def refused(listener, wire, **options) -> HandshakeError:
    with trio.fail_after(10):
        stream = await listener.accept()
        with pytest.raises(HandshakeError) as caught:
            await ipc.accept_hello(stream, wire.lookup, **options)
    return caught.value


async def test_open_client_and_accept_hello_bind_the_owner(connect, wire):
    pair = await connect()
    assert pair.server.owner == "a1"
    assert pair.server.token == wire.token("a1")
    assert pair.hello.body == ipc.Hello(pid=os.getpid(), backend="test")
    assert (pair.hello.kind, pair.hello.corr) == ("request", "0")
    assert pair.client.owner == "a1"


async def test_frames_behind_the_hello_reach_the_channel(
    listener, raw_client, wire, serve_channel, nursery
):
    stream = await raw_client()
    # One write: the hello and an event share a packet, so accept_hello reads both.
    await stream.send_all(wire.frame(ipc.Hello(pid=1), corr="0") + wire.event("early"))
    with trio.fail_after(10):
        server, _hello = await ipc.accept_hello(await listener.accept(), wire.lookup)
        served = await serve_channel(nursery, server)
        assert (await served.next_event()).body.text == "early"


@pytest.mark.parametrize(
    ("kind", "message"),
    [("request", ipc.Prompt(text="x", turn=1)), ("event", ipc.Hello(pid=1))],
    ids=["prompt-request", "hello-event"],
)
async def test_a_non_hello_first_frame_closes(kind, message, listener, raw_client, wire):
    stream = await raw_client()
    await stream.send_all(wire.frame(message, kind=kind, corr="0"))
    error = await refused(listener, wire)
    assert error.reason == "not-hello"
    with trio.fail_after(10):
        assert await stream.receive_some() == b""  # closed, and told nothing


async def test_a_wrong_token_closes(listener, raw_client, wire):
    stream = await raw_client()
    await stream.send_all(wire.frame(ipc.Hello(pid=1), corr="0", token="0" * 64))
    error = await refused(listener, wire)
    assert error.reason == "token"
    assert "0" * 64 not in str(error)
    with trio.fail_after(10):
        assert await stream.receive_some() == b""


def near_miss(token):
    """*token* with only its last character changed."""
    return token[:-1] + ("0" if token[-1] != "0" else "1")


async def test_a_token_differing_only_in_its_last_character_closes(listener, raw_client, wire):
    stream = await raw_client()
    await stream.send_all(wire.frame(ipc.Hello(pid=1), corr="0", token=near_miss(wire.token())))
    assert (await refused(listener, wire)).reason == "token"
    with trio.fail_after(10):
        assert await stream.receive_some() == b""


async def test_another_owners_token_closes(listener, raw_client, wire):
    wire.owners.add("a2")
    stream = await raw_client()
    await stream.send_all(wire.frame(ipc.Hello(pid=1), corr="0", token=wire.token("a2")))
    assert (await refused(listener, wire)).reason == "token"


async def test_an_unknown_owner_closes(listener, raw_client, wire):
    stream = await raw_client()
    # A correct HMAC for an owner the supervisor never launched (or already reaped).
    await stream.send_all(wire.frame(ipc.Hello(pid=1), corr="0", owner="ghost"))
    error = await refused(listener, wire)
    assert error.reason == "token"
    assert str(error) == "hello from ghost has no valid token"


async def test_an_invalid_owner_id_closes_before_lookup(listener, raw_client, wire):
    looked_up = []
    wire_lookup = wire.lookup

    def lookup(owner):
        looked_up.append(owner)
        return wire_lookup(owner)

    stream = await raw_client()
    await stream.send_all(wire.frame(ipc.Hello(pid=1), corr="0", owner="../a1"))
    with trio.fail_after(10):
        with pytest.raises(HandshakeError) as caught:
            await ipc.accept_hello(await listener.accept(), lookup)
    assert caught.value.reason == "owner"
    assert looked_up == []


@pytest.mark.parametrize(
    "header",
    [b"\x00\x00\x00\x00", (ipc.MAX_FRAME + 1).to_bytes(4, "big")],
    ids=["zero", "oversize"],
)
async def test_a_framing_error_before_hello_closes(header, listener, raw_client, wire):
    stream = await raw_client()
    await stream.send_all(header)
    error = await refused(listener, wire)
    assert error.reason == "frame"
    with trio.fail_after(10):
        assert await stream.receive_some() == b""


async def test_a_custom_frame_limit_applies_to_the_hello(listener, raw_client, wire):
    stream = await raw_client()
    await stream.send_all(wire.frame(ipc.Hello(pid=1, backend="x" * 100), corr="0"))
    assert (await refused(listener, wire, max_frame=64)).reason == "frame"


async def test_garbage_instead_of_hello_closes(listener, raw_client, wire):
    stream = await raw_client()
    await stream.send_all(struct.pack(">I", 5) + b"hello")
    error = await refused(listener, wire)
    assert error.reason == "schema"


async def test_eof_before_hello(listener, raw_client, wire):
    stream = await raw_client()
    await stream.send_all(wire.frame(ipc.Hello(pid=1), corr="0")[:10])
    await stream.send_eof()
    assert (await refused(listener, wire)).reason == "eof"


async def test_no_hello_within_the_deadline(listener, raw_client, wire):
    await raw_client()
    start = trio.current_time()
    error = await refused(listener, wire, timeout=0.2)
    assert error.reason == "timeout"
    assert trio.current_time() - start >= 0.2
    assert ipc.HELLO_TIMEOUT == 30.0


async def test_open_client_reports_a_refused_hello(listener, sock_path, wire, nursery):
    async def server():
        stream = await listener.accept()
        with pytest.raises(HandshakeError):
            await ipc.accept_hello(stream, wire.lookup)

    nursery.start_soon(server)
    with trio.fail_after(10), pytest.raises(HandshakeError) as caught:
        await ipc.open_client(sock_path, owner="a1", token="0" * 64, hello=ipc.Hello(pid=1))
    assert caught.value.reason == "eof"
    assert str(caught.value) == "supervisor closed the connection at hello"


@pytest.mark.parametrize("near", [False, True], ids=["other", "last-char"])
async def test_open_client_refuses_a_reply_with_the_wrong_token(
    near, listener, sock_path, wire, nursery
):
    bad_token = near_miss(wire.token()) if near else "f" * 64

    async def impostor():
        stream = await listener.accept()
        await stream.receive_some()
        await stream.send_all(
            wire.frame(ipc.Reply(ok=True), kind="response", corr="0", token=bad_token)
        )
        await stream.receive_some()  # until the client hangs up
        await stream.aclose()

    nursery.start_soon(impostor)
    with trio.fail_after(10), pytest.raises(HandshakeError) as caught:
        await ipc.open_client(sock_path, owner="a1", token=wire.token(), hello=ipc.Hello(pid=1))
    assert caught.value.reason == "refused"


# -- the peer uid -----------------------------------------------------------------------------


def _nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user (nobody)")
async def test_a_peer_of_another_uid_is_closed_before_any_frame_is_read(wire):
    uid, gid = _nobody()
    # pytest's tmp_path is private to root; this one test needs a socket nobody can reach.
    directory = tempfile.mkdtemp(prefix="ipc-uid-", dir="/tmp")
    try:
        os.chmod(directory, 0o755)  # noqa: S103 - nobody must reach this one test socket
        path = os.path.join(directory, "s")
        server_sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await server_sock.bind(path)
        os.chmod(path, 0o777)  # noqa: S103 - connecting needs write access to the socket
        server_sock.listen(1)
        listener = trio.SocketListener(server_sock)
        report_read, report_write = os.pipe()
        hello = wire.frame(ipc.Hello(pid=1), corr="0")
        pid = os.fork()
        if pid == 0:  # the other user: connect, send a valid hello, report what comes back
            outcome = b"?"
            try:
                os.close(report_read)
                os.setgid(gid)
                os.setuid(uid)
                client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                client.connect(path)
                client.sendall(hello)
                os.write(report_write, b"S")
                try:
                    outcome = b"D" if client.recv(65536) else b"E"
                except ConnectionResetError:
                    outcome = b"R"
            finally:
                os.write(report_write, outcome)
                os._exit(0)
        os.close(report_write)
        report = trio.lowlevel.FdStream(report_read)
        with trio.fail_after(10):
            assert await report.receive_some(1) == b"S"  # the hello is in our queue now
            stream = await listener.accept()
            with pytest.raises(HandshakeError) as caught:
                await ipc.accept_hello(stream, wire.lookup)
            outcome = await report.receive_some(1)
        await report.aclose()
        await listener.aclose()
        await trio.to_thread.run_sync(os.waitpid, pid, 0)
        assert caught.value.reason == "peer-uid"
        assert str(caught.value) == f"connection from uid {uid} refused"
        # Closing a Unix socket with unread data resets the peer: proof the hello was never read.
        assert outcome == b"R", f"peer saw {outcome!r}, expected a reset ({errno.ECONNRESET})"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def test_a_hello_on_an_inherited_socketpair_binds_the_owner(wire, nursery):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server_stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    client_stream = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
    accepted: list[tuple[ipc.Channel, ipc.Envelope]] = []

    async def accept() -> None:
        server, hello = await ipc.accept_hello(server_stream, wire.lookup)
        accepted.append((server, hello))
        await server.reply(hello.corr, ipc.Reply(ok=True))

    with trio.fail_after(10):
        nursery.start_soon(accept)
        client, reply = await ipc.hello_on(
            client_stream, owner="a1", token=wire.token("a1"), hello=ipc.Hello(pid=7)
        )
    assert reply.ok
    assert client.owner == "a1"
    [(server, hello)] = accepted
    assert (server.owner, hello.body) == ("a1", ipc.Hello(pid=7))
    await client.aclose("done")
    await server.aclose("done")


async def test_a_tls_dial_tries_each_address_and_leaves_no_socket_open():
    """``open_tls_client`` dials the door directly (no happy-eyeballs nursery): a refused
    address fails with its own error and closes its socket; a listening one connects, with
    ``TCP_NODELAY`` set as ``trio.SocketStream`` sets it."""
    from ipc._handshake import _dial  # noqa: PLC0415 - the door's dial

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ConnectionRefusedError):
        await _dial("127.0.0.1", port)
    assert len(os.listdir("/proc/self/fd")) == before
    with socket.create_server(("127.0.0.1", 0)) as server:
        stream = await _dial("127.0.0.1", server.getsockname()[1])
        async with stream:
            assert stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            peer, _ = server.accept()
            peer.sendall(b"hi")
            assert await stream.receive_some(2) == b"hi"
            peer.close()
