"""The session CA over real TCP sockets with real TLS 1.3: owner binding and each refusal."""

from __future__ import annotations

import datetime as dt
import functools
import ssl
import stat
from typing import TYPE_CHECKING

import pytest
import trio
from cryptography import x509

from child._tls import client_context, install_certificate, make_key_and_csr
from orchestrator.remote._ca import CertificateRefused, SessionCA, check_peer

if TYPE_CHECKING:
    from pathlib import Path

SESSION = "s1"


def node(tmp_path: Path, ca: SessionCA, owner: str, name: str | None = None, **sign) -> Path:
    directory = tmp_path / (name or owner)
    directory.mkdir(mode=0o700)
    csr = make_key_and_csr(directory, SESSION, owner)
    install_certificate(directory, ca.sign(csr, owner, **sign), ca.certificate_pem)
    return directory


def context_of(directory: Path) -> ssl.SSLContext:
    return client_context(directory / "key.pem", directory / "cert.pem", directory / "ca.pem")


async def dial(
    server: ssl.SSLContext,
    client: ssl.SSLContext,
    hello_owner: str,
    tickets: list[bool] | None = None,
) -> str:
    """One real TLS connection on 127.0.0.1; the server checks the peer against the hello.
    *tickets* gets whether the client was given a session ticket by the server's answer."""
    result: list[str] = []
    done = trio.Event()

    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        try:
            await stream.do_handshake()
            owner = (await stream.receive_some(100)).decode()
            check_peer(stream._ssl_object, SESSION, owner)
            result.append("ok")
            await stream.send_all(b"ok")
        except (CertificateRefused, trio.BrokenResourceError) as exc:
            result.append(str(exc.__cause__ or exc))
        finally:
            done.set()
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_ssl_over_tcp, host="127.0.0.1")
        listeners = await nursery.start(serve, handler, 0, server)
        port = listeners[0].transport_listener.socket.getsockname()[1]
        stream = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1", port, ssl_context=client, https_compatible=False
        )
        try:
            await stream.send_all(hello_owner.encode())
            await stream.receive_some(10)
            if tickets is not None:
                session = stream._ssl_object.session
                tickets.append(session is not None and session.has_ticket)
        except (trio.BrokenResourceError, ssl.SSLError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(stream)
        with trio.fail_after(20):
            await done.wait()
        nursery.cancel_scope.cancel()
    return result[0]


async def test_an_owner_bound_certificate_connects(tmp_path):
    ca = SessionCA(SESSION)
    directory = node(tmp_path, ca, "a1")
    for name in ("key.pem", "cert.pem", "ca.pem"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    assert await dial(ca.server_context("127.0.0.1"), context_of(directory), "a1") == "ok"


async def test_a1_certificate_with_a2_hello_is_refused(tmp_path):
    ca = SessionCA(SESSION)
    got = await dial(ca.server_context("127.0.0.1"), context_of(node(tmp_path, ca, "a1")), "a2")
    assert got == "hello refused: certificate is for owner 'a1', hello claims 'a2'"


async def test_a_certificate_from_a_foreign_ca_is_refused(tmp_path):
    ours, foreign = SessionCA(SESSION), SessionCA(SESSION)
    directory = node(tmp_path, foreign, "a1")
    # The node trusts our CA for the server, but its own leaf comes from a foreign CA.
    (directory / "ca.pem").unlink()
    (directory / "ca.pem").write_bytes(ours.certificate_pem)
    got = await dial(ours.server_context("127.0.0.1"), context_of(directory), "a1")
    assert "CERTIFICATE_VERIFY_FAILED" in got, got
    assert "certificate signature failure" in got, got


async def test_an_expired_certificate_is_refused(tmp_path):
    ca = SessionCA(SESSION)
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    directory = node(tmp_path, ca, "a1", not_before=past)
    got = await dial(ca.server_context("127.0.0.1"), context_of(directory), "a1")
    assert "certificate has expired" in got, got


def test_a_csr_for_another_owner_is_refused(tmp_path):
    ca = SessionCA(SESSION)
    csr = make_key_and_csr(tmp_path, SESSION, "a2")
    with pytest.raises(CertificateRefused) as refused:
        ca.sign(csr, "a1")
    assert str(refused.value) == (
        "certificate request refused: it names fleet://s1/a2, fleet://s1/a2, not owner 'a1'"
    )
    with pytest.raises(CertificateRefused, match="not a PEM CSR"):
        ca.sign(b"junk", "a1")


def test_leaf_lifetime_is_within_30_to_60_minutes(tmp_path):
    ca = SessionCA(SESSION)
    leaf = x509.load_pem_x509_certificate(ca.sign(make_key_and_csr(tmp_path, SESSION, "a1"), "a1"))
    life = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert dt.timedelta(minutes=30) <= life <= dt.timedelta(minutes=60)


async def test_the_door_gives_no_session_ticket(tmp_path):
    """Every child is a new process with a key of its own: a ticket would never be used, and
    each cost both ends work at every handshake."""
    ca = SessionCA(SESSION)
    tickets: list[bool] = []
    server = ca.server_context("127.0.0.1")
    assert await dial(server, context_of(node(tmp_path, ca, "a1")), "a1", tickets) == "ok"
    assert tickets == [False]
