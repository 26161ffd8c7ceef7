"""The background shells' guardian: SIGKILLs their process groups when the child dies.

``PR_SET_PDEATHSIG`` reaches only a shell's leader; what the leader started (a pipeline, a
server behind ``&``) would outlive a child that was SIGKILLed. The child starts this script
once, in its own session, with the read end of a pipe whose write end only the child holds
(close-on-exec, so no shell inherits it). The child writes ``+PGID`` when a shell starts and
``-PGID`` once its group is gone. End of file — the child exited, however it died — makes the
guardian SIGKILL every group still listed, then exit.

Run as a plain script (``python -I -S _shellguard.py FD``): standard library only, no package
import, so it starts fast anywhere the child runs (inside its sandbox too).
"""

import contextlib
import os
import signal
import sys


def guard(fd: int) -> set[int]:
    """Read registrations from *fd* until end of file; the groups still listed then."""
    groups: set[int] = set()
    pending = b""
    while chunk := os.read(fd, 4096):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                value = int(line)
                if value > 1:
                    groups.add(value)
                elif value < -1:
                    groups.discard(-value)
    return groups


def main(argv: list[str]) -> int:
    # Only the pipe ends this process: not a terminal's ^C or hang-up, nor a TERM to the child.
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    for pgid in guard(int(argv[1])):
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
