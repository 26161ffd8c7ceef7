"""The supervisor's side of remote children: the session CA and the TLS door, made on first use.

A child on another node (the ``ray`` surface) dials back to ``tls://HOST:PORT`` instead of the
session's Unix socket. Its loadout names that address, its paths in its node directory
(made on its node by its actor, nothing here) and, for its egress
relay, the door's ``host:port`` — a sandboxed child has no network but its proxy (run by its
actor on its node), which lets only its allowlist through. The CA's key stays in this process;
the door closes with the last remote child.
"""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

import ipc
from orchestrator.core._terms import RemoteTerms
from orchestrator.remote._ca import SessionCA
from orchestrator.remote._door import TlsDoor

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "REMOTE_SURFACES",
    "NodeLayout",
    "Remote",
    "door_target",
    "node_directory",
    "node_layout",
]


class _Attachable(Protocol):
    """What the door needs of a run: its loadout file and the channel hand-over."""

    @property
    def loadout(self) -> str: ...
    @property
    def terms(self) -> RemoteTerms | None: ...
    async def attach(self, channel: ipc.Channel, hello: ipc.Envelope) -> None: ...


#: Surfaces whose children run on other nodes and dial back over mutual TLS.
REMOTE_SURFACES = frozenset({"ray"})


@attrs.frozen
class NodeLayout:
    """A remote child's paths in its node directory (all on its node, none on ours)."""

    root: Path
    loadout: Path
    scratch: Path
    tls: Path
    checkout: Path


def node_directory(session: str, key: str) -> Path:
    """A stand-in for child *key*'s node directory, in its loadout from the spawn until its
    launch: nothing is made at this path. At launch its actor makes the real one in its own
    node's root of them (memory when it can) and names it (``ChildActor.make_node``), and the
    loadout's paths are moved there before the loadout is written on the node
    (``core._launching``)."""
    name = f"fleet-node-{session}-{key}-{secrets.token_hex(16)}"
    return Path(tempfile.gettempdir()) / name


def door_target(address: str) -> str:
    """The door ``tls://HOST:PORT`` as an egress allowlist's ``HOST:PORT``."""
    host, port = ipc.tls_address(address)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def node_layout(node: Path) -> NodeLayout:
    """What lives in *node*: the loadout file, the scratch (its TLS dir inside, readable by the
    child), and the checkout beside it (not in the scratch: a reader's checkout is bound
    read-only, which a writable scratch around it would undo)."""
    scratch = node / "scratch"
    return NodeLayout(
        root=node,
        loadout=node / "loadout.json",
        scratch=scratch,
        tls=scratch / "tls",
        checkout=node / "checkout",
    )


@attrs.define(eq=False)
class Remote:
    """One session's CA and TLS door, shared by its remote children."""

    session: str
    runs: Mapping[str, _Attachable]
    #: A hello on the door must carry this token for the owner (the Unix listener's rule).
    token_for: Callable[[str], str | None]
    refuse: Callable[..., None]
    nursery: trio.Nursery
    host: str = "127.0.0.1"
    hello_timeout: float = ipc.HELLO_TIMEOUT
    request_timeout: float = 30.0
    #: A remote child's lease (``child._lease``): seconds it may go unheard before it quits.
    lease_s: float = 30.0
    _ca: SessionCA | None = attrs.field(default=None, init=False)
    _door: TlsDoor | None = attrs.field(default=None, init=False)
    #: Per child started on a node host: the owner of the link its channel must come over.
    _placed: dict[str, str] = attrs.field(factory=dict, init=False)
    #: Per node link: when (trio's clock) its latest leaf runs out.
    _link_until: dict[str, float] = attrs.field(factory=dict, init=False)

    @property
    def ca(self) -> SessionCA:
        if self._ca is None:
            self._ca = SessionCA(self.session)
        return self._ca

    async def fields_for(self, key: str, node: Path, fields: dict[str, Any]) -> dict[str, Any]:
        """The loadout fields of remote child *key*: the door's address (opening it), the door
        on its egress allowlist (taken off again at launch when its node host's link carries
        its channel: ``core._launching``), and its paths in its *node* directory
        (:func:`node_layout`): the checkout its node makes from the workspace's bundle, its
        scratch and TLS dir."""
        if self._door is None:
            self._door = TlsDoor(
                ca=self.ca,
                token_for=self.token_for,
                attach=self._attach,
                carries=self.carries,
                refuse=self.refuse,
                host=self.host,
                hello_timeout=self.hello_timeout,
                request_timeout=self.request_timeout,
            )
        address = await self._door.open_for(key, self.nursery)
        target = door_target(address)
        # Nothing is made here: the node's actor makes the node directory and all in it.
        layout = node_layout(node)
        return {
            **fields,
            "workspace": str(layout.checkout),
            "scratch": str(layout.scratch),
            "socket": address,
            "lease_s": self.lease_s,
            "tls": str(layout.tls),
            "egress": [*fields.get("egress", ()), target],
        }

    def certify(self, owner: str, csr: bytes) -> tuple[bytes, bytes]:
        """Sign a node's CSR for *owner* (refused if it names anyone else): leaf and CA PEM."""
        return self.ca.sign(csr, owner), self.ca.certificate_pem

    def terms_for(self, key: str, lease_s: float) -> RemoteTerms:
        """A remote child's lease and certificate terms, signed by this session's CA."""
        return RemoteTerms(
            owner=key, lease_s=lease_s, sign=lambda owner, csr: self.ca.sign(csr, owner)
        )

    @property
    def door_address(self) -> str:
        """The door's ``tls://HOST:PORT`` while it is open, else ``""``."""
        return "" if self._door is None else self._door.address

    def placed(self, link: str, key: str) -> None:
        """Child *key* starts on the node host whose link is *link*: its stream is taken from
        that link only (:meth:`carries`), until it is released."""
        self._placed[key] = link

    def carries(self, link: str, key: str) -> bool:
        """Whether child *key*'s stream may come over *link*."""
        return self._placed.get(key) == link

    def vouch(self, link: str, seconds: float) -> None:
        """*link*'s leaf was renewed for *seconds*: every channel it carries lives that long."""
        self._link_until[link] = trio.current_time() + seconds
        for key, carrier in self._placed.items():
            run = self.runs.get(key)
            if carrier == link and run is not None and run.terms is not None:
                run.terms.vouched(seconds)

    def release(self, key: str) -> None:
        self._placed.pop(key, None)
        if self._door is not None:
            self._door.release(key)

    async def _attach(
        self, channel: ipc.Channel, hello: ipc.Envelope, seconds: float, link: str = ""
    ) -> None:
        via = "link" if link else "tls"
        run = self.runs.get(channel.owner)
        if run is None or run.terms is None:
            self.refuse("owner", channel.owner, via=via)
            await channel.aclose("unknown owner")
            return
        if link:  # a link's leaf renewed since its handshake vouches for longer
            seconds = max(seconds, self._link_until.get(link, 0.0) - trio.current_time())
        run.terms.vouched(seconds)  # the channel lives no longer than its certificate
        # Its loadout was never a file here, and on its node it was gone before it started.
        await run.attach(channel, hello)
