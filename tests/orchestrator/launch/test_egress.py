"""The egress proxy over a real Unix socket, against a real loopback TCP echo server."""

import functools
import os
import stat
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio

import ipc
from orchestrator._errors import UsageError
from orchestrator.launch._egress import (
    MAX_HEAD_BYTES,
    EgressError,
    EgressProxy,
    allowlist,
    parse_target,
)
from orchestrator.launch._sandboxing import egress_allowlist


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # Short, under /tmp: a Unix socket path must fit in sun_path.
    path = Path(tempfile.mkdtemp(prefix="egr-", dir="/tmp"))
    path.chmod(0o700)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


async def _echo(stream: trio.SocketStream) -> None:
    async with stream:
        while data := await stream.receive_some(4096):
            await stream.send_all(b"echo:" + data)


async def _echo_server(nursery: trio.Nursery) -> int:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, _echo, 0, host="127.0.0.1"))
    port: int = listeners[0].socket.getsockname()[1]
    return port


@pytest.fixture
async def echo_port(nursery: trio.Nursery) -> int:
    return await _echo_server(nursery)


@pytest.fixture
async def other_port(nursery: trio.Nursery) -> int:
    return await _echo_server(nursery)


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[Path], Awaitable[trio.SocketStream]]]:
    opened: list[trio.SocketStream] = []

    async def open_one(path: Path) -> trio.SocketStream:
        opened.append(await trio.open_unix_socket(str(path)))
        return opened[-1]

    yield open_one
    for stream in opened:
        await stream.aclose()


class Refusals(list[tuple[str, str]]):
    def __call__(self, target: str, reason: str) -> None:
        self.append((target, reason))


async def _proxy(
    nursery: trio.Nursery, sock_dir: Path, allowed: list[str], head_timeout: float = 10
) -> tuple[EgressProxy, Refusals]:
    refusals = Refusals()
    proxy = EgressProxy(
        path=sock_dir / "c1.sock",
        allowed=allowlist(allowed),
        on_refused=refusals,
        head_timeout=head_timeout,
    )
    await nursery.start(proxy.serve)
    proxy.admit(os.getpid())  # the test is the "child": its own connections are in the tree
    return proxy, refusals


async def _status(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0]


async def test_an_allowed_target_is_tunnelled_both_ways(connect, nursery, sock_dir, echo_port):
    proxy, refusals = await _proxy(nursery, sock_dir, [f"127.0.0.1:{echo_port}"])
    assert stat.S_IMODE(os.stat(proxy.path).st_mode) == 0o600
    with trio.fail_after(10):
        stream = await connect(proxy.path)
        await stream.send_all(f"CONNECT 127.0.0.1:{echo_port} HTTP/1.1\r\n\r\nhello".encode())
        assert await _status(stream) == b"HTTP/1.1 200 Connection established"
        received = b""
        while received != b"echo:hello":
            received += await stream.receive_some(4096)
        await stream.send_all(b"again")
        assert await stream.receive_some(4096) == b"echo:again"
        await stream.aclose()
    assert refusals == []


