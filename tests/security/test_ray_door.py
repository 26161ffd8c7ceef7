"""A hostile peer at the TLS door remote children dial (over real TCP and TLS 1.3): it trusts the
session CA (a child's TLS directory on its node holds ``ca.pem``) but presents no certificate,
or the certificate of a child that already attached, with that child's spent token. Each is
refused, counted, and told nothing; no hello is ever looked up for it.

(A foreign CA, an expired leaf, a leaf for another owner and a replayed hello are in
``tests/orchestrator/remote/test_door.py`` and ``test_ca.py``.)
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

import trio

import ipc
from orchestrator.remote._ca import SessionCA
from orchestrator.remote._door import TlsDoor
from tests.orchestrator.remote.test_door import SESSION, Fleet, hello, node

if TYPE_CHECKING:
    from pathlib import Path


async def test_a_peer_with_no_client_certificate_is_refused_before_any_hello(
    tmp_path: Path,
) -> None:
    ca = SessionCA(SESSION)
    looked_up: list[str] = []
    fleet = Fleet(pending={"a1": "t" * 43})

    def token_for(owner: str) -> str | None:
        looked_up.append(owner)
        return fleet.token_for(owner)

    door = TlsDoor(ca=ca, token_for=token_for, attach=fleet.attach, refuse=fleet.refuse)
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cadata=ca.certificate_pem.decode()
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    answered = b""
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await door.open_for("a1", nursery)
            host, port = ipc.tls_address(address)
            tcp = await trio.open_tcp_stream(host, port)
            stream = trio.SSLStream(tcp, context, server_hostname=host)
            try:
                await stream.do_handshake()  # TLS 1.3: the server's verdict comes after this
                body = b'{"v":1,"token":"' + b"t" * 43 + b'","owner":"a1","corr":"1",'
                body += b'"kind":"request","type":"hello","body":{"pid":1,"backend":"builtin"}}'
                await stream.send_all(len(body).to_bytes(4, "big") + body)
                while chunk := await stream.receive_some(4096):
                    answered += chunk
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                await trio.aclose_forcefully(stream)
            door.release("a1")
    assert answered == b""  # not a byte of an answer
    assert looked_up == []  # no hello was read, no token looked up
    assert fleet.attached == []
    assert fleet.refused == [("certificate", "")]
    assert fleet.pending == {"a1": "t" * 43}  # a1's launch is still waiting for a1 itself


async def test_a_certificate_and_token_that_already_attached_open_nothing_more(
    tmp_path: Path,
) -> None:
    # A hostile child on its node holds its own key, certificate and (spent) token: dialling
    # again, as itself or as a sibling, gets nothing.
    ca = SessionCA(SESSION)
    fleet = Fleet(pending={"a1": "t" * 43, "a2": "u" * 43})
    door = TlsDoor(
        ca=ca, token_for=fleet.token_for, attach=fleet.attach, refuse=fleet.refuse, hello_timeout=5
    )
    own = node(tmp_path, ca, "a1")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await door.open_for("a1", nursery)
            got = [
                await hello(address, own, "a1", "t" * 43),  # its one launch
                await hello(address, own, "a1", "t" * 43),  # again, with the spent token
                await hello(address, own, "a2", "u" * 43),  # as a sibling, with its token
                await hello(address, own, "control", "t" * 43),  # as the parent
            ]
            door.release("a1")
    assert got == ["ok", "refused: eof", "refused: eof", "refused: eof"]
    assert fleet.attached == ["a1"]
    assert fleet.refused == [("token", "a1")] * 3
    assert fleet.pending == {"a2": "u" * 43}
