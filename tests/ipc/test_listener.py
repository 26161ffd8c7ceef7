import os
import pwd
import socket
import stat

import pytest
import trio

import ipc
from ipc import Listener, ListenerError


@pytest.fixture
def sock_dir(tmp_path_factory):
    # Short on purpose: sun_path is 108 bytes and pytest's tmp_path grows with the test name.
    return tmp_path_factory.mktemp("l") / "run"


def mode(path):
    return stat.S_IMODE(path.lstat().st_mode)


def assert_memo_clear(listener):
    assert listener._binding is None
    assert listener._bound is None


async def connects(path) -> bool:
    with trio.fail_after(10):
        stream = await trio.open_unix_socket(os.fspath(path))
        await stream.aclose()
    return True


async def test_bind_makes_a_0700_directory_and_a_0600_socket(sock_dir):
    listener = Listener(path=sock_dir / "ipc.sock")
    await listener.ensure_bound()
    try:
        assert mode(sock_dir) == 0o700
        assert stat.S_ISSOCK(listener.path.lstat().st_mode)
        assert mode(listener.path) == 0o600
        assert await connects(listener.path)
    finally:
        await listener.aclose()


async def test_an_existing_directory_of_ours_is_tightened_to_0700(sock_dir):
    sock_dir.mkdir(mode=0o755)
    sock_dir.chmod(0o755)
    listener = Listener(path=sock_dir / "ipc.sock")
    await listener.ensure_bound()
    await listener.aclose()
    assert mode(sock_dir) == 0o700


async def test_concurrent_first_users_share_one_bind(sock_dir):
    listener = Listener(path=sock_dir / "ipc.sock")
    results = []

    async def user():
        results.append(await listener.ensure_bound())

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(user)
    try:
        assert listener.bind_count == 1
        assert len(results) == 20
        assert all(result is results[0] for result in results)
        assert await listener.ensure_bound() is results[0]
        assert listener.bind_count == 1
    finally:
        await listener.aclose()


async def test_concurrent_users_of_a_failing_bind_all_get_the_error(sock_dir):
    sock_dir.mkdir(mode=0o700)
    (sock_dir / "ipc.sock").write_text("not a socket")
    listener = Listener(path=sock_dir / "ipc.sock")
    errors = []

    async def user():
        with pytest.raises(ListenerError) as caught:
            await listener.ensure_bound()
        errors.append(str(caught.value))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(user)
    assert errors == [errors[0]] * 5
    assert "a non-socket file is in the way" in errors[0]
    assert_memo_clear(listener)


async def test_a_non_socket_in_the_way_is_refused_then_retry_succeeds(sock_dir):
    sock_dir.mkdir(mode=0o700)
    path = sock_dir / "ipc.sock"
    path.write_text("precious")
    listener = Listener(path=path)
    with pytest.raises(ListenerError, match="a non-socket file is in the way"):
        await listener.ensure_bound()
    assert path.read_text() == "precious"  # refused, never removed
    assert_memo_clear(listener)
    path.unlink()
    await listener.ensure_bound()
    try:
        assert listener.bind_count == 2
        assert await connects(path)
    finally:
        await listener.aclose()


async def test_a_symlink_in_the_way_is_refused(sock_dir, tmp_path):
    sock_dir.mkdir(mode=0o700)
    target = tmp_path / "target"
    target.write_text("x")
    (sock_dir / "ipc.sock").symlink_to(target)
    with pytest.raises(ListenerError, match="non-socket"):
        await Listener(path=sock_dir / "ipc.sock").ensure_bound()
    assert target.read_text() == "x"


