"""Opening a channel: the client's hello, and the server's checks of it.

The server checks the peer uid before it reads a single frame, then requires the first frame
to be a ``hello`` request whose envelope carries a valid owner and that owner's token. Anything
else closes the connection without telling the peer why.
"""

import os
import ssl
from collections.abc import Callable
from pathlib import Path

import trio

from ipc._auth import own_uid, peer_uid, tokens_match, valid_identifier
from ipc._channel import Channel
from ipc._errors import ChannelClosed, FrameError, HandshakeError, SchemaError
from ipc._framing import MAX_FRAME, FrameDecoder
from ipc._messages import decode_envelope
from ipc._requests import DEFAULT_TIMEOUT
from ipc._tlsstream import SocketTLSStream, tls_over
from ipc._types import Envelope, Hello, Reply

TLS_SCHEME = "tls://"
"""A loadout ``socket`` with this prefix names a TLS listener (a child on another node)."""

HELLO_TIMEOUT = 30.0
"""Seconds a new connection has to present its hello."""

TokenLookup = Callable[[str], str | None]
"""Maps an owner to its expected token, or ``None`` for an unknown owner."""


async def accept_hello(
    stream: trio.abc.Stream,
    lookup: TokenLookup,
    *,
    timeout: float = HELLO_TIMEOUT,  # noqa: ASYNC109 - the handshake deadline of the protocol
    max_frame: int = MAX_FRAME,
    request_timeout: float = DEFAULT_TIMEOUT,
    peer_checked: bool = False,
) -> tuple[Channel, Envelope]:
    """Authenticate a freshly accepted connection.

    Returns the channel (not yet serving) and the hello envelope; the caller answers the hello
    with :meth:`Channel.reply` once it has bound the connection. Raises
    :class:`HandshakeError` (after closing the stream) on any failure.

    A Unix socket's peer must be our uid. *peer_checked* is for a stream whose peer the caller
    has already authenticated another way (a TLS stream with a verified client certificate,
    whose *lookup* answers only for the certificate's owner); the hello's token is still checked.
    """

    async def refuse(reason: str, message: str) -> HandshakeError:
        with trio.CancelScope(shield=True):
            await stream.aclose()
        return HandshakeError(message, reason=reason)

    if not peer_checked:
        if not isinstance(stream, trio.SocketStream):
            raise await refuse("peer-uid", "a stream with no peer credentials was refused")
        try:
            uid = peer_uid(stream.socket)  # type: ignore[arg-type]
        except OSError as exc:
            raise await refuse("peer-uid", f"peer uid unavailable: {exc}") from None
        if uid != own_uid():
            raise await refuse("peer-uid", f"connection from uid {uid} refused")

    decoder = FrameDecoder(max_frame=max_frame)
    frames: list[bytes] = []
    with trio.move_on_after(timeout) as scope:
        while not frames:
            try:
                data = bytes(await stream.receive_some(65536))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                raise await refuse("eof", "connection closed before hello")
            try:
                frames = decoder.feed(data)
            except FrameError as exc:
                raise await refuse("frame", str(exc)) from None
    if scope.cancelled_caught:
        raise await refuse("timeout", f"no hello within {timeout:g} s")

    try:
        envelope = decode_envelope(frames[0])
    except SchemaError as exc:
        raise await refuse("schema", f"invalid hello: {exc.path}") from None
    if envelope.kind != "request" or not isinstance(envelope.body, Hello):
        raise await refuse("not-hello", f"first frame was a {envelope.type} {envelope.kind}")
    if not valid_identifier(envelope.owner):
        raise await refuse("owner", "hello from an invalid owner id")
    expected = lookup(envelope.owner)
    if expected is None or not tokens_match(envelope.token, expected):
        raise await refuse("token", f"hello from {envelope.owner} has no valid token")

    channel = Channel(
        stream=stream,
        owner=envelope.owner,
        token=expected,
        max_frame=max_frame,
        default_timeout=request_timeout,
        initial=frames[1:],
        decoder=decoder,
    )
    return channel, envelope


async def open_client(
    path: str | os.PathLike[str],
    *,
    owner: str,
    token: str,
    hello: Hello,
    max_frame: int = MAX_FRAME,
    request_timeout: float = DEFAULT_TIMEOUT,
) -> tuple[Channel, Reply]:
    """Connect to a supervisor socket and send the hello.

    The hello reply is read here, before :meth:`Channel.serve` starts, so the caller gets a
    channel that is authenticated end to end. Raises :class:`HandshakeError` when the server
    closes the connection instead (it never says why).
    """
    stream = await trio.open_unix_socket(os.fspath(Path(path)))
    return await hello_on(
        stream,
        owner=owner,
        token=token,
        hello=hello,
        max_frame=max_frame,
        request_timeout=request_timeout,
        where=os.fspath(path),
    )


