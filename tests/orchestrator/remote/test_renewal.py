"""Certificate renewal over the channel, with the supervisor's own terms (``core._terms``) and
the child's own credentials (``child._tls``): a leaf past two thirds of its life is renewed
for a new key, the supervisor signs only for the child's owner, a channel whose certificate
runs out unrenewed is cut off, and the child takes only a leaf for the key it asked with."""

from __future__ import annotations

import datetime as dt
import socket
from typing import TYPE_CHECKING

import pytest
import trio
from cryptography import x509

import ipc
from child._lease import hold_lease
from child._tls import Credentials, install_certificate, make_key_and_csr, new_key_and_csr
from orchestrator.core._terms import RemoteTerms
from orchestrator.remote._ca import SessionCA, owner_of

if TYPE_CHECKING:
    from pathlib import Path

SESSION, OWNER = "s1", "a1"


def credentials(tmp_path: Path, ca: SessionCA, *, age_min: float) -> Credentials:
    """A child's credentials whose 45-minute leaf is *age_min* minutes old."""
    tmp_path.mkdir(exist_ok=True)
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=age_min)
    leaf = ca.sign(make_key_and_csr(tmp_path, SESSION, OWNER), OWNER, not_before=start)
    install_certificate(tmp_path, leaf, ca.certificate_pem)
    found, _context = Credentials.take(tmp_path, SESSION, OWNER)
    assert not (tmp_path / "key.pem").exists()  # in the process only, from here on
    return found


def never(lease: float) -> None:
    raise AssertionError(f"the lease of {lease} s ran out")


def terms(ca: SessionCA) -> RemoteTerms:
    return RemoteTerms(owner=OWNER, lease_s=0.6, sign=lambda owner, csr: ca.sign(csr, owner))


async def channel_to(nursery: trio.Nursery, supervisor: RemoteTerms) -> ipc.Channel:
    key = ipc.new_session_key()
    token = ipc.derive_token(key, OWNER)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    near = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    far = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))

    def immediate(body: ipc.Message) -> ipc.Message | None:
        return supervisor.renew(body) if isinstance(body, ipc.Renew) else None

    async def handle(envelope: ipc.Envelope) -> ipc.Message:
        return ipc.Reply(ok=False, error="unexpected")

    async def ignore(envelope: ipc.Envelope) -> None:
        return None

    async def accept() -> None:
        channel, hello = await ipc.accept_hello(near, {OWNER: token}.get)
        await channel.reply(hello.corr, ipc.Reply(ok=True))
        await channel.serve(handle, ignore, immediate=immediate)

    nursery.start_soon(accept)
    child, _ = await ipc.hello_on(far, owner=OWNER, token=token, hello=ipc.Hello(pid=1))
    nursery.start_soon(child.serve, handle, ignore)
    return child


async def test_a_leaf_past_two_thirds_of_its_life_is_renewed_for_a_new_key(tmp_path: Path) -> None:
    ca = SessionCA(SESSION)
    mine = credentials(tmp_path, ca, age_min=40)
    old_key, old_cert = mine.key, mine.cert
    supervisor = terms(ca)
    supervisor.vouched(5 * 60)  # what the handshake's leaf had left
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            child = await channel_to(nursery, supervisor)
            with trio.move_on_after(1.0):
                await hold_lease(child, 0.6, expired=never, certificate=mine)
            nursery.cancel_scope.cancel()
    assert mine.renewals == 1  # once: the new leaf is young
    assert (mine.key, mine.cert) != (old_key, old_cert)
    leaf = x509.load_pem_x509_certificate(mine.cert)
    assert owner_of(leaf, SESSION) == OWNER
    # The supervisor's deadline for the channel moved to the new leaf's end (~45 minutes).
    assert supervisor.certificate_until - trio.current_time() > 40 * 60


async def test_a_young_leaf_is_not_renewed(tmp_path: Path) -> None:
    ca = SessionCA(SESSION)
    mine = credentials(tmp_path, ca, age_min=1)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            child = await channel_to(nursery, terms(ca))
            with trio.move_on_after(0.8):
                await hold_lease(child, 0.6, expired=never, certificate=mine)
            nursery.cancel_scope.cancel()
    assert mine.renewals == 0


async def test_a_renewal_for_another_owner_is_refused() -> None:
    ca = SessionCA(SESSION)
    _key, csr = new_key_and_csr(SESSION, "a2")
    reply = terms(ca).renew(ipc.Renew(csr=csr.decode()))
    assert isinstance(reply, ipc.Reply)
    assert not reply.ok
    assert reply.error == (
        "certificate request refused: it names fleet://s1/a2, fleet://s1/a2, not owner 'a1'"
    )


def test_the_child_takes_only_a_leaf_for_the_key_it_asked_with(tmp_path: Path) -> None:
    ca = SessionCA(SESSION)
    mine = credentials(tmp_path, ca, age_min=40)
    mine.csr()
    _other, foreign_csr = new_key_and_csr(SESSION, OWNER)
    with pytest.raises(ValueError, match="not for the key this child asked with"):
        mine.accept(ca.sign(foreign_csr, OWNER).decode())
    assert mine.renewals == 0


async def test_a_channel_whose_certificate_runs_out_unrenewed_is_cut_off() -> None:
    ca = SessionCA(SESSION)
    supervisor, cut = terms(ca), []
    supervisor.vouched(0.3)
    with trio.fail_after(5):
        await supervisor.watch_certificate(lambda: cut.append(trio.current_time()))
    assert len(cut) == 1


async def test_a_renewed_certificate_moves_the_deadline() -> None:
    ca = SessionCA(SESSION)
    supervisor, cut = terms(ca), []
    supervisor.vouched(0.3)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.watch_certificate, lambda: cut.append(1))
        await trio.sleep(0.2)
        supervisor.vouched(0.4)
        await trio.sleep(0.3)
        assert cut == []  # 0.5 s in, past the first deadline, inside the second
        await trio.sleep(0.3)
    assert cut == [1]
