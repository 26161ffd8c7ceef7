"""Sandboxed children forked from the sandboxed fork server (performance issue, item 2).

Two hostile ``command``-backend scouts, both forks of the one sandboxed fork server, run at the
same time under real bubblewrap. The victim leaves secrets everywhere a shared path could carry
them (its scratch, ``/tmp``, ``/dev/shm``), listens on a loopback port and an abstract Unix
socket, and waits. The attacker then tries to read and list them, connect to both sockets,
signal, ptrace and ``pidfd_open`` the victim by its host pid, and duplicates every socket any
process it can see holds (``pidfd_getfd``) looking for the fork server's ``SOCK_SEQPACKET``
channel. Every attempt must fail; each child has namespaces of its own (mount, pid, net, ipc,
uts, user), the seccomp filter, no capability and ``no_new_privs``; and an honest scout forked
after them still completes.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from orchestrator._records import SpawnRequest
from orchestrator.core._supervisor import open_supervisor
from orchestrator.launch._launcher import LaunchedProcess
from tests.security._view_util import World, make_repo

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.slow
CEILING = 90
NAMESPACES = ("mnt", "pid", "net", "ipc", "uts", "user")

VICTIM = r"""
import json, os, socket, sys, time
secret, port, abstract = sys.argv[1:4]
scratch = os.environ["TMPDIR"]
for path in (f"{scratch}/secret", "/tmp/victim-secret", "/dev/shm/victim-secret"):
    with open(path, "w") as f:
        f.write(secret)
tcp = socket.socket(); tcp.bind(("127.0.0.1", int(port))); tcp.listen()
unix = socket.socket(socket.AF_UNIX); unix.bind("\0" + abstract); unix.listen()
ns = {name: os.readlink(f"/proc/self/ns/{name}") for name in sys.argv[4].split(",")}
with open(f"{scratch}/ready.json", "w") as f:
    json.dump({"ns": ns}, f)
deadline = time.monotonic() + 60
while not os.path.exists(f"{scratch}/go") and time.monotonic() < deadline:
    time.sleep(0.05)
print("victim: done")
"""

ATTACKER = r"""
import ctypes, errno, json, os, signal, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
victim_scratch, victim_pid, port, abstract = sys.argv[1:5]
victim_pid = int(victim_pid)
out = {}
def attempt(name, action):
    try:
        out[name] = "ok:" + str(action())
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc))
def syscall(number, *args):
    result = libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result
attempt("read scratch", lambda: open(f"{victim_scratch}/secret").read())
attempt("list scratch root", lambda: ",".join(sorted(os.listdir(os.path.dirname(victim_scratch)))))
attempt("list tmp", lambda: ",".join(sorted(os.listdir("/tmp"))))
attempt("list shm", lambda: ",".join(sorted(os.listdir("/dev/shm"))))
def tcp():
    with socket.create_connection(("127.0.0.1", int(port)), timeout=2):
        return "connected"
attempt("tcp", tcp)
def unix():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect("\0" + abstract)
        return "connected"
attempt("abstract", unix)
attempt("kill", lambda: os.kill(victim_pid, 0))
attempt("ptrace", lambda: syscall(101, ctypes.c_long(16), ctypes.c_long(victim_pid), None, None))
attempt("pidfd_open", lambda: syscall(434, ctypes.c_int(victim_pid), ctypes.c_uint(0)))
# Every socket any visible process holds, duplicated and typed: the fork server's channel is
# the only SOCK_SEQPACKET socket a fleet makes.
types = []
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    try:
        pidfd = syscall(434, ctypes.c_int(pid), ctypes.c_uint(0))
    except OSError:
        continue
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                    continue
                dup = syscall(438, ctypes.c_int(pidfd), ctypes.c_int(int(fd)), ctypes.c_uint(0))
            except OSError:
                continue
            with socket.socket(fileno=dup) as s:
                types.append(s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE))
    finally:
        os.close(pidfd)
out["socket types"] = types
out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["ns"] = {name: os.readlink(f"/proc/self/ns/{name}") for name in sys.argv[5].split(",")}
with open("/proc/self/status") as f:
    out["status"] = {k: v.strip() for k, _, v in (l.partition(":") for l in f)}
with open(os.path.join(os.environ["TMPDIR"], "attack.json"), "w") as f:
    json.dump(out, f)