async def open_tls_client(
    address: str,
    context: ssl.SSLContext,
    *,
    owner: str,
    token: str,
    hello: Hello,
    max_frame: int = MAX_FRAME,
    request_timeout: float = DEFAULT_TIMEOUT,
) -> tuple[Channel, Reply]:
    """Dial a supervisor's TLS listener (``tls://HOST:PORT``) with *context* (the node's
    client certificate, trusting only the session CA) and send the hello, as
    :func:`open_client` does. The TLS handshake shares the hello's deadline."""
    stream = await connect_tls(address, context, timeout=request_timeout)
    return await hello_on(
        stream,
        owner=owner,
        token=token,
        hello=hello,
        max_frame=max_frame,
        request_timeout=request_timeout,
        where=address,
    )


async def connect_tls(
    address: str,
    context: ssl.SSLContext,
    *,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - the dial and handshake share one deadline
) -> SocketTLSStream:
    """A TLS connection to ``tls://HOST:PORT``, its handshake done with *context* within
    *timeout* seconds; :class:`HandshakeError` (reason ``tls``) in one line otherwise."""
    host, port = tls_address(address)
    try:
        with trio.fail_after(timeout):
            tcp = await _dial(host, port)
            stream = tls_over(tcp, context, server_hostname=host)
            try:
                await stream.do_handshake()
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
    except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
        raise HandshakeError(f"TLS connection to {address} failed: {exc!r}", reason="tls") from None
    return stream


async def _dial(host: str, port: int) -> trio.SocketStream:
    """A TCP connection to *host*:*port*, its addresses tried in turn. A door is one address
    on the cluster's network: ``trio.open_tcp_stream``'s happy eyeballs (parallel attempts,
    a nursery, its first use in each forked child) cost a child 0.7 ms for nothing."""
    addresses = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    failure: OSError = OSError(f"no address for {host!r}")
    for family, kind, proto, _name, where in addresses:
        sock = trio.socket.socket(family, kind, proto)
        try:
            await sock.connect(where)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock)
    raise failure


def tls_address(address: str) -> tuple[str, int]:
    """``tls://HOST:PORT`` (``[v6]:PORT`` too) as ``(host, port)``; ValueError otherwise."""
    rest = address.removeprefix(TLS_SCHEME)
    host, sep, port = rest.rpartition(":")
    if not address.startswith(TLS_SCHEME) or not sep or not host or not port.isdigit():
        raise ValueError(f"not a tls://HOST:PORT address: {address!r}")
    return host.strip("[]"), int(port)


async def hello_on(
    stream: trio.abc.Stream,
    *,
    owner: str,
    token: str,
    hello: Hello,
    max_frame: int = MAX_FRAME,
    request_timeout: float = DEFAULT_TIMEOUT,
    where: str = "the inherited connection",
) -> tuple[Channel, Reply]:
    """Send the hello on an already-connected *stream* (an inherited socketpair end, or one
    :func:`open_client` connected) and read the reply, as :func:`open_client` describes."""
    channel = Channel(
        stream=stream,
        owner=owner,
        token=token,
        max_frame=max_frame,
        default_timeout=request_timeout,
    )
    decoder = FrameDecoder(max_frame=max_frame)
    channel.decoder = decoder
    try:
        await channel._send("request", "0", hello)  # the hello precedes serve()
        with trio.fail_after(request_timeout):
            frames: list[bytes] = []
            while not frames:
                data = bytes(await stream.receive_some(65536))
                if not data:
                    break
                frames = decoder.feed(data)
    except (trio.TooSlowError, FrameError, ChannelClosed, trio.BrokenResourceError) as exc:
        with trio.CancelScope(shield=True):
            await stream.aclose()
        raise HandshakeError(f"hello to {where} failed: {exc!r}", reason="hello") from None
    if not frames:
        with trio.CancelScope(shield=True):
            await stream.aclose()
        raise HandshakeError("supervisor closed the connection at hello", reason="eof")
    try:
        envelope = decode_envelope(frames[0])
    except SchemaError as exc:
        await stream.aclose()
        raise HandshakeError(f"invalid hello reply: {exc}", reason="schema") from None
    body = envelope.body
    if (
        envelope.kind != "response"
        or envelope.corr != "0"
        or not tokens_match(envelope.token, token)
        or not isinstance(body, Reply)
        or not body.ok
    ):
        await stream.aclose()
        raise HandshakeError("supervisor refused the hello", reason="refused")
    channel.initial.extend(frames[1:])
    return channel, body
