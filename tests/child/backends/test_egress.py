"""The child's egress relay against a real supervisor-side proxy (real sockets, no sandbox).

Outside a sandbox the relay's loopback listeners would collide with the real endpoints, so the
tests name an endpoint on another loopback address (127.0.0.3) and let the proxy's dialler
carry every allowed connection to a local echo server.
"""

import functools
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

import ipc
from child.backends import _egress
from child.backends._cli_env import PrivateDirs, cli_environment
from orchestrator.launch._egress import EgressProxy, allowlist
from orchestrator.launch._sandboxing import EGRESS_SOCKET_ENV


async def _echo(stream: trio.SocketStream) -> None:
    async with stream:
        while data := await stream.receive_some(4096):
            await stream.send_all(b"echo:" + data)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="egc-", dir="/tmp"))
    path.chmod(0o700)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def _loadout(egress: list[str]) -> ipc.Loadout:
    return ipc.Loadout(
        session="s", owner="c1", name="n", agent="a", token="t",  # noqa: S106 - a dummy
        socket="/x", workspace="/",
        egress=egress,
    )  # fmt: skip


async def _receive(stream: trio.SocketStream, expected: bytes) -> bytes:
    data = b""
    while len(data) < len(expected):
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        data += chunk
    return data


async def test_the_relay_carries_loopback_and_proxied_endpoints_and_nothing_else(
    nursery, sock_dir, monkeypatch
):
    echo = await nursery.start(functools.partial(trio.serve_tcp, _echo, 0, host="127.0.0.1"))
    echo_port = echo[0].socket.getsockname()[1]
    loopback = f"127.0.0.3:{_free_port('127.0.0.3')}"
    entries = [loopback, "api.example.test:443", "lan.example.test:8000"]
    refused: list[tuple[str, str]] = []

    async def to_echo(_host: str, _port: int) -> trio.abc.Stream:
        return await trio.open_tcp_stream("127.0.0.1", echo_port)

    proxy = EgressProxy(
        path=sock_dir / "c1.sock",
        allowed=allowlist(entries),
        on_refused=lambda target, reason: refused.append((target, reason)),
        dial=to_echo,
    )
    await nursery.start(proxy.serve)
    proxy.admit(os.getpid())
    monkeypatch.setenv(EGRESS_SOCKET_ENV, str(proxy.path))
    monkeypatch.delenv(_egress.PROXY_ENV, raising=False)
    with trio.fail_after(10):
        async with _egress.open_egress(_loadout(entries)):
            host, port = _egress.split_target(loopback)
            direct = await trio.open_tcp_stream(host, port)
            async with direct:
                await direct.send_all(b"hi")
                assert await _receive(direct, b"echo:hi") == b"echo:hi"
            proxy_url = os.environ[_egress.PROXY_ENV]
            proxy_port = int(proxy_url.rsplit(":", 1)[1])
            relayed = dict(os.environ)
            for target, status in (
                ("api.example.test:443", b"HTTP/1.1 200"),
                ("evil.example.test:443", b"HTTP/1.1 403"),
            ):
                via = await trio.open_tcp_stream("127.0.0.1", proxy_port)
                async with via:
                    await via.send_all(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
                    answer = await _receive(via, status)
                    assert answer.startswith(status)
            # A plain-http endpoint off this machine: the client sends an absolute-form request.
            request = b"POST http://lan.example.test:8000/v1/x HTTP/1.1\r\nHost: lan\r\n\r\n"
            for request_line, answer in (
                (request, b"echo:" + request),
                (request.replace(b"lan.", b"other."), b"HTTP/1.1 403 Forbidden"),
            ):
                via = await trio.open_tcp_stream("127.0.0.1", proxy_port)
                async with via:
                    await via.send_all(request_line)
                    assert (await _receive(via, answer)).startswith(answer)
    assert refused == [
        ("evil.example.test:443", "not in the egress allowlist"),
        ("other.example.test:8000", "not in the egress allowlist"),
    ]
    assert _egress.PROXY_ENV not in os.environ  # the relay's proxy ended with it
    assert _egress.proxy_for("https://api.example.test/v1", relayed) == proxy_url
    assert _egress.proxy_for(f"http://{loopback}/v1", relayed) is None
    env = cli_environment(
        PrivateDirs(root=sock_dir), secrets=["HTTPS_PROXY"], extra={}, source=relayed
    )
    assert env["HTTPS_PROXY"] == env["https_proxy"] == proxy_url
    assert "127.0.0.1" in env["NO_PROXY"]


async def test_without_a_proxy_socket_the_relay_does_nothing(monkeypatch):
    monkeypatch.delenv(EGRESS_SOCKET_ENV, raising=False)
    monkeypatch.delenv(_egress.PROXY_ENV, raising=False)
    async with _egress.open_egress(_loadout(["api.example.test:443"])):
        assert _egress.PROXY_ENV not in os.environ
    assert _egress.proxy_environment({}) == {}
    assert _egress.SOCKET_ENV == EGRESS_SOCKET_ENV