print("attacker: done")
"""


@pytest.fixture
def far_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A world whose state directory is *not* under /tmp (as ``~/.local/state`` is not), so
    only the child's own tmpfs over it, not the one over /tmp, hides a sibling's scratch."""
    home = Path(tempfile.mkdtemp(prefix="flf-", dir="/var/tmp"))
    monkeypatch.setenv("FLEET_HOME", str(home))
    for name in ("FLEET_MODEL", "FLEET_SESSION", "FLEET_SANDBOX", "FLEET_ALLOW_UNSANDBOXED"):
        monkeypatch.delenv(name, raising=False)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    try:
        yield World(home=home, repo=make_repo(tmp_path / "repo"), scripts=scripts)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _command(name: str, payload: str, *args: str) -> SpawnRequest:
    return SpawnRequest(
        task="escape",
        name=name,
        agent="scout",
        backend="command",
        command=(sys.executable, "-c", payload, *args),
    )


async def _settled(sup: Any, key: str) -> dict[str, Any]:
    [note] = await sup.wait([key], timeout=60)
    return dict(note)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _launched(sup: Any, key: str) -> LaunchedProcess:
    launched = sup.runs[key].launched
    assert isinstance(launched, LaunchedProcess)
    return launched


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_a_forked_scout_reaches_nothing_of_a_forked_sibling(far_world: World) -> None:
    world = far_world
    secret = secrets.token_hex(16)
    port, abstract = _free_port(), f"fleet-victim-{secrets.token_hex(4)}"
    with trio.fail_after(CEILING):
        async with open_supervisor(world.config()) as sup:
            boxed = sup.boxed_fork_server
            assert boxed is not None
            assert await boxed.ready(), boxed.failure
            [victim] = await sup.spawn(
                [_command("victim", VICTIM, secret, str(port), abstract, ",".join(NAMESPACES))]
            )
            scratch = world.session / "scratch" / victim.key
            await trio.to_thread.run_sync(_wait_for, scratch / "ready.json")
            victim_pid = _launched(sup, victim.key).pid
            [attacker] = await sup.spawn(
                [
                    _command(
                        "attacker",
                        ATTACKER,
                        str(scratch),
                        str(victim_pid),
                        str(port),
                        abstract,
                        ",".join(NAMESPACES),
                    )
                ]
            )
            attacked = await _settled(sup, attacker.key)
            # Read while the attacker is idle: a child's scratch goes with it when it ends.
            got = json.loads((world.session / "scratch" / attacker.key / "attack.json").read_text())
            ready = json.loads((scratch / "ready.json").read_text())
            (scratch / "go").touch()
            victim_note = await _settled(sup, victim.key)
            for key in (victim.key, attacker.key):
                launched = _launched(sup, key)
                assert launched.forked, launched.describe()
                assert sup.all_records()[key].sandboxed is True
            # The fleet still serves the honest, forked too.
            [honest] = await sup.spawn([world.honest()])
            assert "honest:" in (await _settled(sup, honest.key))["report"]
            assert _launched(sup, honest.key).forked
    assert "victim: done" in victim_note["report"], victim_note
    assert "attacker: done" in attacked["report"], attacked
    assert secret not in json.dumps(got)
    assert not got["read scratch"].startswith("ok"), got["read scratch"]
    assert got["list scratch root"] == f"ok:{attacker.key}", got["list scratch root"]
    assert "victim-secret" not in got["list tmp"]
    assert "victim-secret" not in got["list shm"]
    for name in ("tcp", "abstract", "kill", "ptrace", "pidfd_open"):
        assert not got[name].startswith("ok"), (name, got[name])
    assert got["kill"] == "ESRCH"
    assert got["pidfd_open"] == "ESRCH"
    import socket  # noqa: PLC0415

    assert socket.SOCK_SEQPACKET not in got["socket types"], got["socket types"]
    # Its own pid namespace: a handful of pids of its own, none of the host's.
    assert victim_pid not in got["pids"]
    assert max(got["pids"]) < 100, got["pids"]
    for name in NAMESPACES:
        assert got["ns"][name] != ready["ns"][name], name
        assert got["ns"][name] != os.readlink(f"/proc/self/ns/{name}"), name
    status = got["status"]
    assert status["Seccomp"] == "2", status
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert status[field] == "0000000000000000", (field, status[field])
    assert status["NoNewPrivs"] == "1"