async def test_a_target_off_the_list_is_refused_and_reported(
    connect, nursery, sock_dir, echo_port, other_port
):
    proxy, refusals = await _proxy(nursery, sock_dir, [f"127.0.0.1:{echo_port}"])
    for target in (f"127.0.0.1:{other_port}", f"localhost:{echo_port}", "example.com:443"):
        with trio.fail_after(10):
            stream = await connect(proxy.path)
            await stream.send_all(f"CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert await _status(stream) == b"HTTP/1.1 403 Forbidden"
            assert await stream.receive_some(4096) == b""  # closed, nothing relayed
    assert refusals == [
        (f"127.0.0.1:{other_port}", "not in the egress allowlist"),
        (f"localhost:{echo_port}", "not in the egress allowlist"),
        ("example.com:443", "not in the egress allowlist"),
    ]


@pytest.mark.parametrize(
    ("request_bytes", "status", "reason"),
    [
        (b"GET http://127.0.0.1:1/ HTTP/1.1\r\n\r\n", b"405", "is not CONNECT"),
        (b"CONNECT nonsense\r\n\r\n", b"400", "malformed request line"),
        (b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n", b"400", "target is not host:port"),
        (b"CONNECT a@b:80 HTTP/1.1\r\n\r\n", b"400", "target is not host:port"),
        (b"CONNECT 127.0.0.1:1", b"400", "closed before a full request head"),
    ],
)
async def test_a_malformed_request_is_refused(  # noqa: PLR0917 - fixtures and parameters
    connect, nursery, sock_dir, request_bytes, status, reason
):
    proxy, refusals = await _proxy(nursery, sock_dir, ["127.0.0.1:1"])
    with trio.fail_after(10):
        stream = await connect(proxy.path)
        await stream.send_all(request_bytes)
        if not request_bytes.endswith(b"\r\n\r\n"):
            await stream.send_eof()
        assert (await _status(stream)).split(b" ")[1] == status
    assert len(refusals) == 1
    assert reason in refusals[0][1]


async def test_an_oversize_head_is_refused_without_reading_it_all(
    connect, nursery, sock_dir, echo_port
):
    proxy, refusals = await _proxy(nursery, sock_dir, [f"127.0.0.1:{echo_port}"])
    head = f"CONNECT 127.0.0.1:{echo_port} HTTP/1.1\r\nX: {'a' * (2 * MAX_HEAD_BYTES)}"
    with trio.fail_after(10):
        stream = await connect(proxy.path)
        await stream.send_all(head.encode())
        assert await _status(stream) == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert refusals == [("", "request head too large")]


async def test_a_slow_client_is_timed_out(connect, nursery, sock_dir, echo_port, autojump_clock):
    proxy, refusals = await _proxy(nursery, sock_dir, [f"127.0.0.1:{echo_port}"], head_timeout=5)
    stream = await connect(proxy.path)
    await stream.send_all(b"CONNECT 127.0.0.1:")  # and then nothing
    started = trio.current_time()
    assert await _status(stream) == b"HTTP/1.1 408 Request Timeout"
    assert trio.current_time() - started == pytest.approx(5, abs=0.01)
    assert refusals == [("", "no request head in time")]


async def test_connections_past_the_bound_are_refused(connect, nursery, sock_dir, echo_port):
    proxy, refusals = await _proxy(nursery, sock_dir, [f"127.0.0.1:{echo_port}"])
    proxy.max_connections = 2
    with trio.fail_after(10):
        held = [await connect(proxy.path) for _ in range(2)]
        await trio.sleep(0.2)  # both accepted and waiting for their heads
        extra = await connect(proxy.path)
        assert await _status(extra) == b"HTTP/1.1 503 Service Unavailable"
        for stream in held:
            await stream.aclose()
    assert refusals[0] == ("", "too many")


async def test_an_unreachable_allowed_target_is_a_502(connect, nursery, sock_dir):
    closed = trio.socket.socket()
    await closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    proxy, refusals = await _proxy(nursery, sock_dir, [f"127.0.0.1:{port}"])
    with trio.fail_after(20):
        stream = await connect(proxy.path)
        await stream.send_all(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        assert await _status(stream) == b"HTTP/1.1 502 Bad Gateway"
    assert refusals[0][1].startswith("connect failed")


async def test_a_process_outside_the_childs_tree_is_refused(connect, nursery, sock_dir, echo_port):
    proxy, refusals = await _proxy(nursery, sock_dir, [f"127.0.0.1:{echo_port}"])
    with trio.fail_after(10):
        # A sibling: another process, of which the connecting one is no descendant.
        sibling = await nursery.start(functools.partial(trio.run_process, ["sleep", "30"]))
        proxy.admit(sibling.pid)
        stream = await connect(proxy.path)
        await stream.send_all(f"CONNECT 127.0.0.1:{echo_port} HTTP/1.1\r\n\r\n".encode())
        assert await _status(stream) == b"HTTP/1.1 403 Forbidden"
        sibling.kill()
    assert refusals == [("", f"peer pid {os.getpid()} is not in this child's process tree")]


async def test_a_descendant_of_the_admitted_process_gets_through(nursery, sock_dir, echo_port):
    """The child's own processes (a shell's command, two levels down) are in its tree."""
    proxy, refusals = await _proxy(nursery, sock_dir, [f"127.0.0.1:{echo_port}"])
    code = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        "s.sendall(f'CONNECT 127.0.0.1:{sys.argv[2]} HTTP/1.1\\r\\n\\r\\n'.encode())\n"
        "print(s.recv(200).split(b'\\r\\n')[0].decode())\n"
    )
    # "; true": the shell waits for its command instead of becoming it.
    shell = f'"{sys.executable}" -c "$0" "$1" "$2"; true'
    with trio.fail_after(20):
        done = await trio.run_process(
            ["sh", "-c", shell, code, str(proxy.path), str(echo_port)], capture_stdout=True
        )
    assert done.stdout.decode().strip() == "HTTP/1.1 200 Connection established"
    assert refusals == []


async def test_the_socket_directory_must_be_private(connect, nursery, sock_dir):
    sock_dir.chmod(0o755)
    with pytest.raises(EgressError, match="must be a 0700 dir"):
        await _proxy(nursery, sock_dir, ["127.0.0.1:1"])


def test_targets_parse_exactly():
    assert parse_target("API.Example.com:443") == ("api.example.com", 443)
    assert parse_target("[::1]:8080") == ("::1", 8080)
    for bad in ("host", "host:0", "host:65536", ":80", "a/b:80", "h:8o"):
        with pytest.raises(ValueError, match="is not host:port"):
            parse_target(bad)
    with pytest.raises(EgressError, match="write host:port"):
        allowlist(["ok:1", "bad"])


def test_the_allowlist_is_the_model_endpoint_plus_what_config_and_definition_name():
    openai = ipc.ModelSpec(kind="openai", name="m", base_url="http://127.0.0.1:8123/c/x/v1")
    assert egress_allowlist("builtin", openai, named=(), gateways=("gw:8080",)) == [
        "127.0.0.1:8123",
        "gw:8080",
    ]
    hosted = ipc.ModelSpec(kind="openai", name="m", base_url="https://API.example.com/v1")
    assert egress_allowlist("pi", hosted, named=("docs:443",), gateways=()) == [
        "api.example.com:443",
        "docs:443",
    ]
    native = ipc.ModelSpec(kind="native")
    assert egress_allowlist("claude", native, named=(), gateways=()) == ["api.anthropic.com:443"]
    # No model: no gateway either, only what the definition names; nothing at all by default.
    scripted = ipc.ModelSpec(kind="scripted", script="/s")
    assert egress_allowlist("builtin", scripted, named=(), gateways=("gw:1",)) == []
    assert egress_allowlist("command", ipc.ModelSpec(), named=("x:1",), gateways=()) == ["x:1"]
    with pytest.raises(UsageError, match="write host:port"):
        egress_allowlist("command", ipc.ModelSpec(), named=("nope",), gateways=())
    with pytest.raises(UsageError, match="has no http"):
        egress_allowlist(
            "builtin", ipc.ModelSpec(kind="openai", base_url="ftp://x"), named=(), gateways=()
        )
