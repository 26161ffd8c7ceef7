"""Where a requester the reader lent its socket to waits: a duplicate of the descriptor.

A lender (:mod:`ipc._lending`) waits for its response on the channel's socket while the
reader is parked. It waits on a duplicate of the descriptor that only lenders wait on, so
that the deadline keeper, or a close, can wake it alone with ``ClosedResourceError``: never
a writer parked on the same socket, never the reader (trio allows one waiter for reading per
descriptor, and wakes every waiter on it when it closes).
"""

import os

import attrs
import trio


@attrs.define(eq=False)
class LendWait:
    """The lenders' duplicate of one socket's descriptor, made on the first wait."""

    fd: int
    duplicate: int | None = None

    async def wait(self) -> None:
        """Await until the socket is readable."""
        if self.duplicate is None:
            self.duplicate = os.dup(self.fd)  # not inheritable, like every dup in Python
        await trio.lowlevel.wait_readable(self.duplicate)

    def interrupt(self) -> None:
        """Wake a task parked in :meth:`wait` with ``ClosedResourceError``."""
        fd, self.duplicate = self.duplicate, None
        if fd is not None:
            # trio's rule: notify, then close (a later wait makes a fresh duplicate).
            trio.lowlevel.notify_closing(fd)
            os.close(fd)
