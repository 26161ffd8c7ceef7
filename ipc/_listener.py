"""The supervisor's listening socket: safe to create, bound exactly once, retryable.

The socket file is 0600 inside a 0700 directory that we own (checked with ``lstat``, so a
symlink is refused). A stale socket of ours is unlinked; a non-socket at the path is refused;
a live listener at the path is refused. Concurrent first users share one in-flight bind; a
failed bind closes the socket, unlinks the path, clears the memo and may be retried.
"""

import contextlib
import errno
import os
import socket
import stat
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import attrs
import trio

from ipc._errors import ListenerError

SUN_PATH_MAX: Final = 104 if sys.platform == "darwin" else 108


def ensure_private_dir(path: Path) -> None:
    """Create *path* as a 0700 directory, or check that an existing one is ours and 0700."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise ListenerError(f"socket directory {path} is not a directory (remove it)")
    if st.st_uid != os.geteuid():
        raise ListenerError(f"socket directory {path} is owned by uid {st.st_uid}, not us")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)  # ours, so tighten it rather than refuse


def _clear_stale(path: Path) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ListenerError(f"listen on {path}: a non-socket file is in the way (remove it)")
    if st.st_uid != os.geteuid():
        raise ListenerError(f"listen on {path}: the socket there belongs to uid {st.st_uid}")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Non-blocking: a live listener with a full backlog answers EAGAIN instead of hanging us.
    probe.setblocking(False)  # noqa: FBT003 - the stdlib's positional flag
    try:
        probe.connect(os.fspath(path))
    except BlockingIOError:
        raise ListenerError(
            f"listen on {path}: another supervisor is listening there (its backlog is full)"
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise ListenerError(f"listen on {path}: cannot probe the old socket: {exc}") from None
        path.unlink(missing_ok=True)  # stale: nobody listens
    else:
        raise ListenerError(f"listen on {path}: another supervisor is listening there")
    finally:
        probe.close()


@attrs.define(eq=False)
class Listener:
    """A Unix listening socket bound on first use."""

    path: Path
    backlog: int = 128
    _bound: trio.SocketListener | None = attrs.field(default=None, init=False)
    _binding: trio.Event | None = attrs.field(default=None, init=False)
    _error: ListenerError | None = attrs.field(default=None, init=False)
    bind_count: int = attrs.field(default=0, init=False)

    async def ensure_bound(self) -> trio.SocketListener:
        """Bind (once) and return the listener; concurrent callers share one bind."""
        while True:
            if self._bound is not None:
                return self._bound
            if self._binding is None:
                break
            await self._binding.wait()
            if self._bound is None and self._error is not None:
                raise self._error
        self._binding = trio.Event()
        self._error = None
        try:
            self._bound = await self._bind()
        except ListenerError as exc:
            self._error = exc
            raise
        except OSError as exc:
            self._error = ListenerError(f"listen on {self.path}: {exc}")
            raise self._error from None
        finally:
            event, self._binding = self._binding, None
            event.set()
        return self._bound

    async def _bind(self) -> trio.SocketListener:
        self.bind_count += 1
        raw = os.fsencode(self.path)
        if len(raw) >= SUN_PATH_MAX:
            raise ListenerError(
                f"listen on {self.path}: path is {len(raw)} bytes, the limit is "
                f"{SUN_PATH_MAX - 1} (use a shorter FLEET_HOME)"
            )
        ensure_private_dir(self.path.parent)
        _clear_stale(self.path)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # No umask dance: trio binds in a worker thread, and a process-wide umask held
            # across that await would leak into every file other tasks create meanwhile. The
            # 0700 directory already keeps other users out until the chmod below.
            await sock.bind(os.fspath(self.path))
            os.chmod(self.path, 0o600)
            sock.listen(self.backlog)
        except BaseException:
            sock.close()
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(self.path.lstat().st_mode):
                    self.path.unlink()
            raise
        return trio.SocketListener(sock)

    async def serve(
        self,
        handler: Callable[[trio.SocketStream], Awaitable[None]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept forever, running *handler* for each connection in its own task."""
        listener = await self.ensure_bound()
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                try:
                    stream = await listener.accept()
                except trio.ClosedResourceError:
                    return
                nursery.start_soon(handler, stream)

    async def aclose(self) -> None:
        """Close the socket and unlink its path."""
        if self._bound is not None:
            bound, self._bound = self._bound, None
            await bound.aclose()
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(self.path.lstat().st_mode):
                    self.path.unlink()
