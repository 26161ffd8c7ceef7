"""A remote child's TLS, paid in a fork of the fork server: warmed (``child._tls.warm``) or not.

A Ray node's child is a fork of its node host's fork server (``child/_forkserver.py``) that dials
the supervisor's door over mutual TLS. What OpenSSL and ``cryptography`` do the first time in a
process (each algorithm's first fetch, the PEM decoders, the certificate parser) every fork pays
again unless the server did it before forking. Here a process that stands in for the server
preloads exactly as the server does, then forks one child per certificate, in turn; each child
takes its credentials (``Credentials.take``: its key, leaf and the session CA, and its client
context), dials a TLS server in another process over a Unix socket, shakes hands, makes 20 round
trips of 200 bytes and checks its leaf's age, measuring its own CPU for each step. Rounds
alternate a server that warmed TLS with one that did only what the server did before
(``ssl.SSLContext()`` once); the figure is warmed ÷ cold per round (the median), below 1 when
warming pays. Last line: one JSON object.

    .venv/bin/python benchmarks/fork_tls.py [--rounds R] [--forks F] [--smoke]
"""

import argparse
import itertools
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

STEPS = ("credentials", "dial", "round_trips")


def serve(forks: int) -> None:
    """The other process: a session CA, *forks* certified node directories, a TLS server."""
    from child._tls import install_certificate, make_key_and_csr  # noqa: PLC0415
    from orchestrator.remote._ca import SessionCA  # noqa: PLC0415

    ca = SessionCA("bench")
    context = ca.server_context("127.0.0.1")
    base = Path(tempfile.mkdtemp(prefix="fleet-bench-tls-"))
    directories = []
    for i in range(forks):
        directory = base / f"a{i}"
        directory.mkdir(mode=0o700)
        csr = make_key_and_csr(directory, "bench", f"a{i}")
        install_certificate(directory, ca.sign(csr, f"a{i}"), ca.certificate_pem)
        directories.append(str(directory))
    path = str(base / "door.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(64)
    print(json.dumps({"socket": path, "directories": directories, "base": str(base)}), flush=True)

    def echo(conn: socket.socket) -> None:
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                while tls.recv(4096):
                    tls.sendall(b"y" * 200)
        except (OSError, ssl.SSLError):
            pass

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()


def remote_child(directory: str, path: str, out: int) -> None:
    """In the fork: the remote child's steps, each step's CPU written to *out*."""
    from child._tls import Credentials  # noqa: PLC0415 - preloaded

    marks = [time.process_time()]
    credentials, context = Credentials.take(Path(directory), "bench", Path(directory).name)
    marks.append(time.process_time())
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    tls = context.wrap_socket(sock, server_hostname="127.0.0.1")
    marks.append(time.process_time())
    for _ in range(20):
        tls.sendall(b"x" * 200)
        tls.recv(4096)
    credentials.due()
    marks.append(time.process_time())
    os.write(out, json.dumps([b - a for a, b in itertools.pairwise(marks)]).encode())


def round_of(warm: bool, forks: int) -> dict[str, float]:
    """One stand-in server (warmed or not) forking *forks* children in turn: each step's
    median CPU in ms."""
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(forks)], stdout=subprocess.PIPE, text=True
    )
    told: dict[str, Any] = {}
    try:
        assert server.stdout is not None
        told = json.loads(server.stdout.readline())
        code = (
            "import gc, json, os, ssl, sys\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "import fork_tls\n"
            "from child import _tls, _forkserver\n"
            f"if not {warm}:\n"
            "    _tls.warm = lambda: ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # as before\n"
            "_forkserver.preload()\n"
            "gc.collect()\n"
            "gc.freeze()\n"
            "print(json.dumps(fork_tls.forks(json.loads(sys.argv[1]))))\n"
        )
        done = subprocess.run(
            [sys.executable, "-I", "-c", code, json.dumps(told)],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
        return result
    finally:
        server.kill()
        server.wait()
        if told:
            shutil.rmtree(told["base"], ignore_errors=True)


def forks(told: dict[str, Any]) -> dict[str, float]:
    """In the stand-in server: fork one child per directory, in turn."""
    steps: list[list[float]] = []
    for directory in told["directories"]:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                remote_child(directory, told["socket"], write)
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        data = os.read(read, 4096)
        os.close(read)
        steps.append(json.loads(data))
    return {
        name: round(statistics.median(s[i] for s in steps) * 1000, 3)
        for i, name in enumerate(STEPS)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds each way (default 6)")
    parser.add_argument("--forks", type=int, default=40, help="forks a round (default 40)")
    parser.add_argument("--smoke", action="store_true", help="1 round of 3 forks each way")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    rounds, count = (1, 3) if args.smoke else (args.rounds, args.forks)
    ratios, cold_total, warm_total = [], [], []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {warm: round_of(warm, count) for warm in order}
        cold, warm = sum(got[False].values()), sum(got[True].values())
        ratios.append(warm / cold)
        cold_total.append(cold)
        warm_total.append(warm)
        print(
            f"round {r + 1}/{rounds}: cold {got[False]} ms, warmed {got[True]} ms",
            flush=True,
        )
    ratio = statistics.median(ratios)
    print(
        f"a remote child's TLS in a fork, CPU: warmed {statistics.median(warm_total):.2f} ms "
        f"against {statistics.median(cold_total):.2f} ms (ratio {ratio:.2f})"
    )
    print(
        json.dumps(
            {
                "benchmark": "fork_tls",
                "forks": count,
                "rounds": rounds,
                "warm_ratio": round(ratio, 3),
                "warm_ratios": [round(x, 3) for x in ratios],
                "cold_ms": round(statistics.median(cold_total), 3),
                "warm_ms": round(statistics.median(warm_total), 3),
            }
        )
    )


if __name__ == "__main__":
    main()
