"""The TLS door: where children on other nodes dial back, over TCP and mutual TLS.

It opens when the first remote child is about to start and closes when the last one is gone,
so a listener on a non-loopback address exists only while remote children do. Each connection
must complete a TLS 1.3 handshake with a client certificate from this session's CA
(:class:`~orchestrator.remote._ca.SessionCA`); the certificate names one owner, and only that
owner's hello is looked up — with its HMAC token, good for one pending launch, as on the Unix
listener. A foreign or expired certificate fails the handshake; a certificate for one child
carrying another child's hello is refused; a replayed hello finds no pending launch. Every
refusal is counted and logged by reason, and the peer is told nothing.

After the hello the stream carries the same frames as the Unix socket: the wire, deadlines and
replay cache are the channel's, unchanged.

A Ray node host dials in once with a certificate for a **link owner** (``host.<hex>``,
``ipc.is_link_owner``; no child's can be one) and carries every child of its node over that one
connection, one multiplexed stream each (:class:`ipc.MuxLink`; the host's side is
``orchestrator.launch._node_link``). A stream names its child, and the door takes it only if
the supervisor placed that child on that very link (*carries*); then that child's hello with
its one-launch token, exactly as on a connection of its own. A link vouches for its channels
as long as its leaf (and the leaves the supervisor renews for it). A link that breaks the
multiplexing rules is cut with every stream on it, and counted.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from cryptography import x509

import ipc
from orchestrator.remote._ca import SessionCA, owner_of, seconds_left

__all__ = ["TlsDoor"]

#: ``attach(channel, hello, seconds, link)``: the channel, its hello, how long the certificate
#: that vouched for it is still valid, and the link owner it came over (``""``: its own).
Attach = Callable[[ipc.Channel, ipc.Envelope, float, str], Awaitable[None]]
Refuse = Callable[..., None]


@attrs.define(eq=False)
class TlsDoor:
    """One session's TLS listener, shared by its remote children; see the module docstring."""

    ca: SessionCA
    #: The token a hello for *owner* must carry now (``None``: no pending launch).
    token_for: Callable[[str], str | None]
    attach: Attach
    #: ``refuse(reason, owner, **evidence)``: the reject log and its counts.
    refuse: Refuse
    #: ``carries(link, key)``: whether child *key*'s stream may come over link *link*.
    carries: Callable[[str, str], bool] = lambda _link, _key: False
    host: str = "127.0.0.1"
    port: int = 0
    hello_timeout: float = ipc.HELLO_TIMEOUT
    request_timeout: float = 30.0
    _users: set[str] = attrs.field(factory=set, init=False)
    _scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _address: str = attrs.field(default="", init=False)
    _context: ssl.SSLContext | None = attrs.field(default=None, init=False)

    @property
    def address(self) -> str:
        """``tls://HOST:PORT`` while open, else ``""``."""
        return self._address

    async def open_for(self, key: str, nursery: trio.Nursery) -> str:
        """The door's address, opening it for the first remote child *key*."""
        self._users.add(key)
        if not self._address:
            if self._context is None:
                self._context = await trio.to_thread.run_sync(self.ca.server_context, self.host)
            listeners = await nursery.start(self._serve)
            sock = listeners[0].socket
            host, port = sock.getsockname()[:2]
            self._address = f"{ipc.TLS_SCHEME}{_bracket(host)}:{port}"
        return self._address

    def release(self, key: str) -> None:
        """*key* is gone; the last one out closes the listener."""
        self._users.discard(key)
        if not self._users and self._scope is not None:
            self._scope.cancel()
            self._scope = None
            self._address = ""

    async def _serve(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            self._scope = scope
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
            try:
                async with trio.open_nursery() as nursery:
                    task_status.started(listeners)
                    for listener in listeners:
                        nursery.start_soon(trio.serve_listeners, self._handle, [listener])
            finally:
                with trio.CancelScope(shield=True):
                    for listener in listeners:
                        await listener.aclose()

    async def _handle(self, tcp: trio.SocketStream) -> None:
        if self._context is None:  # pragma: no cover - set before the listener opens
            await tcp.aclose()
            return
        stream = ipc.tls_over(tcp, self._context, server_side=True)
        certified = await self._certified_owner(stream)
        if certified is None:
            return
        owner, seconds = certified
        if ipc.is_link_owner(owner):
            await self._serve_link(stream, owner, seconds)
            return
        await self._hello(stream, owner, seconds, "")

    async def _hello(self, stream: trio.abc.Stream, owner: str, seconds: float, link: str) -> None:
        """Take *owner*'s hello on *stream* (its one-launch token; no one else's), then hand
        the channel over."""

        def lookup(named: str) -> str | None:
            return self.token_for(named) if named == owner else None

        try:
            channel, hello = await ipc.accept_hello(
                stream,
                lookup,
                timeout=self.hello_timeout,
                request_timeout=self.request_timeout,
                peer_checked=True,
            )
        except ipc.HandshakeError as exc:
            self.refuse(exc.reason, owner, via="link" if link else "tls")
            return
        await self.attach(channel, hello, seconds, link)

    async def _serve_link(self, stream: ipc.SocketTLSStream, link: str, seconds: float) -> None:
        """Serve node link *link*: each stream it opens is one child's connection, taken only
        for a child placed on this link."""

        async def carried(child: ipc.MuxStream) -> None:
            if not ipc.valid_identifier(child.name) or not self.carries(link, child.name):
                self.refuse("link", child.name[:128], via="link", link=link)
                return  # the stream is closed as this returns
            try:
                await self._hello(child, child.name, seconds, link)
            except Exception as exc:  # one child's end never ends its siblings' link
                self.refuse("channel", child.name, via="link", link=link, error=repr(exc)[:200])

        mux = ipc.MuxLink(stream, opener=False)
        try:
            await mux.run(carried)
        except ipc.MuxError as exc:
            self.refuse("link", "", via="link", link=link, error=str(exc))
        finally:
            with trio.CancelScope(shield=True):
                await mux.aclose()

    async def _certified_owner(self, stream: ipc.SocketTLSStream) -> tuple[str, float] | None:
        """The owner the peer's verified certificate names and the seconds it has left, after
        the TLS handshake."""
        reason = "tls"
        with trio.move_on_after(self.hello_timeout):
            try:
                await stream.do_handshake()
            except trio.BrokenResourceError as exc:
                reason = "certificate" if _no_valid_certificate(exc.__cause__) else "tls"
            else:
                der = stream.peer_certificate()
                cert = x509.load_der_x509_certificate(der) if der else None
                bound = owner_of(cert, self.ca.session) if cert is not None else None
                if cert is not None and bound:
                    return bound, seconds_left(cert)
                reason = "certificate"
        self.refuse(reason, "", via="tls")
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await trio.aclose_forcefully(stream)
        return None


def _no_valid_certificate(cause: BaseException | None) -> bool:
    """Whether a failed handshake failed on the client's certificate: a bad one, or none."""
    if isinstance(cause, ssl.SSLCertVerificationError):
        return True
    return isinstance(cause, ssl.SSLError) and cause.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host
