"""The TLS door over real TCP and real TLS 1.3: a remote child's hello reaches its run only
with the session CA's certificate for that very owner and that owner's pending token; every
other caller is refused, counted by reason, and told nothing."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio

import ipc
from child._tls import client_context, install_certificate, make_key_and_csr
from orchestrator.remote._ca import SessionCA
from orchestrator.remote._door import TlsDoor

if TYPE_CHECKING:
    from collections.abc import Awaitable
    from pathlib import Path

SESSION = "s1"


@attrs.define
class Fleet:
    """Pending launches (owner → token), what attached and what was refused."""

    pending: dict[str, str]
    attached: list[str] = attrs.Factory(list)
    refused: list[tuple[str, str]] = attrs.Factory(list)

    def token_for(self, owner: str) -> str | None:
        return self.pending.get(owner)

    async def attach(
        self, channel: ipc.Channel, hello: ipc.Envelope, seconds: float, link: str = ""
    ) -> None:
        self.pending.pop(channel.owner, None)  # a token is good for one launch
        self.attached.append(channel.owner if not link else f"{channel.owner} via {link}")
        await channel.reply(hello.corr, ipc.Reply(ok=True, data={"key": channel.owner}))
        await channel.aclose("test done")

    def refuse(self, reason: str, owner: str, **evidence: Any) -> None:
        self.refused.append((reason, owner))


def node(tmp_path: Path, ca: SessionCA, owner: str, **sign: Any) -> Path:
    directory = tmp_path / f"node-{owner}-{len(list(tmp_path.iterdir()))}"
    directory.mkdir(mode=0o700)
    install_certificate(
        directory,
        ca.sign(make_key_and_csr(directory, SESSION, owner), owner, **sign),
        ca.certificate_pem,
    )
    return directory


async def hello(address: str, directory: Path, owner: str, token: str) -> str:
    """Dial *address* as *owner*; ``"ok"`` or the client's one-line error."""
    context = client_context(directory / "key.pem", directory / "cert.pem", directory / "ca.pem")
    return await said(
        owner,
        ipc.open_tls_client(
            address, context, owner=owner, token=token, hello=HELLO, request_timeout=WAIT_S
        ),
    )


#: A child's hello, and how long a test client waits for its answer.
HELLO = ipc.Hello(pid=1, backend="builtin")
WAIT_S = 10


async def said(owner: str, opening: Awaitable[tuple[ipc.Channel, ipc.Reply]]) -> str:
    """What the door said to *owner*'s hello (*opening*): ``"ok"`` or the one-line refusal."""
    try:
        channel, reply = await opening
    except ipc.HandshakeError as exc:
        return f"refused: {exc.reason}"
    await channel.aclose("bye")
    return "ok" if reply.data == {"key": owner} else f"odd reply {reply}"


async def run_door(
    tmp_path: Path, calls: list[tuple[str, str, str]], *, ca: SessionCA | None = None
) -> tuple[Fleet, list[str]]:
    """Open a door, make each ``(cert owner, hello owner, token)`` call, close it."""
    ca = ca or SessionCA(SESSION)
    fleet = Fleet(pending={"a1": "t" * 43, "a2": "u" * 43})
    door = TlsDoor(
        ca=ca, token_for=fleet.token_for, attach=fleet.attach, refuse=fleet.refuse, hello_timeout=5
    )
    results = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await door.open_for("a1", nursery)
            assert address.startswith("tls://127.0.0.1:")
            for cert_owner, hello_owner, token in calls:
                results.append(
                    await hello(address, node(tmp_path, ca, cert_owner), hello_owner, token)
                )
            door.release("a1")
            assert door.address == ""
    return fleet, results


async def test_a_child_with_its_own_certificate_and_token_attaches(tmp_path: Path) -> None:
    fleet, results = await run_door(tmp_path, [("a1", "a1", "t" * 43)])
    assert results == ["ok"]
    assert fleet.attached == ["a1"]
    assert fleet.refused == []


async def test_a_certificate_for_one_child_cannot_carry_anothers_hello(tmp_path: Path) -> None:
    # a2's token is right, but the certificate binds a1: the hello for a2 is never looked up.
    fleet, results = await run_door(tmp_path, [("a1", "a2", "u" * 43)])
    assert results == ["refused: eof"]
    assert fleet.attached == []
    assert fleet.refused == [("token", "a1")]


async def test_a_wrong_token_and_a_replayed_hello_are_refused(tmp_path: Path) -> None:
    good = ("a1", "a1", "t" * 43)
    fleet, results = await run_door(tmp_path, [("a1", "a1", "x" * 43), good, good])
    assert results == ["refused: eof", "ok", "refused: eof"]
    assert fleet.attached == ["a1"]
    assert fleet.refused == [("token", "a1"), ("token", "a1")]


async def test_a_foreign_or_expired_certificate_fails_the_handshake(tmp_path: Path) -> None:
    ca = SessionCA(SESSION)
    foreign = node(tmp_path, SessionCA(SESSION), "a1")
    (foreign / "ca.pem").unlink()
    (foreign / "ca.pem").write_bytes(ca.certificate_pem)  # trusts our server, wrong leaf
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    expired = node(tmp_path, ca, "a1", not_before=past)
    fleet = Fleet(pending={"a1": "t" * 43})
    door = TlsDoor(ca=ca, token_for=fleet.token_for, attach=fleet.attach, refuse=fleet.refuse)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await door.open_for("a1", nursery)
            got = [await hello(address, d, "a1", "t" * 43) for d in (foreign, expired)]
            door.release("a1")
    assert got == ["refused: hello", "refused: hello"]
    assert fleet.attached == []
    assert fleet.refused == [("certificate", ""), ("certificate", "")]


async def test_a_plain_tcp_client_gets_nothing(tmp_path: Path) -> None:
    ca = SessionCA(SESSION)
    fleet = Fleet(pending={"a1": "t" * 43})
    door = TlsDoor(ca=ca, token_for=fleet.token_for, attach=fleet.attach, refuse=fleet.refuse)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await door.open_for("a1", nursery)
            host, port = ipc.tls_address(address)
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(b"\x00\x00\x00\x10" + b"{" * 16)
            assert await stream.receive_some(100) == b""
            await stream.aclose()
            door.release("a1")
    assert fleet.refused == [("tls", "")]


@pytest.mark.parametrize(
    ("address", "parsed"),
    [("tls://127.0.0.1:9", ("127.0.0.1", 9)), ("tls://[::1]:443", ("::1", 443))],
)
def test_tls_addresses_parse(address: str, parsed: tuple[str, int]) -> None:
    assert ipc.tls_address(address) == parsed


@pytest.mark.parametrize("address", ["127.0.0.1:9", "tls://host", "tls://:9", "tls://h:x"])
def test_a_malformed_tls_address_is_one_clear_error(address: str) -> None:
    with pytest.raises(ValueError, match="not a tls://HOST:PORT address"):
        ipc.tls_address(address)
