"""Admission: a socket pair end admits its own child only; a pane's hello is bound to a pid."""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import attrs
import psutil
import pytest
import trio

import ipc
from orchestrator.core._admission import (
    ListenerDoor,
    Refusals,
    accept_own,
    descends_from,
    inherited_pair,
    peer_pid,
)

if TYPE_CHECKING:
    from orchestrator._config import Config
    from orchestrator.core._run import ChildRun

TOKEN = ipc.derive_token(b"k" * 32, "a1")


async def _hello(sock: socket.socket, owner: str, token: str) -> ipc.Reply:
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    channel, reply = await ipc.hello_on(
        stream, owner=owner, token=token, hello=ipc.Hello(pid=os.getpid())
    )
    await channel.aclose("done")
    return reply


async def test_the_pair_admits_its_own_child(nursery):
    ours, theirs = inherited_pair()
    assert not os.get_inheritable(theirs.fileno())
    with trio.fail_after(10):
        replies: list[ipc.Reply] = []
        replied = trio.Event()

        async def child() -> None:
            replies.append(await _hello(theirs, "a1", TOKEN))
            replied.set()

        nursery.start_soon(child)
        channel, hello = await accept_own(ours, "a1", lambda: TOKEN, timeout=5, request_timeout=5)
        assert channel.owner == "a1"
        await channel.reply(hello.corr, ipc.Reply(ok=True))
        await replied.wait()
    assert replies[0].ok
    await channel.aclose("done")


@pytest.mark.parametrize(
    ("owner", "token"),
    [("a2", ipc.derive_token(b"k" * 32, "a2")), ("a1", "0" * 64)],
    ids=["another-owner-with-its-token", "wrong-token"],
)
async def test_the_pair_refuses_any_other_hello(owner, token, nursery):
    ours, theirs = inherited_pair()
    with trio.fail_after(10):
        refused = trio.Event()

        async def child() -> None:
            with pytest.raises(ipc.HandshakeError):
                await _hello(theirs, owner, token)
            refused.set()

        nursery.start_soon(child)
        with pytest.raises(ipc.HandshakeError) as caught:
            await accept_own(ours, "a1", lambda: TOKEN, timeout=5, request_timeout=5)
        assert caught.value.reason == "token"
        await refused.wait()


async def test_the_pair_refuses_once_its_token_is_spent(nursery):
    ours, theirs = inherited_pair()
    with trio.fail_after(10):
        nursery.start_soon(_quiet_hello, theirs)
        with pytest.raises(ipc.HandshakeError):
            await accept_own(ours, "a1", lambda: None, timeout=5, request_timeout=5)


async def _quiet_hello(sock: socket.socket) -> None:
    with pytest.raises(ipc.HandshakeError):
        await _hello(sock, "a1", TOKEN)


def test_peer_pid_names_the_connecting_process(tmp_path):
    path = str(tmp_path / "s")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    code = (
        f"import socket,time; s=socket.socket(socket.AF_UNIX); s.connect({path!r}); time.sleep(5)"
    )
    with subprocess.Popen([sys.executable, "-c", code]) as process:
        try:
            conn, _ = server.accept()
            assert peer_pid(conn) == process.pid
            conn.close()
        finally:
            process.kill()
    server.close()


def test_descends_from_walks_the_parent_chain():
    code = (
        "import subprocess,sys; subprocess.run([sys.executable,'-c','import time; time.sleep(30)'])"
    )
    with subprocess.Popen([sys.executable, "-c", code]) as parent:
        try:
            kids: list[psutil.Process] = []
            for _ in range(250):
                kids = psutil.Process(parent.pid).children()
                if kids:
                    break
                time.sleep(0.02)
            [grandchild] = kids
            assert descends_from(grandchild.pid, parent.pid)
            assert descends_from(parent.pid, parent.pid)
            assert not descends_from(parent.pid, grandchild.pid)
            assert not descends_from(os.getpid(), parent.pid)
        finally:
            for kid in psutil.Process(parent.pid).children(recursive=True):
                kid.kill()
            parent.kill()


def test_refusals_count_by_reason_and_log_each():
    logged: list[tuple[str, dict[str, object]]] = []
    refusals = Refusals(log=lambda owner, args: logged.append((owner, dict(args))))
    refusals.refuse("token", "", via="listener")
    refusals.refuse("peer-pid", "a1", via="listener", pid=42)
    refusals.refuse("token", "a2", via="pair")
    assert refusals.counts == {"token": 2, "peer-pid": 1}
    assert refusals.total == 3
    assert logged[1] == ("a1", {"reason": "peer-pid", "via": "listener", "pid": 42})


@attrs.define
class _PaneRun:
    """What the listener's pid check reads of a pane child's run."""

    launched: SimpleNamespace | None
    started: trio.Event = attrs.Factory(trio.Event)
    done: trio.Event = attrs.Factory(trio.Event)


def _door() -> ListenerDoor:
    return ListenerDoor(
        runs={},
        config=cast("Config", SimpleNamespace(hello_timeout=5.0)),
        refusals=Refusals(log=lambda *_: None),
    )


@pytest.fixture
def pane_tree() -> Iterator[tuple[int, int]]:
    """A pane's launched process (a shell, say) and the child it started: their pids."""
    code = (
        "import subprocess,sys; subprocess.run([sys.executable,'-c','import time; time.sleep(30)'])"
    )
    with subprocess.Popen([sys.executable, "-c", code]) as launched:
        try:
            kids: list[psutil.Process] = []
            for _ in range(250):
                kids = psutil.Process(launched.pid).children()
                if kids:
                    break
                time.sleep(0.02)
            [child] = kids
            yield launched.pid, child.pid
        finally:
            for kid in psutil.Process(launched.pid).children(recursive=True):
                kid.kill()
            launched.kill()


async def test_a_pane_hello_is_admitted_from_the_launched_process_tree_only(pane_tree):
    # The hello comes from the child, a descendant of the launched process; the launched
    # process's ancestors (this process) and unrelated processes are refused.
    launched, child = pane_tree
    run = _PaneRun(launched=SimpleNamespace(pid=launched))
    run.started.set()
    pane, door = cast("ChildRun", run), _door()
    with trio.fail_after(10):
        assert await door._launched_by(pane, child)
        assert await door._launched_by(pane, launched)
        assert not await door._launched_by(pane, os.getpid())
        assert not await door._launched_by(pane, None)


async def test_a_pane_hello_before_the_launch_is_known_waits_for_it():
    run = _PaneRun(launched=SimpleNamespace(pid=os.getppid()))
    pane, door = cast("ChildRun", run), _door()

    async def start_later() -> None:
        await trio.sleep(0.1)
        run.started.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(start_later)
            assert await door._launched_by(pane, os.getpid())  # a descendant of our parent
        ended = _PaneRun(launched=None)  # it ended before its launch was known
        ended.done.set()
        assert not await door._launched_by(cast("ChildRun", ended), os.getpid())
