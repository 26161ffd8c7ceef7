"""A node host's link (``orchestrator.launch._node_link``) against the real door: its key made
and kept in the host's memory only, a leaf taken only for that key and owner, each child's
socket pair relayed over one mutual-TLS connection, and the link dialled again when the door
has moved."""

from __future__ import annotations

import datetime as dt
import os
import socket
from typing import Any

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import ipc
from orchestrator.launch._node_link import NodeLink
from orchestrator.launch._node_loop import NodeLoop
from orchestrator.remote._ca import SessionCA, owner_of
from orchestrator.remote._door import TlsDoor
from tests.orchestrator.remote.test_door import HELLO, SESSION, WAIT_S, Fleet, said

LINK = "host." + "5e" * 8


@pytest.fixture
def ca() -> SessionCA:
    return SessionCA(SESSION)


def linked(ca: SessionCA, owner: str = LINK) -> NodeLink:
    link = NodeLink(NodeLoop("test-link"))
    link.accept(ca.sign(link.request(SESSION, owner), owner), ca.certificate_pem)
    return link


def test_only_a_link_owner_may_ask_and_the_csr_carries_no_key(ca: SessionCA) -> None:
    link = NodeLink(NodeLoop("test-link"))
    for owner in ("a1", "host.", "host.XYZ", "host.ab/cd", f"{LINK}\n"):
        with pytest.raises(RuntimeError, match="not a link owner"):
            link.request(SESSION, owner)
    csr = link.request(SESSION, LINK)
    assert b"PRIVATE" not in csr
    assert owner_of(x509.load_pem_x509_certificate(ca.sign(csr, LINK)), SESSION) == LINK


def test_a_leaf_for_another_key_or_owner_or_unasked_is_refused(ca: SessionCA) -> None:
    link = NodeLink(NodeLoop("test-link"))
    with pytest.raises(RuntimeError, match="nobody asked for"):
        link.accept(ca.sign(NodeLink(NodeLoop()).request(SESSION, LINK), LINK), ca.certificate_pem)
    link.request(SESSION, LINK)
    stranger = NodeLink(NodeLoop("x")).request(SESSION, LINK)  # the same owner, another key
    with pytest.raises(RuntimeError, match="not for its key"):
        link.accept(ca.sign(stranger, LINK), ca.certificate_pem)
    csr = link.request(SESSION, LINK)
    other = f"fleet://{SESSION}/host.{'77' * 8}"
    with pytest.raises(RuntimeError, match="not for its key"):
        link.accept(_leaf_for(csr, other), ca.certificate_pem)  # its key, another name
    assert link.owner == ""


def _leaf_for(csr: bytes, uri: str) -> bytes:
    """A leaf for *csr*'s key that names *uri* (not what the CSR asked for)."""
    request = x509.load_pem_x509_csr(csr)
    issuer = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, uri)])
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(request.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(minutes=10))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False
        )
        .sign(issuer, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


def test_the_key_is_on_no_disk_and_in_no_open_descriptor(ca: SessionCA, tmp_path: Any) -> None:
    before = set(os.listdir("/proc/self/fd"))
    link = linked(ca)
    assert link.owner == LINK
    left = {
        os.readlink(f"/proc/self/fd/{fd}")
        for fd in set(os.listdir("/proc/self/fd")) - before
        if os.path.exists(f"/proc/self/fd/{fd}")
    }
    assert not any("fleet-link" in target for target in left), left


async def test_children_relayed_over_one_link_attach_and_the_link_redials_a_moved_door(
    ca: SessionCA,
) -> None:
    fleet = Fleet(pending={"a1": "t" * 43, "a2": "u" * 43})
    placed = {"a1": LINK, "a2": LINK}
    link = linked(ca)
    dials: list[str] = []

    def carries(via: str, key: str) -> bool:
        dials.append(key)
        return placed.get(key) == via

    door = TlsDoor(
        ca=ca,
        token_for=fleet.token_for,
        attach=fleet.attach,
        refuse=fleet.refuse,
        carries=carries,
        hello_timeout=5,
    )

    async def child(address: str, owner: str, token: str) -> str:
        ours, theirs = socket.socketpair()
        await trio.to_thread.run_sync(link.carry, address, owner, ours)
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
        opening = ipc.hello_on(
            stream, owner=owner, token=token, hello=HELLO, request_timeout=WAIT_S
        )
        return await said(owner, opening)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            first = await door.open_for("a1", nursery)
            assert await child(first, "a1", "t" * 43) == "ok"
            door.release("a1")  # the door closes: the link breaks with it
        async with trio.open_nursery() as nursery:
            second = await door.open_for("a2", nursery)
            assert second != first
            assert await child(second, "a2", "u" * 43) == "ok"  # dialled again, there
            # Placed nowhere: the door closes its stream at once, so the child finds its
            # connection ended at its hello, or already before it wrote it.
            assert await child(second, "zz", "t" * 43) in {"refused: eof", "refused: hello"}
            door.release("a2")
    assert fleet.attached == [f"a1 via {LINK}", f"a2 via {LINK}"]
    assert fleet.refused == [("link", "zz")]


async def test_a_link_without_a_leaf_refuses_to_dial_and_closes_the_childs_end() -> None:
    link = NodeLink(NodeLoop("test-link"))
    ours, theirs = socket.socketpair()
    with pytest.raises(RuntimeError, match="no certificate yet"):
        await trio.to_thread.run_sync(link.carry, "tls://127.0.0.1:9", "a1", ours)
    assert ours.fileno() == -1
    assert theirs.recv(1) == b""  # the child would see its connection end at once
    theirs.close()
