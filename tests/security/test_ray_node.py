"""A hostile child on a Ray node (real ``ray.cluster_utils.Cluster``, real bwrap).

Its node's actor runs its egress proxy in the child's node directory: a target off its list is
refused there and the refusal still reaches the supervisor's run log and reject log. Another
child's node directory (0700, outside the sandbox's view) is out of its reach, and so is its
node's store of readers' snapshots: its checkout's files are links to it, read-only in its view.
"""

import json
import shutil
import socket
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray
import trio
from ray.cluster_utils import Cluster

import ipc
from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.core._supervisor import Supervisor, open_supervisor
from orchestrator.launch._nodeplan import node_root
from tests.e2e.conftest import make_repo
from tests.fakes.model_server import ModelServer

pytestmark = pytest.mark.slow

PAYLOAD = r"""
import json, os, socket, sys

other, sibling, door = int(sys.argv[1]), sys.argv[2], sys.argv[3]
own = os.environ.get("FLEET_EGRESS_SOCKET", "")
out = {"socket": own}

def attempt(fn):
    try:
        return fn()
    except OSError as e:
        return f"error {e.errno}"

def via(path, target):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    try:
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    except BrokenPipeError:
        pass
    return s.recv(4096).split(b"\r\n", 1)[0].decode() or "empty"

out["proxy_other"] = attempt(lambda: via(own, f"127.0.0.1:{other}"))
# The door: a child whose host's link carries its channel has no business there.
out["proxy_door"] = attempt(lambda: via(own, door))
# Its node host (which holds the link and its key), or any Ray worker: no process it can see.
def host(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().startswith(b"ray::")  # a Ray worker: its title
    except OSError:
        return False
out["hosts"] = [p for p in os.listdir("/proc") if p.isdigit() and host(p)]
out["list_sibling"] = attempt(lambda: sorted(os.listdir(sibling)))
out["read_sibling_key"] = attempt(
    lambda: open(os.path.join(sibling, "scratch", "tls", "cert.pem")).read()[:10]
)
out["sibling_egress"] = attempt(lambda: via(os.path.join(sibling, "egress.sock"), "x:1"))
# Its own loadout (its token): never a file it can find, nor a descriptor of it or its child's.
own_node = os.path.dirname(os.environ["TMPDIR"])
out["own_loadout"] = attempt(lambda: open(os.path.join(own_node, "loadout.json")).read()[:10])
def loadouts(pid):
    fds = f"/proc/{pid}/fd"
    return [n for n in attempt(lambda: os.listdir(fds)) if "fleet-loadout" in attempt(
        lambda: os.readlink(os.path.join(fds, n)))]
out["loadout_fds"] = loadouts("self") + loadouts(os.getppid())
# Its checkout's files are links to its node's one stored copy of the snapshot: it can neither
# find that store nor change a file every reader of the snapshot on its node would read.
root = os.path.dirname(own_node)
out["stores"] = attempt(lambda: [n for n in os.listdir(root) if n.startswith("fleet-trees-")])
out["readme"] = attempt(lambda: open("README.md").read())
out["chmod_readme"] = attempt(lambda: os.chmod("README.md", 0o644))
out["write_readme"] = attempt(lambda: open("README.md", "a").write("planted"))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    for _ in range(2):
        c.add_node(num_cpus=1, resources={"agent_slot": 2})
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    yield c
    ray.shutdown()  # the supervisor's driver (this process) first
    c.shutdown()


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fln-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _node_of(config: Config, key: str) -> Path:
    log = (config.paths.logs / f"{key}.log").read_text()
    [line] = [line for line in log.splitlines() if "node directory " in line]
    return Path(line.split("node directory ", 1)[1].strip())


async def _until(done: Callable[[], bool]) -> None:
    for _ in range(600):
        if done():
            return
        await trio.sleep(0.2)
    raise AssertionError("never happened")


def _stored(checked_out: Path) -> list[str]:
    """What the node's stores hold of the file *checked_out* (a reader's link to one)."""
    inode = checked_out.stat().st_ino
    return [
        path.read_text()
        for path in Path(node_root()).glob("fleet-trees-*/*/" + checked_out.name)
        if path.stat().st_ino == inode
    ]


async def _report(sup: Supervisor, key: str) -> dict[str, Any]:
    with trio.fail_after(120):
        [note] = await sup.wait([key])
    assert note["error"] == "", note
    result: dict[str, Any] = json.loads(note["report"])
    return result


@pytest.mark.parametrize("hosted", [False, True], ids=["actor-per-child", "node-host"])
async def test_a_hostile_child_on_a_node_is_refused_and_the_supervisor_hears(home, cluster, hosted):
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    other.setblocking(False)  # noqa: FBT003 - the stdlib's positional flag
    port = other.getsockname()[1]
    repo = make_repo(home / "repo")
    async with ModelServer() as srv:
        agents = repo / ".fleet" / "agents"
        agents.mkdir(parents=True)
        (agents / "hostile.md").write_text(
            textwrap.dedent(f"""\
                ---
                name: hostile
                description: a command child standing in for an agent CLI
                backend: command
                mode: scout
                egress: 127.0.0.1:{srv.port}
                ---
                Stand in for an agent CLI.
                """)
        )
        config = Config(
            home=home / "state", session="t", workspace=repo, agents_scope="project",
            reject_log=True, ray_address=cluster.address, ray_node_host=hosted,
        )  # fmt: skip
        async with open_supervisor(config) as sup:
            # The sibling: a reader that stays up (it hangs on its model), with a node dir.
            srv.script("hang", [{"text": "## Summary\nsibling", "delay": 600}])
            [sibling] = await sup.spawn(
                [
                    SpawnRequest(
                        task="wait",
                        backend="builtin",
                        model=f"openai:fake@{srv.base_url('hang')}/v1",
                        surface="ray",
                    )
                ]
            )
            log_of = config.paths.logs / f"{sibling.key}.log"
            await _until(lambda: log_of.exists() and "node directory " in log_of.read_text())
            sibling_node = _node_of(config, sibling.key)
            await _until(sup.runs[sibling.key].connected.is_set)
            door_host, door_port = ipc.tls_address(sup.remote.door_address)
            door = f"{door_host}:{door_port}"
            command = (sys.executable, "-c", PAYLOAD, str(port), str(sibling_node), door)
            [hostile] = await sup.spawn(
                [SpawnRequest(task="x", agent="hostile", command=command, surface="ray")]
            )
            got = await _report(sup, hostile.key)
            hostile_node = _node_of(config, hostile.key)
            stored = _stored(hostile_node / "checkout" / "README.md")
            assert sibling_node.exists()  # it was there to be attacked all along
            sandboxed = {a["key"]: a["sandboxed"] for a in sup.peek()["agents"]}
            await sup.stop([sibling.key, hostile.key])
        log = (config.paths.logs / f"{hostile.key}.log").read_text()
        rejects = [
            json.loads(line)
            for line in (config.paths.logs / "rejected.jsonl").read_text().splitlines()
        ]
    with pytest.raises(BlockingIOError):
        other.accept()  # nothing reached the host's other service
    other.close()
    assert sandboxed[hostile.key] is True
    # On a node host both are forks of its sandboxed fork server, whose own view keeps the
    # node's whole root of node directories (its memory file system here): each fork's view
    # hides it again but for its own paths.
    assert str(sibling_node.parent) == str(hostile_node.parent) == node_root()
    forked = "forked from its node's fork server"
    assert (forked in log) is hosted, log
    assert (forked in log_of.read_text()) is hosted
    # Its proxy is the node's, in its node directory, not the supervisor's session dir.
    assert got["socket"] == str(hostile_node / "egress.sock")
    assert not (config.paths.root / "egress" / f"{hostile.key}.sock").exists()
    assert got["proxy_other"] == "HTTP/1.1 403 Forbidden"
    # A hosted child's channel rides its host's link: the door is not on its allowlist.
    assert (got["proxy_door"] == "HTTP/1.1 403 Forbidden") is hosted, got
    assert got["hosts"] == [], got
    target = f"127.0.0.1:{port}"
    assert f"egress refused {target!r}: not in the egress allowlist" in log
    assert {"target": target, "reason": "not in the egress allowlist"} in [
        r["args"] for r in rejects if r["kind"] == "egress" and r["owner"] == hostile.key
    ]
    # The sibling's node directory does not exist in its view (nor would 0700 let it in).
    assert got["list_sibling"] == "error 2", got
    assert got["read_sibling_key"] == "error 2", got
    assert got["sibling_egress"] == "error 2", got
    # Its node read its loadout file and removed it before it started: it inherited the
    # loadout as a memfd, read once and closed, so the command it runs finds neither.
    assert got["own_loadout"] == "error 2", got
    assert got["loadout_fds"] == [], got
    # Its checkout is its node's stored snapshot, linked, read-only in its view.
    readme = (repo / "README.md").read_text()
    assert got["stores"] == [], got
    assert got["readme"] == readme, got
    assert got["chmod_readme"] == "error 30", got  # a read-only file system
    assert got["write_readme"] in ("error 13", "error 30"), got  # 0400, and read-only
    assert stored == [readme], stored
    assert not sibling_node.exists()
    assert not hostile_node.exists()


def _host_of(pid: int) -> psutil.Process:
    """The node host (its Ray worker, ``ray::NodeHost``) a forked child descends from."""
    for ancestor in psutil.Process(pid).parents():
        if "NodeHost" in " ".join(ancestor.cmdline()):
            return ancestor
    raise AssertionError(f"{pid} is not under a node host")


async def test_a_killed_node_host_takes_its_forked_children_and_a_new_one_serves_the_next(
    home, cluster
):
    """A node host SIGKILLed mid-turn: its fork server dies with it and every child forked
    from that server with the server, so nothing of them runs on; the child fails once, and the
    next child on the node is forked by a new host's server."""
    repo = make_repo(home / "repo")
    async with ModelServer() as srv:
        srv.script("hang", [{"text": "## Summary\nnever", "delay": 600}])
        srv.script("quick", [{"text": "## Summary\nquick"}])
        config = Config(
            home=home / "state", session="t", workspace=repo, agents_scope="project",
            ray_address=cluster.address, ray_node_host=True,
        )  # fmt: skip
        async with open_supervisor(config) as sup:
            model = f"openai:fake@{srv.base_url('hang')}/v1"
            [doomed] = await sup.spawn(
                [SpawnRequest(task="hang", backend="builtin", model=model, surface="ray")]
            )
            log_of = config.paths.logs / f"{doomed.key}.log"
            await _until(lambda: len(srv.requests("hang")) == 1)
            assert "forked from its node's fork server" in log_of.read_text()
            assert doomed.pid is not None
            child = psutil.Process(doomed.pid)
            host = _host_of(doomed.pid)
            server = next(p for p in host.children() if "fleet-node-host" in " ".join(p.cmdline()))
            host.kill()
            gone = psutil.wait_procs([child, server], timeout=30)[1]
            assert gone == [], f"outlived their node host: {gone}"
            with trio.fail_after(120):
                [note] = await sup.wait([doomed.key])
            assert note["error"], note  # it failed, once
            model = f"openai:fake@{srv.base_url('quick')}/v1"
            [after] = await sup.spawn(
                [SpawnRequest(task="quick", backend="builtin", model=model, surface="ray")]
            )
            with trio.fail_after(120):
                [note] = await sup.wait([after.key])
            assert note["report"] == "## Summary\nquick", note
            log = (config.paths.logs / f"{after.key}.log").read_text()
            assert "forked from its node's fork server" in log
            assert after.pid is not None
            assert _host_of(after.pid).pid != host.pid
            await sup.stop([doomed.key, after.key])
