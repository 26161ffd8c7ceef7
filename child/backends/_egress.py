"""Inside a sandbox with no network: the relay to the supervisor's egress proxy.

A sandboxed child runs in its own network namespace, which has nothing but ``lo``. When the
supervisor gives it an egress proxy it sets ``FLEET_EGRESS_SOCKET`` (a Unix socket bound into
the sandbox), and the loadout's ``egress`` lists the ``host:port`` pairs the proxy will let
through. :func:`open_egress` then serves, for the life of the child:

- for each loopback pair (``127.0.0.1:PORT``, ``localhost:PORT``, ``[::1]:PORT``): a listener on
  that same address inside the namespace, relaying each connection through the socket after a
  ``CONNECT host:port`` — so a loopback base URL works unchanged;
- when any pair is not loopback: one local proxy port, published as ``FLEET_EGRESS_PROXY``
  (``http://127.0.0.1:PORT``), that passes the client's own ``CONNECT`` to the socket as is (and
  tunnels a plain-``http://`` request through a ``CONNECT`` to its host). The
  agent CLIs get it as ``HTTPS_PROXY`` (see :func:`proxy_environment`), the builtin ``openai``
  model as its client's proxy.

- when ``FLEET_MODEL_GATEWAY`` names the child's model URL (the supervisor's model gateway
  serves it, holding the key: the child has a placeholder), and that URL is ``https`` or not
  on loopback: one more local port relaying to the model's endpoint, and the loadout the child
  runs with points its model at it in plain HTTP (``http://127.0.0.1:PORT/<the URL's path>``).
  The gateway makes the TLS connection upstream; it refuses a TLS handshake from the child.

The relay decides nothing: the supervisor's proxy holds the allowlist and refuses the rest.
"""

import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import AsyncIterator, Mapping
from typing import Final
from urllib.parse import urlsplit

import attrs
import trio

import ipc

log = logging.getLogger("child")

SOCKET_ENV: Final = "FLEET_EGRESS_SOCKET"
PROXY_ENV: Final = "FLEET_EGRESS_PROXY"
#: The model URL the supervisor's gateway serves (``orchestrator.spend._keyless.GATEWAY_ENV``).
GATEWAY_ENV: Final = "FLEET_MODEL_GATEWAY"
_SCHEME_PORTS: Final = {"http": 80, "https": 443}
_LOOPBACK_NAMES: Final = frozenset({"localhost"})
_CHUNK: Final = 65536
_MAX_HEAD: Final = 8192


