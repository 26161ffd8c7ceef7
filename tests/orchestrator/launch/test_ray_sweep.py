"""A lost actor's node directory is removed by a task pinned to its node (real Ray cluster)."""

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from orchestrator.launch._ray_sweep import remove_node_directory, sweep_on_node

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def node_directory(tag: str) -> Path:
    """A node directory as a child leaves it: an unwritable directory with a file in it."""
    directory = Path(tempfile.mkdtemp(prefix=f"fleet-node-t-{tag}-"))
    locked = directory / "scratch" / "locked"
    locked.mkdir(parents=True)
    (locked / "f").write_text("left by the child\n")
    locked.chmod(0o500)
    return directory


def test_a_node_directory_is_removed_on_its_node(cluster: Cluster) -> None:
    node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    directory = node_directory("a1")
    assert sweep_on_node(node.node_id, str(directory)) == ""
    assert not directory.exists()
    assert sweep_on_node(node.node_id, str(directory)) == ""  # already gone: nothing to say


def test_nothing_but_a_node_directory_of_ours_is_touched(tmp_path: Path) -> None:
    elsewhere = tmp_path / "fleet-node-t-a1-x"
    elsewhere.mkdir()
    assert "is not a node directory" in remove_node_directory(str(elsewhere))
    assert elsewhere.exists()
    other = Path(tempfile.mkdtemp(prefix="other-"))
    try:
        assert "is not a node directory" in remove_node_directory(str(other))
        assert other.exists()
        link = Path(tempfile.gettempdir()) / f"fleet-node-t-link-{os.getpid()}"
        link.symlink_to(other)
        try:
            assert "is not a directory of ours" in remove_node_directory(str(link))
            assert other.exists()
            assert link.is_symlink()
        finally:
            link.unlink()
    finally:
        other.rmdir()


def test_a_dead_nodes_directory_is_one_line_and_no_hang(cluster: Cluster) -> None:
    node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    node_id = node.node_id
    cluster.remove_node(node, allow_graceful=False)
    directory = node_directory("a2")
    try:
        why = sweep_on_node(node_id, str(directory), timeout=5)
        assert why.startswith("its node did not remove it"), why
        assert directory.exists()  # the "node" shares this machine's /tmp: untouched
    finally:
        (directory / "scratch" / "locked").chmod(0o700)
        for root, dirs, files in os.walk(directory, topdown=False):
            for name in files:
                os.unlink(os.path.join(root, name))
            for name in dirs:
                os.rmdir(os.path.join(root, name))
        directory.rmdir()
