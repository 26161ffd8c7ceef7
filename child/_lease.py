"""A remote child's lease: it may write only while its supervisor can still reach it.

Ownership locks live in the supervisor. A child on another node renews a lease over its
channel (:class:`ipc.Renew`) every third of ``loadout.lease_s``; the supervisor hands the child's
locks on only once the child is confirmed gone or its lease has run out. So when a child has
heard nothing for a whole lease — a partition, a supervisor frozen or gone without the
connection closing — it must be the first to give up: it kills its process group (every backend
and tool process in it; inside the sandbox, the whole pid namespace dies with the child) and
exits, before the supervisor could hand its paths to anyone else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Final, Protocol

import trio

import ipc

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["LEASE_EXPIRED", "Renewer", "hold_lease"]

#: The exit status of a child whose lease ran out (when it could not kill its group).
LEASE_EXPIRED: Final = 75


def give_up(lease_s: float) -> None:  # pragma: no cover - ends the process
    print(
        f"child: lease expired: no word from the supervisor for {lease_s:g} s; "
        "stopping every write and exiting",
        file=sys.stderr,
        flush=True,
    )
    with contextlib.suppress(OSError):
        if os.getpgrp() == os.getpid():
            os.killpg(0, signal.SIGKILL)  # the group is ours alone: it goes, this process too
    os._exit(LEASE_EXPIRED)


class Renewer(Protocol):
    """A leaf that renews over the channel (``child._tls.Credentials``)."""

    def due(self) -> bool: ...
    def csr(self) -> str: ...
    def accept(self, leaf_pem: str) -> None: ...


async def hold_lease(
    channel: ipc.Channel,
    lease_s: float,
    *,
    expired: Callable[[float], None] = give_up,
    certificate: Renewer | None = None,
) -> None:
    """Renew the lease until the channel closes; call *expired* once it has run out. With
    *certificate*, a renewal past two thirds of the leaf's life carries a CSR too."""
    interval = lease_s / 3
    renewed = trio.current_time()
    # The hello started the lease on the supervisor's side: the first renewal is due one
    # interval later, not now (a renewal at once cost every child a round trip for nothing).
    await trio.sleep(interval)
    while True:
        csr = certificate.csr() if certificate is not None and certificate.due() else ""
        try:
            reply = await channel.request(ipc.Renew(csr=csr), timeout=interval)
        except ipc.ChannelClosed:
            return  # the supervisor hung up: the runtime is ending anyway
        except ipc.IpcError:
            pass  # no answer in time: the lease runs on from the last one
        else:
            renewed = trio.current_time()
            leaf = reply.data.get("certificate") if isinstance(reply, ipc.Reply) else None
            if certificate is not None and csr and isinstance(leaf, str):
                try:
                    certificate.accept(leaf)
                except ValueError as exc:
                    print(f"child: certificate renewal refused: {exc}", file=sys.stderr)
        left = renewed + lease_s - trio.current_time()
        if left <= 0:
            expired(lease_s)
            return
        await trio.sleep(min(interval, left))
