"""Network by policy: a hostile child reaches its model and nothing else (real bwrap).

The hostile child is a ``command``-backend child standing in for an agent CLI after a prompt
injection: its definition names the model endpoint (``egress:``), so it runs in a
``--unshare-net`` sandbox with an egress proxy, exactly like a pi/claude/codex child. Its Python
payload tries a loopback port that is not the model (directly and by a CONNECT through the
proxy socket it was given), a public address, and the model itself, and prints what it got.
"""

import json
import shutil
import socket
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.core._supervisor import Supervisor, open_supervisor
from tests.e2e.conftest import make_repo
from tests.fakes.model_server import ModelServer

pytestmark = pytest.mark.slow

PAYLOAD = r"""
import json, os, socket, sys

model, other, sibling = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
out = {"socket_env": bool(os.environ.get("FLEET_EGRESS_SOCKET"))}

def direct(host, port):
    try:
        s = socket.create_connection((host, port), timeout=3)
        s.sendall(b"GET /c/hostile/probe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        return data.split(b"\r\n", 1)[0].decode() or "empty"
    except OSError as e:
        return f"error {e.errno}"

def via(path, target):
    if not path:
        return "no socket"
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(path)
        try:
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        except BrokenPipeError:
            pass  # refused before it read a byte: its answer is still there to read
        return s.recv(4096).split(b"\r\n", 1)[0].decode() or "empty"
    except OSError as e:
        return f"error {e.errno}"

own = os.environ.get("FLEET_EGRESS_SOCKET", "")
out["direct_other"] = direct("127.0.0.1", other)
out["direct_public"] = direct("1.1.1.1", 80)
out["proxy_other"] = via(own, f"127.0.0.1:{other}")
out["proxy_other_by_name"] = via(own, f"localhost:{other}")
out["direct_model"] = direct("127.0.0.1", model)
out["sibling_socket"] = via(sibling, f"127.0.0.1:{model}")
print(json.dumps(out))
"""


