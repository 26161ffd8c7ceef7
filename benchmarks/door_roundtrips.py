"""Round trips over the TLS door against the same over the session's Unix socket, in one run.

A remote child's channel crosses the door: TCP and mutual TLS 1.3 (a session-CA leaf for its
owner). Each figure is authenticated ``ipc`` round trips a second (one ``ownership`` request
in flight, answered on the reader as the supervisor answers it), and each ratio the median of
the per-round ratios to the Unix socket's (rounds alternate the ways; these machines are
noisy). Two layouts:

- **In one process** (client and server here; what each way costs in CPU, both ends summed):
  the Unix socket; the door on a connection of the child's own (``subagents.ray_node_host:
  false``, an actor per child); a stream of a node link (``ipc.MuxLink``: the door's part of
  a hosted child's channel, a channel at both ends); and the whole way a hosted child's
  channel goes (its socket pair, the host's relay, the link), the host's part in this process
  too.
- **Across processes** (the layout a child runs in; the latency it sees): the server here, a
  child process for each way: a local child on the Unix socket; a child with a door
  connection of its own; a child on a stream of a link it holds itself (the door's part of
  a hosted child's way, without the host between); a hosted child, which speaks over its
  socket pair to a node host process (the link and the relay) that carries it over the door.

Usage: ``python benchmarks/door_roundtrips.py [--seconds S] [--rounds R] [--smoke]``; the last
line printed is one JSON object. ``benchmarks/ray_fleet.py`` prints the same after its fleets.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs
import trio

import ipc
from child._tls import client_context, install_certificate, make_key_and_csr
from orchestrator.control._ipcbench import answer_ownership, request_rate
from orchestrator.launch._node_relay import Relay
from orchestrator.remote._ca import SessionCA
from orchestrator.remote._door import TlsDoor

OWNER = "a1"
#: What a child process of the run reads its credentials from (this benchmark's own).
_ENV = "FLEET_DOOR_BENCH"
_SCRIPT = str(Path(__file__).resolve())
#: Seconds each way runs once before the measured rounds, in one process (the first
#: requests generate and warm the codecs; only the way measured first would pay it).
_WARM_S = 0.2


async def _serve_channel(
    channel: ipc.Channel, hello: ipc.Envelope, seconds: float = 0.0, link: str = ""
) -> None:
    await channel.reply(hello.corr, ipc.Reply(ok=True))
    await channel.serve(_nothing, _ignore, immediate=answer_ownership)


async def _nothing(envelope: ipc.Envelope) -> ipc.Message:
    return ipc.Reply(ok=False, error="nothing served here")


async def _ignore(envelope: ipc.Envelope) -> None:
    return None


async def _roundtrips(channel: ipc.Channel, seconds: float) -> float:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.serve, _nothing, _ignore)
        rate = await request_rate(channel, seconds)
        await channel.aclose()
    return rate


@attrs.define
class Credentials:
    """A session's key and CA, a child's leaf and a node host's, in a scratch directory."""

    scratch: Path
    token: str
    ca: SessionCA
    link_owner: str

    @classmethod
    def make(cls) -> "Credentials":
        scratch = Path(tempfile.mkdtemp(prefix="fleet-bench-door-"))
        ca = SessionCA("bench")
        link_owner = ipc.new_link_owner()
        for name, owner in (("node", OWNER), ("host", link_owner)):
            where = scratch / name
            where.mkdir(mode=0o700)
            leaf = ca.sign(make_key_and_csr(where, "bench", owner), owner)
            install_certificate(where, leaf, ca.certificate_pem)
        token = ipc.derive_token(ipc.new_session_key(), OWNER)
        return cls(scratch=scratch, token=token, ca=ca, link_owner=link_owner)

    def door(self) -> TlsDoor:
        return TlsDoor(
            ca=self.ca,
            token_for={OWNER: self.token}.get,
            attach=_serve_channel,
            refuse=print,
            carries=lambda link, key: link == self.link_owner and key == OWNER,
        )

    def env(self) -> dict[str, str]:
        return {**os.environ, _ENV: json.dumps([str(self.scratch), self.token])}


def _context(directory: Path) -> Any:
    return client_context(directory / "key.pem", directory / "cert.pem", directory / "ca.pem")


