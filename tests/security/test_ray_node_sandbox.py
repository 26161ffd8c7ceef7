"""A Ray child's sandbox is planned on its node (real ``ray.cluster_utils.Cluster``, real bwrap).

Two nodes unlike the supervisor's machine: ``odd_tmp`` has its own temporary directory (in
``/var/tmp``), ``no_bwrap`` has no bwrap on its PATH. Each node's environment is its raylet's,
so its actors (and their children) see it.
"""

import contextlib
import json
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import trio
from ray.cluster_utils import Cluster

import sandbox
from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.core._supervisor import Supervisor, open_supervisor
from orchestrator.launch._ray import RayLauncher
from tests.e2e.conftest import make_repo

pytestmark = pytest.mark.slow

#: What the child sees of its node, as one JSON line (its report).
LOOK = r"""
import json, os, sys
node_tmp = sys.argv[1]
out = {k: os.environ.get(k, "") for k in ("TMPDIR", "FLEET_SANDBOXED", "FLEET_EGRESS_SOCKET")}
out["cwd"] = os.getcwd()
try:
    out["node_tmp"] = sorted(os.listdir(node_tmp))
except OSError as e:
    out["node_tmp"] = f"error {e.errno}"
print(json.dumps(out))
"""


@contextlib.contextmanager
def environment(**changes: str) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(changes)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def bin_without_bwrap(where: Path) -> str:
    """A PATH with git, sh and this interpreter's directory, and no bwrap."""
    where.mkdir()
    for tool in ("git", "sh"):
        found = shutil.which(tool)
        assert found is not None
        (where / tool).symlink_to(found)
    return f"{where}:{os.path.dirname(sys.executable)}"


