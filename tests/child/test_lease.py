"""A remote child's lease over a real authenticated channel (a socket pair, the real hello):
renewed while the supervisor answers, given up a lease after the last answer when it stops
answering (a partition, a frozen supervisor), and never while the channel is merely closed."""

from __future__ import annotations

import functools
import socket

import pytest
import trio

import ipc
from child._lease import hold_lease

OWNER = "a1"
LEASE = 0.6


class Supervisor:
    """The supervisor's end: answers renewals while :attr:`answering`, then goes silent."""

    def __init__(self) -> None:
        self.answering = True
        self.renewals = 0
        self.silent = trio.Event()

    def immediate(self, body: ipc.Message) -> ipc.Message | None:
        return None

    async def handle(self, envelope: ipc.Envelope) -> ipc.Message:
        if not isinstance(envelope.body, ipc.Renew):
            return ipc.Reply(ok=False, error="unexpected")
        if not self.answering:
            await trio.sleep_forever()  # frozen: the connection stays up, nothing comes back
        self.renewals += 1
        return ipc.Reply(ok=True, data={"lease_s": LEASE})

    async def ignore(self, envelope: ipc.Envelope) -> None:
        return None


async def pair(nursery: trio.Nursery, supervisor: Supervisor) -> ipc.Channel:
    key = ipc.new_session_key()
    token = ipc.derive_token(key, OWNER)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    near = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    far = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))

    async def accept() -> None:
        channel, hello = await ipc.accept_hello(near, {OWNER: token}.get)
        await channel.reply(hello.corr, ipc.Reply(ok=True))
        await channel.serve(supervisor.handle, supervisor.ignore, immediate=supervisor.immediate)

    nursery.start_soon(accept)
    child, _ = await ipc.hello_on(far, owner=OWNER, token=token, hello=ipc.Hello(pid=1))
    nursery.start_soon(child.serve, supervisor.handle, supervisor.ignore)
    return child


async def test_a_lease_renewed_in_time_never_runs_out() -> None:
    supervisor, expired = Supervisor(), list[float]()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            child = await pair(nursery, supervisor)
            with trio.move_on_after(LEASE * 4):
                await hold_lease(child, LEASE, expired=expired.append)
            nursery.cancel_scope.cancel()
    assert expired == []
    assert supervisor.renewals >= 6  # every third of the lease


async def test_the_first_renewal_waits_a_third_of_the_lease_after_the_hello() -> None:
    """The hello started the lease on the supervisor's side: a renewal at once would cost
    every child a round trip for nothing."""
    supervisor, expired = Supervisor(), list[float]()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            child = await pair(nursery, supervisor)
            nursery.start_soon(functools.partial(hold_lease, child, LEASE, expired=expired.append))
            await trio.sleep(LEASE / 6)
            assert supervisor.renewals == 0
            with trio.fail_after(LEASE * 3):
                while supervisor.renewals == 0:  # noqa: ASYNC110 - counted by the handler
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert expired == []


async def test_a_child_unheard_for_a_whole_lease_gives_up() -> None:
    supervisor, expired = Supervisor(), list[float]()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            child = await pair(nursery, supervisor)

            async def freeze() -> None:
                await trio.sleep(LEASE)
                supervisor.answering = False
                supervisor.silent.set()

            nursery.start_soon(freeze)
            await supervisor.silent.wait()
            frozen_at = trio.current_time()
            await hold_lease(child, LEASE, expired=expired.append)
            gave_up = trio.current_time() - frozen_at
            nursery.cancel_scope.cancel()
    assert expired == [LEASE]
    # Within the lease of the last answer, and not long after it ran out.
    assert gave_up <= LEASE + LEASE / 3 + 0.3, gave_up


async def test_a_closed_channel_ends_the_lease_quietly() -> None:
    supervisor, expired = Supervisor(), list[float]()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            child = await pair(nursery, supervisor)
            await child.aclose("the supervisor hung up")
            await hold_lease(child, LEASE, expired=expired.append)
            nursery.cancel_scope.cancel()
    assert expired == []


@pytest.mark.parametrize("bad", [-1.0, 1e9, True])
def test_a_loadout_lease_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="lease_s"):
        ipc.Loadout(
            session="s",
            owner="a1",
            name="n",
            agent="scout",
            token="t",  # noqa: S106 - not a secret
            socket="",
            workspace="/",
            lease_s=bad,
        )
