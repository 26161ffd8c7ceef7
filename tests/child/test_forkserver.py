"""The fork server's side of its protocol, spoken directly over a real socket pair.

No supervisor: the test is the supervisor's end of the ``SOCK_SEQPACKET`` pair, sends JSON
requests with real descriptors attached and reads the replies, exit reports and the forked
child's stderr.
"""

import json
import os
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TIMEOUT = 30.0


class Server:
    """A running ``python -I -m child._forkserver`` and our end of its socket."""

    def __init__(self, tmp: Path) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.sock.settimeout(TIMEOUT)
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-m", "child._forkserver", str(theirs.fileno()), str(tmp)],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        theirs.close()

    def receive(self) -> tuple[dict[str, Any], list[int]]:
        data, fds, _flags, _address = socket.recv_fds(self.sock, 1 << 20, 4)
        assert data, "the fork server closed its end"
        return json.loads(data), fds

    def send(self, message: object, fds: list[int] | None = None) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        if fds:
            socket.send_fds(self.sock, [data], fds)
        else:
            self.sock.send(data)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    started = Server(tmp_path)
    try:
        yield started
    finally:
        started.sock.close()
        try:
            started.process.wait(timeout=TIMEOUT)
        finally:
            if started.process.poll() is None:
                started.process.kill()
            assert started.process.stderr is not None
            started.process.stderr.close()


def test_the_server_says_ready_then_exits_when_our_end_closes(server: Server) -> None:
    message, fds = server.receive()
    assert message == {"ready": server.process.pid}
    assert fds == []
    server.sock.close()
    assert server.process.wait(timeout=TIMEOUT) == 0


def test_a_bad_request_gets_an_error_and_the_server_goes_on(server: Server) -> None:
    server.receive()  # ready
    server.send(b"{not json")
    reply, _ = server.receive()
    assert reply["spawned"] is None
    assert reply["error"].startswith("JSONDecodeError")
    out_r, out_w = os.pipe()
    try:
        server.send({"spawn": 5, "cwd": "/", "env": {}}, [out_w])
        reply, fds = server.receive()
    finally:
        for fd in (out_r, out_w):
            os.close(fd)
    assert reply == {
        "spawned": 5,
        "error": "ValueError: expected 4 descriptors (stdout, stderr, connection, loadout), got 1",
    }
    assert fds == []
    assert server.process.poll() is None


def test_a_fork_gets_our_stdio_and_its_exit_is_reported(server: Server, tmp_path: Path) -> None:
    server.receive()  # ready
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ours, theirs = socket.socketpair()
    # A forged loadout: a memfd that anyone holding it could still rewrite.
    forged = os.memfd_create("forged", os.MFD_ALLOW_SEALING)
    os.write(forged, b"{}")
    request = {
        "spawn": 1,
        "cwd": str(tmp_path),
        "env": {"PATH": os.environ.get("PATH", "/usr/bin"), "ONLY": "this"},
        "name": "fleet t1",
    }
    try:
        server.send(request, [out_w, err_w, theirs.fileno(), forged])
    finally:
        os.close(out_w)
        os.close(err_w)
        os.close(forged)
        theirs.close()
    reply, fds = server.receive()
    assert set(reply) == {"spawned", "pid"}
    assert reply["spawned"] == 1
    [pidfd] = fds
    pid = reply["pid"]
    try:
        # A child whose loadout is not sealed says why on its stderr and exits with code 3.
        exit_report, _ = server.receive()
        assert exit_report == {"exit": pid, "status": 3}
        with os.fdopen(err_r, "rb") as stderr:
            text = stderr.read().decode()
        assert "memfd is not sealed" in text
        assert ours.recv(1) == b""  # its connection ended with it
        assert text.startswith("child: ")
        # The pidfd names exactly the child: readable once it has ended.
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        [(ready, events)] = poller.poll(TIMEOUT * 1000)
        assert ready == pidfd
        assert events & select.POLLIN
    finally:
        os.close(pidfd)
        os.close(out_r)
        ours.close()


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """*code* in a fresh isolated interpreter, as the server's own starts."""
    return subprocess.run(
        [sys.executable, "-I", "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def test_preload_pays_a_first_dial_once_and_keeps_nothing_open() -> None:
    """A remote child's first dial pays libc's first ``getaddrinfo`` (with the ``idna`` codec
    Python encodes host names with) and OpenSSL's first context; the server pays them before
    its first fork, and holds no descriptor for it afterwards."""
    code = (
        "import os, sys\n"
        "from child._forkserver import preload\n"
        "before = set(os.listdir('/proc/self/fd'))\n"
        "assert 'encodings.idna' not in sys.modules\n"
        "preload()\n"
        "after = set(os.listdir('/proc/self/fd'))\n"
        "print('encodings.idna' in sys.modules, sorted(after - before))\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "True []"


def test_forks_of_a_warmed_server_draw_keys_of_their_own() -> None:
    """The server shakes hands with itself once before its first fork (OpenSSL's and
    ``cryptography``'s first key, certificate, handshake and record, so no remote child pays
    them): its forks still never share randomness, its throwaway key is nobody's (a
    certificate for ``warm`` no one trusts), and it says nothing on stderr."""
    code = (
        "import os, ssl, sys\n"
        "from cryptography.hazmat.primitives import serialization as s\n"
        "from cryptography.hazmat.primitives.asymmetric import ec\n"
        "from child._forkserver import preload\n"
        "preload()\n"
        "drawn = []\n"
        "for _ in range(4):\n"
        "    r, w = os.pipe()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        key = ec.generate_private_key(ec.SECP256R1()).public_key()\n"
        "        point = key.public_bytes(s.Encoding.X962, s.PublicFormat.CompressedPoint)\n"
        "        os.write(w, (point.hex() + ' ' + ssl.RAND_bytes(16).hex()).encode())\n"
        "        os._exit(0)\n"
        "    os.close(w)\n"
        "    os.waitpid(pid, 0)\n"
        "    drawn.append(os.read(r, 4096).decode())\n"
        "    os.close(r)\n"
        "print('\\n'.join(drawn))\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # warmed: no "TLS not warmed"
    lines = done.stdout.split()
    assert len(lines) == 8
    assert len(set(lines)) == 8  # four keys and four draws, none the same