async def test_a_symlinked_directory_is_refused(sock_dir, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    sock_dir.symlink_to(real)
    with pytest.raises(ListenerError, match="is not a directory"):
        await Listener(path=sock_dir / "ipc.sock").ensure_bound()


async def test_a_path_past_sun_path_is_refused_and_retryable(tmp_path_factory):
    short = tmp_path_factory.mktemp("p")
    long_path = short / ("x" * (120 - len(os.fsencode(short))))
    listener = Listener(path=long_path / "ipc.sock")
    with pytest.raises(ListenerError, match="use a shorter FLEET_HOME"):
        await listener.ensure_bound()
    assert_memo_clear(listener)
    assert not long_path.exists()  # refused before touching the file system
    listener.path = short / "run" / "ipc.sock"
    await listener.ensure_bound()
    await listener.aclose()
    assert listener.bind_count == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown the directory to nobody")
async def test_a_directory_owned_by_someone_else_is_refused_then_retry_succeeds(sock_dir):
    nobody = pwd.getpwnam("nobody").pw_uid
    sock_dir.mkdir(mode=0o700)
    os.chown(sock_dir, nobody, -1)
    listener = Listener(path=sock_dir / "ipc.sock")
    with pytest.raises(ListenerError, match=f"owned by uid {nobody}, not us"):
        await listener.ensure_bound()
    assert_memo_clear(listener)
    os.chown(sock_dir, os.geteuid(), -1)
    await listener.ensure_bound()
    await listener.aclose()


async def test_a_stale_socket_of_ours_is_replaced(sock_dir):
    sock_dir.mkdir(mode=0o700)
    path = sock_dir / "ipc.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(os.fspath(path))
    dead.close()  # the file stays, nobody listens: a crashed supervisor's leftover
    assert stat.S_ISSOCK(path.lstat().st_mode)
    listener = Listener(path=path)
    await listener.ensure_bound()
    try:
        assert await connects(path)
    finally:
        await listener.aclose()


async def test_a_live_listener_at_the_path_is_refused(sock_dir):
    first = Listener(path=sock_dir / "ipc.sock")
    await first.ensure_bound()
    try:
        second = Listener(path=sock_dir / "ipc.sock")
        with pytest.raises(ListenerError, match="another supervisor is listening there"):
            await second.ensure_bound()
        assert await connects(first.path)  # the first one is untouched
    finally:
        await first.aclose()


async def test_a_live_listener_with_a_full_backlog_is_refused_without_hanging(sock_dir):
    sock_dir.mkdir(mode=0o700)
    path = sock_dir / "ipc.sock"
    busy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    busy.bind(os.fspath(path))
    busy.listen(0)
    clients = []
    try:
        while True:  # fill the backlog: the next connect would block
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.settimeout(0)  # non-blocking
            clients.append(client)
            try:
                client.connect(os.fspath(path))
            except BlockingIOError:
                break
        with trio.fail_after(10), pytest.raises(ListenerError, match="backlog is full"):
            await Listener(path=path).ensure_bound()
    finally:
        for client in clients:
            client.close()
        busy.close()


async def test_aclose_unlinks_the_socket(sock_dir):
    listener = Listener(path=sock_dir / "ipc.sock")
    await listener.ensure_bound()
    await listener.aclose()
    assert not listener.path.exists()
    await listener.aclose()  # twice is fine


async def test_serve_runs_the_handler_per_connection(sock_dir, nursery):
    listener = Listener(path=sock_dir / "ipc.sock")
    seen = trio.Event()
    received = []

    async def handler(stream):
        async with stream:
            received.append(await stream.receive_some())
            seen.set()

    await nursery.start(listener.serve, handler)
    with trio.fail_after(10):
        client = await trio.open_unix_socket(os.fspath(listener.path))
        async with client:
            await client.send_all(b"ping")
            await seen.wait()
    assert received == [b"ping"]
    assert listener.bind_count == 1
    await listener.aclose()


def test_ensure_private_dir_refuses_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ListenerError, match="is not a directory"):
        ipc.ensure_private_dir(tmp_path / "f")


def test_ensure_private_dir_creates_missing_parents(tmp_path):
    ipc.ensure_private_dir(tmp_path / "a" / "b")
    assert mode(tmp_path / "a" / "b") == 0o700
