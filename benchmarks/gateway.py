"""The model gateway's cost and its pacing, against the loopback scripted model server.

Three measurements. The gateway is the real ``orchestrator.spend._gateway``, served on a
loopback port as the egress proxy would hand it a tunnel, in a process of its own (as it runs
in the supervisor, apart from the child and the provider); the clients are ``httpx`` clients
standing in for children, in the benchmark's process beside the scripted model server, so both
paths pay the same client and server costs and what differs is the gateway:

- **latency**: whole (non-streamed) chat completions, one at a time, direct to the server and
  through the gateway, interleaved; per model think time (0: the server answers at once, the
  worst case for a relay; 50 ms: still faster than any hosted model's first token), the median
  time per request each way, the time the gateway adds, and direct ÷ relayed (goal >= 0.9).
- **streaming throughput**: a streamed answer of several MiB, direct and relayed; the ratio is
  relayed ÷ direct bytes per second (goal >= 0.9).
- **fan-out**: N clients (32; 8 with ``--smoke``), each with its own gateway sharing one
  session's pacing (in the benchmark's process: the pacing is shared state), against a server
  that answers ``429`` with ``Retry-After: W`` for W seconds after the first request; the ratio
  is the wall time ÷ the ideal schedule (W plus one relayed request), and the count of 429s
  says how many were met (only the requests in flight when the first 429 came back).

Usage: ``python benchmarks/gateway.py [--smoke]``. The last line printed is one JSON object.
"""

import argparse
import contextlib
import functools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.spend._gateway import Gateway
from orchestrator.spend._pacing import Pacing
from tests.fakes.model_server import ModelServer

CHAT: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _serve(gateway: Gateway, nursery: trio.Nursery) -> str:
    serve = functools.partial(trio.serve_tcp, gateway.serve, 0, host="127.0.0.1")
    listeners = await nursery.start(serve)
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, object]) -> int:
    response = await client.post(url, json=body)
    response.raise_for_status()
    return len(response.content)


@contextlib.asynccontextmanager
async def gateway_process(upstream: str) -> AsyncIterator[str]:
    """A gateway to *upstream* in a process of its own; yields its base URL."""
    command = [sys.executable, __file__, "--gateway-for", upstream]
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            functools.partial(trio.run_process, command, stdout=subprocess.PIPE, check=False)
        )
        assert process.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(1)
                if not chunk:
                    raise RuntimeError("the gateway process ended before it served")
                line += chunk
        try:
            yield line.decode().strip()
        finally:
            process.terminate()


async def serve_gateway(upstream: str) -> None:
    """``--gateway-for``: serve one gateway, print its URL, run until terminated."""
    gateway = Gateway(upstream=upstream, on_usage=lambda _usage: None)
    async with trio.open_nursery() as nursery:
        print(await _serve(gateway, nursery), flush=True)


async def latency(srv: ModelServer, rounds: int, think: float) -> dict[str, float]:
    """Whole answers one at a time, direct and through the gateway, the server taking
    *think* seconds for each."""
    srv.script("lat", [{"text": "ok", "delay": think}] * (2 * rounds + 2))
    direct_s, relayed_s = [], []
    upstream = f"http://127.0.0.1:{srv.port}"
    async with gateway_process(upstream) as relay, httpx.AsyncClient() as client:
        path = "/c/lat/v1/chat/completions"
        await _post(client, f"http://127.0.0.1:{srv.port}{path}", CHAT)  # warm both
        await _post(client, relay + path, CHAT)
        for _ in range(rounds):
            start = time.perf_counter()
            await _post(client, f"http://127.0.0.1:{srv.port}{path}", CHAT)
            direct_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            await _post(client, relay + path, CHAT)
            relayed_s.append(time.perf_counter() - start)
    direct, relayed = statistics.median(direct_s), statistics.median(relayed_s)
    return {
        "think_ms": round(think * 1000),
        "direct_ms": round(direct * 1000, 3),
        "relayed_ms": round(relayed * 1000, 3),
        "added_ms": round((relayed - direct) * 1000, 3),
        "ratio": round(direct / relayed, 3),
    }


