"""A node host's link: one mutual-TLS connection to the supervisor's door that carries the
channel of every child the host starts.

A remote child that dialled the door itself paid for its own key, CSR, signature, TLS context
and handshake, and the supervisor for the other half of each: about 10 ms of CPU a child, a
third of what a remote child cost beyond a local one (``benchmarks/ray_fleet.py``). Here the
node host pays that once. It holds one key of its own, made here (only its CSR leaves the
node), signed by the session CA for a *link owner* (``host.<hex>``: a name no child can have,
since an owner id has no dot) and renewed by the supervisor through Ray before it runs out. The
key lives in this process only: the context is loaded from a memfd that is closed at once, and
no fork server, fork or file on the node ever holds it.

Each child the host starts gets one end of a socket pair as its connection (``--fd N``, the
very form a local child gets) and speaks its ordinary token-authenticated channel over it. The
host relays that pair to a stream of its own on the link (:class:`ipc.MuxLink`), named for the
child: the door takes a stream only for a child the supervisor placed on this host, and then
only that child's hello with its one-launch token. A child never sees the link, its key or any
sibling's stream; with its channel gone it has no business with the network at all.

The link is dialled on the first child that needs it and again when it has broken (the door
closes with its last remote child, and may open on another port): every start says where the
door is. The relays and the link run on the host's one trio thread (:mod:`._node_loop`).
"""

import contextlib
import logging
import os
import socket
import ssl
import threading
from typing import TYPE_CHECKING

import trio
from cryptography import x509

import ipc
from orchestrator.launch._node_key import key_pem, new_key_and_csr
from orchestrator.launch._node_loop import NodeLoop
from orchestrator.launch._node_relay import Relay

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["NodeLink"]

log = logging.getLogger("orchestrator")

#: How long dialling the door and its handshake may take.
DIAL_S = 30.0


class NodeLink:
    """A node host's one connection to the door, and the relays of its children's channels."""

    def __init__(self, loop: NodeLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        #: The key of the CSR last sent, until its leaf comes back (:meth:`accept`).
        self._pending: tuple[ec.EllipticCurvePrivateKey, str, str] | None = None
        #: The client context of the link's current leaf (``None`` before the first).
        self._context: ssl.SSLContext | None = None
        self._owner = ""
        #: On the loop's thread only: the live link and the door it was dialled to.
        self._mux: ipc.MuxLink | None = None
        self._address = ""
        self._dialling: trio.Lock | None = None

    @property
    def owner(self) -> str:
        """The owner of the link's current leaf (``""`` before the first)."""
        return self._owner

    def request(self, session: str, owner: str) -> bytes:
        """A CSR for a new key of the link's (kept here until its leaf comes back): *owner*
        must be a link owner."""
        if not ipc.is_link_owner(owner) or not ipc.valid_identifier(session):
            raise RuntimeError(f"a node's link: {owner!r} is not a link owner")
        key, csr = new_key_and_csr(session, owner)
        with self._lock:
            self._pending = (key, session, owner)
        return csr

    def accept(self, leaf_pem: bytes, ca_pem: bytes) -> None:
        """Take the signed leaf for the pending key (refused unless it is for that very key and
        owner); later dials present it. A link that is up stays up."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("a node's link: a certificate nobody asked for")
        key, session, owner = pending
        leaf = x509.load_pem_x509_certificate(leaf_pem)
        uri = f"fleet://{session}/{owner}"
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        if leaf.public_key() != key.public_key() or san.get_values_for_type(
            x509.UniformResourceIdentifier
        ) != [uri]:
            raise RuntimeError(f"a node's link: the certificate is not for its key and {uri}")
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem.decode())
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        _load_chain(context, key_pem(key) + leaf_pem)
        with self._lock:
            self._context, self._owner = context, owner

    def carry(self, address: str, name: str, connection: socket.socket) -> None:
        """Relay *connection* (the host's end of child *name*'s socket pair) over the link to
        the door at *address* (dialled first if it is not up there); it is the relay's from
        here on, closed when either side ends. Blocking: from an actor thread."""
        self._loop.run(self._carry, address, name, connection)

    async def _up(self, address: str) -> ipc.MuxLink:
        if self._dialling is None:
            self._dialling = trio.Lock()
        async with self._dialling:
            if self._mux is not None and self._address == address:
                return self._mux
            with self._lock:
                context = self._context
            if context is None:
                raise RuntimeError("a node's link: no certificate yet")
            stream = await ipc.connect_tls(address, context, timeout=DIAL_S)
            mux = ipc.MuxLink(stream, opener=True)
            await self._loop.nursery.start(self._serve, mux, address)
            return mux

    async def _serve(
        self, mux: ipc.MuxLink, address: str, *, task_status: trio.TaskStatus[None]
    ) -> None:
        if self._mux is not None:
            with contextlib.suppress(Exception):
                await self._mux.aclose()  # the door moved: its streams are gone already
        self._mux, self._address = mux, address
        try:
            await mux.run(task_status=task_status)
        except Exception as exc:  # never into the loop: every other child runs there
            log.warning("the node's link to %s ended: %r", address, exc)
        finally:
            if self._mux is mux:
                self._mux, self._address = None, ""
            with trio.CancelScope(shield=True):
                await mux.aclose()  # its connection too

    async def _carry(self, address: str, name: str, connection: socket.socket) -> None:
        try:
            mux = await self._up(address)
            stream = mux.open(name)
        except BaseException:
            connection.close()
            raise
        self._loop.nursery.start_soon(Relay(connection, stream).run)


def _load_chain(context: ssl.SSLContext, pem: bytes) -> None:
    """``load_cert_chain`` from *pem* (key and leaf) without a file: a memfd, closed at once."""
    fd = os.memfd_create("fleet-link", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
