"""A node host's link outlives its leaves: the supervisor renews the link's certificate through
Ray before it runs out, and every channel the link carries is vouched again, so a child on the
link works on through several leaf lifetimes (a real cluster, a real supervisor, real TLS)."""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import ray
import trio
from ray.cluster_utils import Cluster

import ipc
from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.core._supervisor import open_supervisor
from orchestrator.remote._ca import SessionCA
from tests.e2e.conftest import make_repo
from tests.fakes.model_server import ModelServer

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.slow

#: Each leaf's life here: renewed at two thirds (4 s); the child's turn takes three lives.
LIFE_S = 6


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    c.add_node(num_cpus=1, resources={"agent_slot": 2})
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fln-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_childs_channel_outlives_its_links_leaves(
    home: Path, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    signed: list[str] = []
    sign = SessionCA.sign

    def short(ca: SessionCA, csr: bytes, owner: str, **kwargs: Any) -> bytes:
        signed.append(owner)
        # A leaf starts a minute back (clocks differ): LIFE_S left from now.
        return sign(ca, csr, owner, lifetime=dt.timedelta(seconds=60 + LIFE_S))

    monkeypatch.setattr(SessionCA, "sign", short)
    repo = make_repo(home / "repo")
    config = Config(
        home=home / "state", session="t", workspace=repo, agents_scope="project",
        ray_address=cluster.address, ray_node_host=True,
    )  # fmt: skip
    async with ModelServer() as srv, open_supervisor(config) as sup:
        srv.script("slow", [{"text": "## Summary\nlived on", "delay": 3 * LIFE_S}])
        [child] = await sup.spawn(
            [
                SpawnRequest(
                    task="wait",
                    backend="builtin",
                    model=f"openai:fake@{srv.base_url('slow')}/v1",
                    surface="ray",
                )
            ]
        )
        with trio.fail_after(120):
            [note] = await sup.wait([child.key])
    log = (config.paths.logs / f"{child.key}.log").read_text()
    assert note["error"] == "", (note, log)
    assert "lived on" in note["report"]
    assert "its channel rides its node host's link" in log
    assert "expired" not in log, log
    # Only the link was ever signed for (the child has no certificate of its own), and again
    # before each leaf ran out.
    assert signed, signed
    assert all(ipc.is_link_owner(owner) for owner in signed), signed
    assert len(signed) >= 3, signed
    assert len(set(signed)) == 1  # one link, renewed