async def throughput(srv: ModelServer, mib: int, rounds: int) -> dict[str, float]:
    text = "x" * (mib << 20)
    srv.script("big", [{"text": text}] * (2 * rounds))
    body = {**CHAT, "stream": True}
    rates: dict[str, list[float]] = {"direct": [], "relayed": []}
    upstream = f"http://127.0.0.1:{srv.port}"
    async with gateway_process(upstream) as relay, httpx.AsyncClient(timeout=120) as client:
        path = "/c/big/v1/chat/completions"
        for _ in range(rounds):
            for name, base in (("direct", f"http://127.0.0.1:{srv.port}"), ("relayed", relay)):
                start = time.perf_counter()
                size = 0
                async with client.stream("POST", base + path, json=body) as response:
                    async for chunk in response.aiter_raw():
                        size += len(chunk)
                rates[name].append(size / (time.perf_counter() - start))
    direct, relayed = statistics.median(rates["direct"]), statistics.median(rates["relayed"])
    return {
        "direct_mib_s": round(direct / (1 << 20), 1),
        "relayed_mib_s": round(relayed / (1 << 20), 1),
        "ratio": round(relayed / direct, 3),
    }


async def fan_out(srv: ModelServer, clients: int, window: float) -> dict[str, float]:
    for i in range(clients):
        srv.script(f"f{i}", [{"text": f"done {i}"}])
    pacing = Pacing(patience=60)
    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=120) as client:
        relays = []
        for _ in range(clients):
            gateway = Gateway(
                upstream=f"http://127.0.0.1:{srv.port}", on_usage=lambda _u: None, pacing=pacing
            )
            relays.append(await _serve(gateway, nursery))
        # The ideal: one relayed request, once the provider reopens.
        srv.script("probe", [{"text": "p"}])
        start = time.perf_counter()
        await _post(client, relays[0] + "/c/probe/v1/chat/completions", CHAT)
        one = time.perf_counter() - start
        srv.rate_limit(window, str(int(window)))
        start = time.perf_counter()
        async with trio.open_nursery() as fan:
            for i, relay in enumerate(relays):
                fan.start_soon(_post, client, relay + f"/c/f{i}/v1/chat/completions", CHAT)
        wall = time.perf_counter() - start
        nursery.cancel_scope.cancel()
    ideal = window + one
    return {
        "clients": clients,
        "wall_s": round(wall, 3),
        "ideal_s": round(ideal, 3),
        "ratio": round(wall / ideal, 3),
        "limited": len(srv.limited),
    }


async def run(smoke: bool) -> dict[str, object]:
    async with ModelServer() as srv:
        result: dict[str, object] = {
            "latency": await latency(srv, 10 if smoke else 200, 0.0),
            "latency_50ms_model": await latency(srv, 5 if smoke else 40, 0.05),
            "throughput": await throughput(srv, 1 if smoke else 8, 2 if smoke else 5),
        }
    async with ModelServer() as srv:  # a fresh server: its rate limit starts with the fan-out
        result["fan_out"] = await fan_out(srv, 8 if smoke else 32, 1.0 if smoke else 2.0)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few rounds, to check it runs")
    parser.add_argument("--gateway-for", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gateway_for:
        with contextlib.suppress(KeyboardInterrupt):
            trio.run(serve_gateway, args.gateway_for)
        return 0
    result = trio.run(run, args.smoke)
    model_ratio = result["latency_50ms_model"]["ratio"]  # type: ignore[index]
    stream_ratio = result["throughput"]["ratio"]  # type: ignore[index]
    print(f"latency, an instant server: {result['latency']}", file=sys.stderr)
    print(f"latency, a 50 ms model: {result['latency_50ms_model']}", file=sys.stderr)
    print(f"throughput: {result['throughput']}", file=sys.stderr)
    print(f"fan-out: {result['fan_out']}", file=sys.stderr)
    result["goal"] = {"ratio": 0.9, "met": model_ratio >= 0.9 and stream_ratio >= 0.9}
    print(json.dumps({"benchmark": "gateway", **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
