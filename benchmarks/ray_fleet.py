"""Children under the ray launcher against the local process launcher, in one run.

N plain children (``python -c pass``-sized scouts: start, print, exit) over 4 simulated Ray nodes
(``ray.cluster_utils.Cluster``, 16 ``agent_slot`` each), against the same N on the local
``ProcessLauncher``: total wall, and launch→running p50 (``launch()`` returning, i.e. the child's
pid known). Launcher-level: it measures placement + actor + process cost, not the fleet's IPC.
Then the channel a remote child speaks: authenticated ``ipc`` round trips over the TLS door
(TCP + mutual TLS 1.3, a session-CA leaf for the owner) against the same over the session's Unix
socket, alternating over several rounds (the median of the per-round ratios), client and server
in this process. Each Ray measure twice: an actor per child, and one host per node
(``node_host``, :mod:`orchestrator.launch._ray_host`). Last line: one JSON object.

    .venv/bin/python benchmarks/ray_fleet.py [N] [--smoke] [--host]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import attrs
import ray
import trio
from ray.cluster_utils import Cluster

import ipc
from child._tls import client_context, install_certificate, make_key_and_csr
from orchestrator.launch._launcher import LaunchSpec, ProcessLauncher
from orchestrator.launch._ray import RayLauncher
from orchestrator.remote._ca import SessionCA
from orchestrator.remote._door import TlsDoor

CODE = "print('scout done')"


def spec(i: int) -> LaunchSpec:
    return LaunchSpec(
        key=f"a{i}",
        name="scout",
        argv=(sys.executable, "-c", CODE),
        cwd=tempfile.gettempdir(),
        env={},
    )


async def run(launcher: object, n: int) -> tuple[float, float]:
    starts: list[float] = []
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:

        async def one(i: int) -> None:
            t = time.perf_counter()
            r = await launcher.launch(spec(i), lambda *_: None, nursery)  # type: ignore[attr-defined]
            starts.append(time.perf_counter() - t)
            assert await r.wait() == 0

        for i in range(n):
            nursery.start_soon(one, i)
    return time.perf_counter() - t0, statistics.median(starts)


OWNER = "a1"
PAYLOAD = ipc.Ownership(paths=["src/app.py", "docs/*.md"])


async def _serve_channel(channel: ipc.Channel, hello: ipc.Envelope, seconds: float = 0.0) -> None:
    await channel.reply(hello.corr, ipc.Reply(ok=True))

    async def handler(envelope: ipc.Envelope) -> ipc.Message:
        return ipc.Reply(ok=True)

    async def on_event(envelope: ipc.Envelope) -> None:
        return None

    await channel.serve(handler, on_event)


async def _roundtrips(channel: ipc.Channel, seconds: float) -> float:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.serve, _serve_nothing, _ignore)
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            await channel.request(PAYLOAD)
            count += 1
        elapsed = time.perf_counter() - start
        await channel.aclose()
    return count / elapsed


async def _serve_nothing(envelope: ipc.Envelope) -> ipc.Message:
    return ipc.Reply(ok=False, error="nothing served here")


async def _ignore(envelope: ipc.Envelope) -> None:
    return None


async def channels(seconds: float, rounds: int) -> tuple[float, float, float]:
    """Round trips per second over the Unix socket and the TLS door; the median ratio."""
    key = ipc.new_session_key()
    token = ipc.derive_token(key, OWNER)
    ca = SessionCA("bench")
    scratch = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    node = scratch / "node"
    node.mkdir(mode=0o700)
    install_certificate(
        node, ca.sign(make_key_and_csr(node, "bench", OWNER), OWNER), ca.certificate_pem
    )
    context = client_context(node / "key.pem", node / "cert.pem", node / "ca.pem")
    hello = ipc.Hello(pid=os.getpid())

    async def unix_connection(stream: trio.SocketStream) -> None:
        channel, envelope = await ipc.accept_hello(stream, {OWNER: token}.get)
        await _serve_channel(channel, envelope)

    door = TlsDoor(ca=ca, token_for={OWNER: token}.get, attach=_serve_channel, refuse=print)
    unix_rates, tls_rates, ratios = [], [], []
    async with trio.open_nursery() as nursery:
        listener = ipc.Listener(path=scratch / "ipc.sock")
        await nursery.start(listener.serve, unix_connection)
        address = await door.open_for(OWNER, nursery)
        for _ in range(rounds):
            channel, _ = await ipc.open_client(
                scratch / "ipc.sock", owner=OWNER, token=token, hello=hello
            )
            unix = await _roundtrips(channel, seconds)
            channel, _ = await ipc.open_tls_client(
                address, context, owner=OWNER, token=token, hello=hello
            )
            tls = await _roundtrips(channel, seconds)
            unix_rates.append(unix)
            tls_rates.append(tls)
            ratios.append(tls / unix)
        door.release(OWNER)
        nursery.cancel_scope.cancel()
    return statistics.median(unix_rates), statistics.median(tls_rates), statistics.median(ratios)


SLEEPER = "import time; time.sleep(60)"


async def remote_memory(k: int, hosted: bool) -> tuple[float, float]:
    """Mean RSS (MB) a remote child costs with *k* idle children placed: the child's own, and
    its share of its actor's worker (an actor per child) or of its node's host (``node_host``)."""
    import psutil  # noqa: PLC0415 - the benchmark only

    def rss(pid: int) -> float:
        return psutil.Process(pid).memory_info().rss / 2**20

    launcher = RayLauncher(node_host=hosted)
    async with trio.open_nursery() as nursery:
        launched = []
        for i in range(k):
            sleeper = attrs.evolve(spec(i), argv=(sys.executable, "-c", SLEEPER))
            launched.append(await launcher.launch(sleeper, lambda *_: None, nursery))
        await trio.sleep(1.0)
        workers = {r.actor_pid for r in launched}
        own = statistics.mean(rss(r.pid) for r in launched)
        share = sum(rss(pid) for pid in workers) / len(launched)
        for r in launched:
            await r.terminate(1.0)
    return own, share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int, nargs="?", default=64, help="children (default 64)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run that checks the script works (its figures mean nothing)",
    )
    parser.add_argument(
        "--host", action="store_true", help="the node host alone (an actor a child takes minutes)"
    )
    args = parser.parse_args()
    smoke = args.smoke
    # --smoke: 2 scouts on one node, each path once (a quick check that every path still runs).
    n = 2 if smoke else args.n
    nodes, slots = (1, 4) if smoke else (4, 16)
    local_wall, local_p50 = trio.run(run, ProcessLauncher(), n)
    cluster = Cluster()
    for _ in range(nodes):
        cluster.add_node(num_cpus=1, resources={"agent_slot": slots})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    result: dict[str, float] = {}
    try:
        modes = (("actor", False), ("host", True))
        # --host: the node host alone (the actor-per-child run takes minutes).
        for mode, hosted in modes[1:] if args.host else modes:
            trio.run(run, RayLauncher(node_host=hosted), nodes)  # warm imports (and hosts)
            wall, p50 = trio.run(run, RayLauncher(node_host=hosted), n)
            # Four idle children a node: a host's share is over four.
            own, share = trio.run(remote_memory, (1 if smoke else 4) * nodes, hosted)
            mb = own + share
            result |= {
                f"{mode}_wall_s": round(wall, 3),
                f"{mode}_wall_ratio": round(wall / local_wall, 2),
                f"{mode}_launch_p50_ms": round(p50 * 1000, 1),
                f"{mode}_child_rss_mb": round(mb, 1),
                f"{mode}_child_own_rss_mb": round(own, 1),
            }
            print(
                f"{n} scouts ray, {mode} ({nodes} nodes): wall {wall:.2f}s "
                f"({wall / local_wall:.2f}x local), launch p50 {p50 * 1000:.1f} ms, "
                f"{mb:.1f} MB RSS per remote child ({own:.1f} own, {share:.1f} worker share)"
            )
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"{n} scouts local: wall {local_wall:.2f}s, launch p50 {local_p50 * 1000:.1f} ms")
    unix_rt, tls_rt, tls_ratio = trio.run(channels, 1.0, 2 if smoke else 5)
    print(
        f"ipc round trips: unix socket {unix_rt:.0f}/s, mTLS door {tls_rt:.0f}/s "
        f"(ratio {tls_ratio:.2f})"
    )
    print(
        json.dumps(
            {
                "benchmark": "ray_fleet",
                "unix_roundtrips_per_s": round(unix_rt),
                "mtls_roundtrips_per_s": round(tls_rt),
                "mtls_ratio": round(tls_ratio, 2),
                "n": n,
                "nodes": nodes,
                "local_wall_s": round(local_wall, 3),
                "local_launch_p50_ms": round(local_p50 * 1000, 1),
                **result,
            }
        )
    )


if __name__ == "__main__":
    main()