async def _unix_server(token: str, path: Path, nursery: trio.Nursery) -> None:
    async def connection(stream: trio.SocketStream) -> None:
        channel, envelope = await ipc.accept_hello(stream, {OWNER: token}.get)
        await _serve_channel(channel, envelope)

    await nursery.start(ipc.Listener(path=path).serve, connection)


def _stream_of(sock: socket.socket) -> trio.SocketStream:
    """A trio stream over one end of a socket pair."""
    return trio.SocketStream(trio.socket.from_stdlib_socket(sock))


def _hello() -> ipc.Hello:
    return ipc.Hello(pid=os.getpid())


def _ratios(rates: dict[str, list[float]]) -> dict[str, float]:
    """Each way's median rate and its median per-round ratio to the Unix socket's."""
    out: dict[str, float] = {}
    for way, values in rates.items():
        out[way] = statistics.median(values)
        if way != "unix":
            per_round = [value / unix for value, unix in zip(values, rates["unix"], strict=True)]
            out[f"{way}_ratio"] = statistics.median(per_round)
    return out


async def in_process(seconds: float, rounds: int) -> dict[str, float]:
    """Round trips a second each way with client and server in this process, and ratios."""
    made = Credentials.make()
    hello, token = _hello(), made.token
    door = made.door()
    rates: dict[str, list[float]] = {"unix": [], "tls": [], "link": [], "relayed": []}
    async with trio.open_nursery() as nursery:
        await _unix_server(token, made.scratch / "ipc.sock", nursery)
        address = await door.open_for(OWNER, nursery)
        link = ipc.MuxLink(
            await ipc.connect_tls(address, _context(made.scratch / "host")), opener=True
        )
        await nursery.start(link.run)
        own = _context(made.scratch / "node")

        async def relayed() -> trio.abc.Stream:
            ours, theirs = socket.socketpair()
            nursery.start_soon(Relay(ours, link.open(OWNER)).run)
            return _stream_of(theirs)

        async def opened(way: str) -> ipc.Channel:
            if way == "unix":
                channel, _ = await ipc.open_client(
                    made.scratch / "ipc.sock", owner=OWNER, token=token, hello=hello
                )
            elif way == "tls":
                channel, _ = await ipc.open_tls_client(
                    address, own, owner=OWNER, token=token, hello=hello
                )
            else:
                stream = link.open(OWNER) if way == "link" else await relayed()
                channel, _ = await ipc.hello_on(stream, owner=OWNER, token=token, hello=hello)
            return channel

        for way in rates:  # a warm-up: the first requests generate and warm the codecs
            await _roundtrips(await opened(way), _WARM_S)
        for _ in range(rounds):
            for way, measured in rates.items():
                measured.append(await _roundtrips(await opened(way), seconds))
        await link.aclose()
        door.release(OWNER)
        nursery.cancel_scope.cancel()
    shutil.rmtree(made.scratch, ignore_errors=True)
    return _ratios(rates)


async def across_processes(seconds: float, rounds: int) -> dict[str, float]:
    """Round trips a second each way with the server here and the child a process of its
    own (a hosted child behind a node host process), and ratios."""
    made = Credentials.make()
    door = made.door()
    env = made.env()
    rates: dict[str, list[float]] = {"unix": [], "tls": [], "link": [], "hosted": []}
    async with trio.open_nursery() as nursery:
        await _unix_server(made.token, made.scratch / "ipc.sock", nursery)
        address = await door.open_for(OWNER, nursery)
        ways = {
            "unix": ["--child", "unix", str(made.scratch / "ipc.sock")],
            "tls": ["--child", "tls", address],
            "link": ["--child", "link", address],
            "hosted": ["--host", address],
        }
        for _ in range(rounds):
            for way, argv in ways.items():
                done = await trio.run_process(
                    [sys.executable, _SCRIPT, *argv, "--seconds", str(seconds)],
                    env=env,
                    capture_stdout=True,
                )
                rates[way].append(float(done.stdout.split()[-1]))
        door.release(OWNER)
        nursery.cancel_scope.cancel()
    shutil.rmtree(made.scratch, ignore_errors=True)
    return _ratios(rates)


def _credentials() -> tuple[Path, str]:
    scratch, token = json.loads(os.environ[_ENV])
    return Path(scratch), token


