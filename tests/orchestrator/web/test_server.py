"""The web server's lifetime beside its session's supervisor."""

import fcntl
import os

import trio

from orchestrator.web._server import ORPHAN_EXIT, _while_supervised


async def test_the_server_ends_once_its_session_has_no_supervisor(tmp_path, autojump_clock):
    lock = tmp_path / "supervisor.lock"
    lock.write_text("4242")
    fd = os.open(lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a supervisor holds the session
    quit_ = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_while_supervised, lock, quit_)
        await trio.sleep(ORPHAN_EXIT * 3)
        assert not quit_.is_set()
        os.close(fd)  # it ended
        gone = trio.current_time()
        await quit_.wait()
        assert ORPHAN_EXIT <= trio.current_time() - gone <= ORPHAN_EXIT + 10