@pytest.fixture(scope="module")
def odd() -> Iterator[dict[str, Any]]:
    base = Path(tempfile.mkdtemp(prefix="fln-odd-", dir="/tmp"))
    # Outside /tmp: the node's sandbox hides it although bwrap does not replace it.
    node_tmp = Path(tempfile.mkdtemp(prefix="fln-nodetmp-", dir="/var/tmp"))
    path = bin_without_bwrap(base / "bin")
    c = Cluster()
    c.add_node(num_cpus=0)  # the head: no agent_slot, no child lands there
    with environment(TMPDIR=str(node_tmp)):
        c.add_node(num_cpus=1, resources={"agent_slot": 2, "odd_tmp": 2})
    with environment(PATH=path):
        c.add_node(num_cpus=1, resources={"agent_slot": 2, "no_bwrap": 2})
    c.wait_for_nodes()
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    yield {"cluster": c, "node_tmp": node_tmp, "path": path, "base": base}
    ray.shutdown()
    c.shutdown()
    shutil.rmtree(node_tmp, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fln-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def config_in(home: Path, odd: dict[str, Any], *, allow: bool) -> Config:
    repo = make_repo(home / "repo")
    agents = repo / ".fleet" / "agents"
    agents.mkdir(parents=True)
    (agents / "look.md").write_text(
        textwrap.dedent("""\
            ---
            name: look
            description: a command child that reports what it sees on its node
            backend: command
            mode: scout
            ---
            Look around.
            """)
    )
    return Config(
        home=home / "state", session="t", workspace=repo, agents_scope="project",
        ray_address=odd["cluster"].address, allow_unsandboxed=allow,
    )  # fmt: skip


@pytest.fixture(params=[False, True], ids=["actor-per-child", "node-host"])
def hosted(request) -> bool:
    """Each test with an actor per child and with one host per node (``ray_node_host``)."""
    return bool(request.param)


def pin(sup: Supervisor, resource: str, hosted: bool) -> None:
    """The session's ray launcher, as it would make it, asking for one unit of *resource*."""
    sup.launchers["ray"] = RayLauncher(
        address=sup.config.ray_address,
        certify=sup.remote.certify,
        placed=sup.remote.placed,
        vouch=sup.remote.vouch,
        nursery=sup.nursery,
        session=sup.config.session,
        resources={resource: 1},
        node_host=hosted,
    )


async def look(sup: Supervisor, node_tmp: Path) -> tuple[str, dict[str, Any]]:
    command = (sys.executable, "-c", LOOK, str(node_tmp))
    [child] = await sup.spawn(
        [SpawnRequest(task="look", agent="look", command=command, surface="ray")]
    )
    with trio.fail_after(120):
        [note] = await sup.wait([child.key])
    return child.key, note


def node_of(config: Config, key: str) -> Path:
    log = (config.paths.logs / f"{key}.log").read_text()
    [line] = [line for line in log.splitlines() if "node directory " in line]
    return Path(line.split("node directory ", 1)[1].strip())


@pytest.fixture
def supervisor_without_a_sandbox(odd, monkeypatch) -> Iterator[None]:
    """This process (the supervisor) finds no bwrap: only a node can sandbox a child."""
    monkeypatch.setenv("PATH", odd["path"])
    assert not sandbox.probe(refresh=True).available
    yield
    monkeypatch.undo()
    sandbox.probe(refresh=True)


@pytest.mark.usefixtures("supervisor_without_a_sandbox")
async def test_a_node_with_its_own_temp_dir_plans_and_runs_the_sandbox(home, odd, hosted):
    node_tmp = odd["node_tmp"]
    # Not allowed to run unsandboxed, and the supervisor has no sandbox: the node's decides.
    config = config_in(home, odd, allow=False)
    async with open_supervisor(config) as sup:
        pin(sup, "odd_tmp", hosted)
        key, note = await look(sup, node_tmp)
        [agent] = sup.peek()["agents"]
        node = node_of(config, key)
        assert node.exists()
        await sup.stop([key])
    assert note["error"] == "", note
    seen = json.loads(note["report"])
    # Sandboxed by its node (the supervisor has no sandbox): the plan was made there.
    assert agent["sandboxed"] is True, agent
    assert agent["unsandboxed_reason"] == ""
    assert "running unsandboxed" not in (config.paths.logs / f"{key}.log").read_text()
    # Its node directory is in the node's temp dir, never the supervisor's.
    assert node.parent == node_tmp
    assert node.name.startswith(f"fleet-node-t-{key}-")
    assert not (Path(tempfile.gettempdir()) / node.name).exists()
    # The wrap's environment was merged on the node, with the node's paths.
    assert seen["TMPDIR"] == str(node / "scratch")
    assert seen["FLEET_SANDBOXED"] == "1"
    # Its only egress was its door: a child whose host's link carries its channel has none.
    assert seen["FLEET_EGRESS_SOCKET"] == ("" if hosted else str(node / "egress.sock"))
    assert seen["cwd"] == str(node / "checkout")
    # The node's temp dir is hidden: of it, the child sees its own node directory only.
    assert seen["node_tmp"] == [node.name], seen
    assert not node.exists()  # its actor (or host) removed it when the child ended


async def test_a_node_without_a_sandbox_refuses_the_child_in_one_line(home, odd, hosted):
    config = config_in(home, odd, allow=False)
    async with open_supervisor(config) as sup:
        pin(sup, "no_bwrap", hosted)
        key, note = await look(sup, odd["node_tmp"])
        node = node_of(config, key)
    error = note["error"]
    assert error.startswith(f"spawn {key}: no OS sandbox works on its node: bwrap not found"), note
    assert "--allow-unsandboxed" in error
    assert "\n" not in error
    assert not node.exists()  # nothing of it (its loadout, its token) stays on the node


async def test_a_node_without_a_sandbox_runs_the_child_unsandboxed_when_allowed(home, odd, hosted):
    config = config_in(home, odd, allow=True)
    async with open_supervisor(config) as sup:
        pin(sup, "no_bwrap", hosted)
        key, note = await look(sup, odd["node_tmp"])
        [agent] = sup.peek()["agents"]
        [handoff] = await sup.stop([key])
    assert note["error"] == "", note
    seen = json.loads(note["report"])
    assert agent["sandboxed"] is False, agent
    reason = agent["unsandboxed_reason"]
    assert reason.startswith("no working sandbox on its node (bwrap not found on PATH"), reason
    assert handoff["sandboxed"] is False
    assert handoff["unsandboxed_reason"] == reason
    log = (config.paths.logs / f"{key}.log").read_text()
    assert f"running unsandboxed: {reason}" in log
    assert seen["FLEET_SANDBOXED"] == "0"
    assert seen["FLEET_EGRESS_SOCKET"] == ""