async def _child(way: str, where: str, seconds: float) -> None:
    """A child process: its channel (the Unix socket, its own door connection, a stream of
    a link of its own, or the socket pair descriptor its host passed) and its round trips a
    second, printed."""
    scratch, token = _credentials()
    hello = _hello()
    if way == "unix":
        channel, _ = await ipc.open_client(where, owner=OWNER, token=token, hello=hello)
    elif way == "tls":
        own = _context(scratch / "node")
        channel, _ = await ipc.open_tls_client(where, own, owner=OWNER, token=token, hello=hello)
    elif way == "link":
        link = ipc.MuxLink(await ipc.connect_tls(where, _context(scratch / "host")), opener=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(link.run)
            channel, _ = await ipc.hello_on(link.open(OWNER), owner=OWNER, token=token, hello=hello)
            print(await _roundtrips(channel, seconds), flush=True)
            await link.aclose()
            nursery.cancel_scope.cancel()
        return
    else:
        inherited = _stream_of(socket.socket(fileno=int(where)))
        channel, _ = await ipc.hello_on(inherited, owner=OWNER, token=token, hello=hello)
    print(await _roundtrips(channel, seconds), flush=True)


async def _host(address: str, seconds: float) -> None:
    """A node host process: its link over the door, a relay, and a hosted child it starts
    with the other end of the child's socket pair (whose figure it prints)."""
    scratch, _ = _credentials()
    link = ipc.MuxLink(await ipc.connect_tls(address, _context(scratch / "host")), opener=True)
    ours, theirs = socket.socketpair()
    async with trio.open_nursery() as nursery:
        await nursery.start(link.run)
        nursery.start_soon(Relay(ours, link.open(OWNER)).run)
        fd = theirs.fileno()
        argv = [sys.executable, _SCRIPT, "--child", "pair", str(fd), "--seconds", str(seconds)]
        done = await trio.run_process(argv, pass_fds=[fd], capture_stdout=True)
        theirs.close()
        print(done.stdout.decode().split()[-1], flush=True)
        await link.aclose()
        nursery.cancel_scope.cancel()


def report(inside: dict[str, float], across: dict[str, float]) -> dict[str, Any]:
    """Print both layouts' lines; the figures for a JSON line."""
    print(
        f"ipc round trips in one process: unix socket {inside['unix']:.0f}/s, the door on a "
        f"connection of its own {inside['tls']:.0f}/s (ratio {inside['tls_ratio']:.2f}), a "
        f"node link's stream {inside['link']:.0f}/s (ratio {inside['link_ratio']:.2f}), the "
        f"whole way through the host's relay {inside['relayed']:.0f}/s "
        f"(ratio {inside['relayed_ratio']:.2f})"
    )
    print(
        f"ipc round trips across processes: a local child {across['unix']:.0f}/s, a child "
        f"with a door connection of its own {across['tls']:.0f}/s (ratio "
        f"{across['tls_ratio']:.2f}), on a stream of a link {across['link']:.0f}/s (ratio "
        f"{across['link_ratio']:.2f}), a hosted child through its node host "
        f"{across['hosted']:.0f}/s (ratio {across['hosted_ratio']:.2f})"
    )
    figures: dict[str, Any] = {}
    for prefix, measured in (("", inside), ("processes_", across)):
        for key, value in measured.items():
            if key.endswith("_ratio"):
                figures[prefix + key] = round(value, 2)
            else:
                figures[f"{prefix}{key}_per_s"] = round(value)
    return figures


def measure(seconds: float, rounds: int) -> dict[str, Any]:
    """Both layouts, reported."""
    inside = trio.run(in_process, seconds, rounds)
    across = trio.run(across_processes, seconds, rounds)
    return report(inside, across)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="each way, each round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--smoke", action="store_true", help="a tiny run (figures mean nothing)")
    parser.add_argument("--child", nargs=2, metavar=("WAY", "WHERE"), help=argparse.SUPPRESS)
    parser.add_argument("--host", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        way, where = args.child
        trio.run(_child, way, where, args.seconds)
        return
    if args.host:
        trio.run(_host, args.host, args.seconds)
        return
    seconds, rounds = (0.2, 1) if args.smoke else (args.seconds, args.rounds)
    figures = measure(seconds, rounds)
    print(
        json.dumps(
            {"benchmark": "door_roundtrips", "seconds": seconds, "rounds": rounds, **figures}
        )
    )


if __name__ == "__main__":
    main()