@pytest.fixture
def home() -> Iterator[Path]:
    # Short: the session's sockets must fit in sun_path.
    path = Path(tempfile.mkdtemp(prefix="fle-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def other_port() -> Iterator[tuple[socket.socket, int]]:
    """A loopback service on the host that is not the model: no child may reach it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)  # noqa: FBT003 - the stdlib's positional flag
    yield listener, listener.getsockname()[1]
    listener.close()


def _write_definition(repo: Path, model_port: int) -> None:
    agents = repo / ".fleet" / "agents"
    agents.mkdir(parents=True)
    (agents / "hostile.md").write_text(
        textwrap.dedent(f"""\
            ---
            name: hostile
            description: a command child standing in for an agent CLI that talks to a model
            backend: command
            mode: scout
            egress: 127.0.0.1:{model_port}
            ---
            Stand in for an agent CLI.
            """)
    )


def _payload(model: int, other: int, sibling: str) -> tuple[str, ...]:
    return (sys.executable, "-c", PAYLOAD, str(model), str(other), sibling)


async def _report(sup: Supervisor, key: str) -> dict[str, Any]:
    with trio.fail_after(90):
        [note] = await sup.wait([key])
    assert note["error"] == "", note
    result: dict[str, Any] = json.loads(note["report"])
    return result


async def test_a_model_using_child_reaches_its_model_and_nothing_else(home, other_port):
    listener, other = other_port
    repo = make_repo(home / "repo")
    async with ModelServer() as srv:
        srv.script("honest", [{"text": "## Summary\nhonest and sandboxed"}])
        _write_definition(repo, srv.port)
        config = Config(
            home=home / "state", session="t", workspace=repo, agents_scope="project",
            reject_log=True,
        )  # fmt: skip
        async with open_supervisor(config) as sup:
            [hostile] = await sup.spawn(
                [SpawnRequest(task="x", agent="hostile", command=_payload(srv.port, other, ""))]
            )
            got = await _report(sup, hostile.key)
            # A child with no model, handed the hostile child's proxy socket path.
            egress_socket = config.paths.root / "egress" / f"{hostile.key}.sock"
            [plain] = await sup.spawn(
                [
                    SpawnRequest(
                        task="x",
                        backend="command",
                        command=_payload(srv.port, other, str(egress_socket)),
                    )
                ]
            )
            plain_got = await _report(sup, plain.key)
            # The fleet still serves an honest model-using child, sandboxed, through its proxy.
            [honest] = await sup.spawn(
                [
                    SpawnRequest(
                        task="say it",
                        backend="builtin",
                        model=f"openai:fake@{srv.base_url('honest')}/v1",
                    )
                ]
            )
            with trio.fail_after(90):
                [honest_note] = await sup.wait([honest.key])
            sandboxed = {a["key"]: a["sandboxed"] for a in sup.peek()["agents"]}
        hostile_log = (config.paths.logs / f"{hostile.key}.log").read_text()
        plain_log = (config.paths.logs / f"{plain.key}.log").read_text()
        rejects = [
            json.loads(line)
            for line in (config.paths.logs / "rejected.jsonl").read_text().splitlines()
        ]
        probes = [r for r in srv.requests("hostile") if r.path.endswith("/probe")]

    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing ever reached the host's other service
    assert sandboxed == {hostile.key: True, plain.key: True, honest.key: True}

    # The model-using child: its model, and only its model.
    assert got["socket_env"] is True
    assert got["direct_other"] == "error 111"  # its own loopback: nothing listens there
    assert got["direct_public"] == "error 101"  # no route: the namespace has only lo
    assert got["proxy_other"] == "HTTP/1.1 403 Forbidden"
    assert got["proxy_other_by_name"] == "HTTP/1.1 403 Forbidden"
    assert got["direct_model"].startswith("HTTP/1.1 ")  # the model server answered
    assert len(probes) == 1  # its direct probe; nothing of the no-model child arrived
    for target in (f"127.0.0.1:{other}", f"localhost:{other}"):
        assert f"egress refused {target!r}: not in the egress allowlist" in hostile_log
        assert {"target": target, "reason": "not in the egress allowlist"} in [
            r["args"] for r in rejects if r["kind"] == "egress" and r["owner"] == hostile.key
        ]

    # The child with no model: no network at all, and the sibling's proxy refuses it.
    assert plain_got["socket_env"] is False
    assert plain_got["direct_model"] == "error 111"
    assert plain_got["direct_other"] == "error 111"
    assert plain_got["direct_public"] == "error 101"
    assert plain_got["proxy_other"] == "no socket"
    if plain_got["sibling_socket"] != "error 2":  # the path is reachable while state is visible
        assert plain_got["sibling_socket"] == "HTTP/1.1 403 Forbidden"
        assert "not in this child's process tree" in hostile_log
    assert "egress" not in plain_log

    assert (honest_note["error"], honest_note["report"]) == ("", "## Summary\nhonest and sandboxed")


ATTACKS = r"""
import json, os, socket, sys

model, other = int(sys.argv[1]), int(sys.argv[2])
path = os.environ["FLEET_EGRESS_SOCKET"]

def ask(head, *, then=b"", whole=False):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    try:
        s.sendall(head)
        if then:
            first = s.recv(4096)
            s.sendall(then)
    except BrokenPipeError:
        pass  # refused before it read all: the answer is still there to read
    data = first if then else b""
    try:
        while chunk := s.recv(4096):
            data += chunk
            if not whole:
                break
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
    return data.decode("latin-1") if whole else data.split(b"\r\n", 1)[0].decode("latin-1")

def connect(target):
    return ask(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode("latin-1"))

def code(line):
    return line[9:12] if line.startswith("HTTP/1.1 ") else line

out = {"targets": []}
for target in [
    f"127.0.0.1:{other}", f"localhost:{other}", f"[::1]:{other}", f"[::1]:{model}",
    f"2130706433:{model}", f"0x7f000001:{model}", f"127.1:{model}", f"0177.0.0.1:{model}",
    f"127.0.0.2:{model}", f"[::ffff:127.0.0.1]:{model}", f"127.0.0.1.:{model}",
    f"localhost.:{model}", f"127.0.0.1\x00.evil.example:{model}", f"127.0.0.1:{model}\x00",
    f"127.0.0.1\x00:{other}", "169.254.169.254:80", "[fd00:ec2::254]:80",
    f"127.0.0.1:{model}@127.0.0.1:{other}", f"127.0.0.1:+{model}", f"127.0.0.1:{model + 65536}",
]:
    out["targets"].append(code(connect(target)))
# Not a CONNECT: an absolute-URI request, a lower-case method, a request line with extra spaces.
out["absolute"] = code(ask(f"GET http://127.0.0.1:{other}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode()))
out["metadata"] = code(ask(b"GET http://169.254.169.254/latest/ HTTP/1.1\r\nHost: x\r\n\r\n"))
out["lower"] = code(ask(f"connect 127.0.0.1:{other} HTTP/1.1\r\n\r\n".encode()))
out["spaces"] = code(ask(f"CONNECT  127.0.0.1:{other} HTTP/1.1\r\n\r\n".encode()))
# A second CONNECT on an allowed tunnel goes to the model server (as data), never to the proxy;
# and a second CONNECT pipelined behind the first in one write likewise.
hop = f"CONNECT 127.0.0.1:{other} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
first = f"CONNECT 127.0.0.1:{model} HTTP/1.1\r\n\r\n".encode()
for name, answer in (
    ("second", ask(first, then=hop, whole=True)), ("pipelined", ask(first + hop, whole=True))
):
    tunnel, _, rest = answer.partition("\r\n\r\n")
    out[name] = [code(tunnel), answer.count("Connection established"), code(rest)]
print(json.dumps(out))
"""


async def test_a_hostile_child_cannot_spell_its_way_past_the_egress_allowlist(home, other_port):
    """#36 item 3: other host:ports, loopback's other spellings, ``[::1]``, null bytes and
    trailing dots, the metadata address, absolute-URI requests and a second CONNECT on a
    tunnel — every one refused or kept inside the allowed tunnel, nothing reaches the host."""
    listener, other = other_port
    repo = make_repo(home / "repo")
    async with ModelServer() as srv:
        _write_definition(repo, srv.port)
        config = Config(
            home=home / "state", session="t", workspace=repo, agents_scope="project",
            reject_log=True,
        )  # fmt: skip
        async with open_supervisor(config) as sup:
            command = (sys.executable, "-c", ATTACKS, str(srv.port), str(other))
            [hostile] = await sup.spawn([SpawnRequest(task="x", agent="hostile", command=command)])
            got = await _report(sup, hostile.key)
            sandboxed = sup.peek([hostile.key])["agents"][0]["sandboxed"]
        log = (config.paths.logs / f"{hostile.key}.log").read_text()
        tunnelled = [r for r in srv.requests() if r.method == "CONNECT"]
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing ever reached the host's other service
    assert sandboxed is True
    assert (got["absolute"], got["metadata"], got["lower"]) == ("405", "405", "405")
    assert got["spaces"] == "400"
    assert [code for code in got["targets"] if code not in {"403", "400"}] == []
    assert "egress refused '169.254.169.254:80': not in the egress allowlist" in log
    assert f"egress refused '[::1]:{srv.port}': not in the egress allowlist" in log
    # The tunnel's second CONNECT reached the model server as data, which refused it itself.
    for tunnel, established, then in (got["second"], got["pipelined"]):
        assert (tunnel, established) == ("200", 1)
        assert then.startswith("4"), then
    assert len(tunnelled) <= 2
