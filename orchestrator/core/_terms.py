"""A remote child's terms, held by its run: the lease it renews and the certificate it renews.

- **Lease** (``child._lease``): every ``renew`` moves :attr:`RemoteTerms.lease_until` on by
  ``lease_s``. Before a remote child's locks go to anyone else, its run waits out the lease
  unless the child's exit was confirmed (:meth:`RemoteTerms.outwait`): a child cut off from us
  stops writing by itself within that time.
- **Certificate**: leaves live 45 minutes. A ``renew`` carrying a CSR gets a new leaf signed for
  this child's owner only (a CSR naming anyone else is refused in one line), and the channel's
  certificate deadline moves to the new leaf's end. A child that lets its leaf run out without
  renewing is cut off (:meth:`RemoteTerms.watch_certificate`): a channel is never older than the
  certificate that vouches for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio

import ipc
from orchestrator.remote._ca import CertificateRefused, seconds_left

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["RemoteTerms"]


@attrs.define(eq=False)
class RemoteTerms:
    """One remote child's lease and certificate deadline (``trio.current_time()`` clock)."""

    owner: str
    lease_s: float
    #: ``sign(owner, csr_pem) -> leaf_pem``: the session CA.
    sign: Callable[[str, bytes], bytes]
    lease_until: float = 0.0
    certificate_until: float = 0.0
    _moved: trio.Event = attrs.Factory(trio.Event)

    def heard(self) -> None:
        """A hello or a renewal: the lease runs from now."""
        self.lease_until = trio.current_time() + self.lease_s

    def vouched(self, seconds: float) -> None:
        """The channel's certificate is good for *seconds* more."""
        self.certificate_until = trio.current_time() + seconds
        self._moved.set()
        self._moved = trio.Event()

    def renew(self, body: ipc.Renew) -> ipc.Message:
        """Answer a ``renew`` (on the channel's reader): the lease, and a new leaf for a CSR."""
        self.heard()
        data: dict[str, object] = {"lease_s": self.lease_s}
        if body.csr:
            try:
                leaf = self.sign(self.owner, body.csr.encode())
            except CertificateRefused as exc:
                return ipc.Reply(ok=False, error=str(exc))
            self.vouched(seconds_left(leaf))
            data["certificate"] = leaf.decode()
        return ipc.Reply(ok=True, data=data)

    async def watch_certificate(self, expired: Callable[[], object]) -> None:
        """Call *expired* once the channel's certificate has run out unrenewed."""
        while self.certificate_until:
            moved = self._moved
            with trio.move_on_at(self.certificate_until):
                await moved.wait()
                continue
            expired()
            return

    async def outwait(self, confirmed_exit: bool) -> None:
        """Before the child's locks are handed on: it is confirmed gone, or its lease is out."""
        if self.lease_until and not confirmed_exit:
            with trio.move_on_at(self.lease_until):
                await trio.sleep_forever()