def is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_target(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def proxy_environment(source: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``HTTPS_PROXY`` and friends for an agent CLI when the relay serves a proxy port."""
    proxy = source.get(PROXY_ENV, "")
    if not proxy:
        return {}
    no_proxy = "localhost,127.0.0.1,::1"
    return {
        "HTTPS_PROXY": proxy,
        "https_proxy": proxy,
        "HTTP_PROXY": proxy,
        "http_proxy": proxy,
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
    }


def proxy_for(url: str, source: Mapping[str, str] = os.environ) -> str | None:
    """The proxy a client reaching *url* must use (none for loopback or without a relay)."""
    host = urlsplit(url).hostname or ""
    proxy = source.get(PROXY_ENV, "")
    return proxy if proxy and not is_loopback(host) else None


async def _dial(path: str) -> trio.SocketStream:
    return await trio.open_unix_socket(path)


async def _pump(source: trio.abc.Stream, sink: trio.abc.HalfCloseableStream) -> None:
    try:
        while data := await source.receive_some(_CHUNK):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await sink.send_eof()


async def _splice(a: trio.SocketStream, b: trio.SocketStream) -> None:
    async with a, b, trio.open_nursery() as nursery:
        nursery.start_soon(_pump, a, b)
        nursery.start_soon(_pump, b, a)


async def _read_status(stream: trio.SocketStream) -> tuple[bytes, bytes]:
    buffer = bytearray()
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        if len(buffer) > _MAX_HEAD:
            return b"", b""
        data = await stream.receive_some(_CHUNK)
        if not data:
            return bytes(buffer), b""
        buffer += data
    return bytes(buffer[:end]), bytes(buffer[end + 4 :])


async def _relay_fixed(client: trio.SocketStream, path: str, target: str) -> None:
    """A connection to a loopback endpoint: CONNECT on its behalf, then splice."""
    async with client:
        await _tunnel(client, path, target, b"")


async def _relay_raw(client: trio.SocketStream, path: str) -> None:
    """A connection to the proxy port. A ``CONNECT`` goes to the supervisor as is; a plain-HTTP
    request in absolute form (``POST http://host:port/...``, how clients send ``http://`` URLs
    to a proxy) gets a ``CONNECT`` to its host first, then goes through unchanged (servers must
    accept the absolute form)."""
    async with client:
        head = bytearray()
        with trio.move_on_after(10):
            while b"\r\n" not in head and len(head) <= _MAX_HEAD:
                data = await client.receive_some(_CHUNK)
                if not data:
                    break
                head += data
        target = _absolute_target(bytes(head).split(b"\r\n", 1)[0])
        await _tunnel(client, path, target, bytes(head))


async def _tunnel(client: trio.SocketStream, path: str, target: str | None, head: bytes) -> None:
    """Open the proxy socket, CONNECT to *target* unless the client does it itself (None),
    send *head*, then splice; a refusal is passed back to the client as the proxy gave it."""
    try:
        upstream = await _dial(path)
    except OSError as exc:
        log.warning("egress: cannot reach the proxy socket: %s", exc)
        return
    async with upstream:
        try:
            if target is not None:
                connect = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
                await upstream.send_all(connect.encode())
                status, rest = await _read_status(upstream)
                if not status.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
                    log.warning("egress: %s refused: %r", target, status[:80])
                    if head:  # a client that spoke HTTP to us gets the proxy's answer
                        await client.send_all(status + b"\r\n\r\n" + rest)
                    return
                if rest:
                    await client.send_all(rest)
            if head:
                await upstream.send_all(head)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        await _splice(client, upstream)


def _absolute_target(line: bytes) -> str | None:
    """``host:port`` of an absolute-form ``http://`` request line; None for anything else."""
    parts = line.split(b" ")
    if len(parts) != 3 or parts[0] == b"CONNECT" or not parts[1].startswith(b"http://"):
        return None
    url = urlsplit(parts[1].decode("ascii", "replace"))
    if not url.hostname:
        return None
    port = url.port or 80
    return f"[{url.hostname}]:{port}" if ":" in url.hostname else f"{url.hostname}:{port}"


async def _listen(host: str, port: int) -> trio.SocketListener:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    await sock.bind((host, port))
    sock.listen(64)
    return trio.SocketListener(sock)


async def _serve(listener: trio.SocketListener, handler: object, *args: str) -> None:
    async with listener, trio.open_nursery() as nursery:
        while True:
            stream = await listener.accept()
            nursery.start_soon(handler, stream, *args)  # type: ignore[arg-type]


def _gatewayed(url: str) -> tuple[str, str] | None:
    """``(host:port, path)`` of a gateway-served model *url* that the child cannot reach as it
    is (``https``, or not on loopback); None when it can, or *url* is not a model URL."""
    parts = urlsplit(url)
    if parts.scheme not in _SCHEME_PORTS or not parts.hostname:
        return None
    if parts.scheme == "http" and is_loopback(parts.hostname):
        return None  # the loopback listener for its own address and port serves it as it is
    try:
        port = parts.port or _SCHEME_PORTS[parts.scheme]
    except ValueError:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}", parts.path.rstrip("/")


@contextlib.asynccontextmanager
async def open_egress(loadout: ipc.Loadout) -> AsyncIterator[ipc.Loadout]:
    """Serve the relay (see the module docstring) while the body runs; nothing without one.
    Yields the loadout to run with: *loadout*, its model pointed at the gateway's port when the
    gateway serves it."""
    path = os.environ.get(SOCKET_ENV, "")
    if not path or not loadout.egress:
        yield loadout
        return
    async with trio.open_nursery() as nursery:
        remote = False
        for entry in loadout.egress:
            host, port = split_target(entry)
            if not is_loopback(host):
                remote = True
                continue
            # localhost names both loopbacks: a client may try either first.
            binds = ["127.0.0.1", "::1"] if host.lower() == "localhost" else [host]
            for address in binds:
                try:
                    listener = await _listen(address, port)
                except OSError as exc:
                    log.warning("egress: cannot listen on %s:%s: %s", address, port, exc)
                    continue
                nursery.start_soon(_serve, listener, _relay_fixed, path, entry)
        if remote:
            listener = await _listen("127.0.0.1", 0)
            port = listener.socket.getsockname()[1]
            os.environ[PROXY_ENV] = f"http://127.0.0.1:{port}"
            nursery.start_soon(_serve, listener, _relay_raw, path)
        gatewayed = _gatewayed(os.environ.get(GATEWAY_ENV, ""))
        if gatewayed is not None:
            target, prefix = gatewayed
            listener = await _listen("127.0.0.1", 0)
            port = listener.socket.getsockname()[1]
            nursery.start_soon(_serve, listener, _relay_fixed, path, target)
            model = attrs.evolve(loadout.model, base_url=f"http://127.0.0.1:{port}{prefix}")
            loadout = attrs.evolve(loadout, model=model)
        try:
            yield loadout
        finally:
            os.environ.pop(PROXY_ENV, None)
            nursery.cancel_scope.cancel()
