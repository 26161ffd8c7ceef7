"""The node host's slot count (no cluster: the nodes are given as ``ray.nodes()`` lists them)."""

import os

import pytest

from orchestrator._config import load_config
from orchestrator._errors import UsageError
from orchestrator.launch._ray_host import HostedChild, NodeHost, Slots


def node(name: str, slots: float, alive: bool = True, **more: float) -> dict[str, object]:
    return {"NodeID": name, "Alive": alive, "Resources": {"agent_slot": slots, **more}}


NODES = [node("a", 2), node("b", 1), node("gone", 4, alive=False), node("plain", 0)]


def take(slots: Slots, spread: bool = True, nodes=NODES, **needs: float) -> str | None:
    return slots.take("agent_slot", needs, spread, nodes)


def test_spread_takes_the_least_used_node_and_a_full_cluster_waits():
    slots = Slots()
    got = [take(slots) for _ in range(3)]
    assert got == ["a", "b", "a"]  # one each before a second on a
    assert take(slots) is None  # every lane full: the launch waits
    slots.free("b")
    assert take(slots) == "b"


def test_pack_fills_one_node_first():
    slots = Slots()
    assert [take(slots, spread=False) for _ in range(3)] == ["a", "a", "b"]


def test_dead_nodes_nodes_without_slots_and_unpinned_nodes_are_never_used():
    slots = Slots()
    nodes = [*NODES, node("gpu", 1, gpu=1)]
    assert take(slots, nodes=nodes, gpu=1) == "gpu"
    assert take(slots, nodes=nodes, gpu=1) is None


def test_a_node_whose_host_could_not_start_is_passed_over():
    slots = Slots()
    slots.avoid("a")
    assert take(slots) == "b"
    assert take(slots) is None
    slots.avoid("b", seconds=0)
    slots.free("b")
    assert take(slots) == "b"


def test_a_hosted_childs_slot_frees_once_and_only_its_calls_are_served():
    slots = Slots()
    assert take(slots) == "a"
    child = HostedChild(None, "c1", "a", slots)
    child.free_slot()
    child.release()  # after free_slot: the slot is not freed twice
    assert [take(slots) for _ in range(4)] == ["a", "b", "a", None]
    with pytest.raises(AttributeError):
        child.kill  # noqa: B018 - only the child's calls exist
    with pytest.raises(RuntimeError, match="does not serve"):
        NodeHost().call("c1", "__init__", ())


def test_node_host_and_placement_come_from_config_and_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEET_RAY_NODE_HOST", raising=False)
    monkeypatch.delenv("FLEET_RAY_PLACEMENT", raising=False)
    config = load_config(home=tmp_path, cwd=tmp_path)
    assert (config.ray_node_host, config.ray_placement) == (True, "spread")  # the defaults
    monkeypatch.setenv("FLEET_RAY_NODE_HOST", "0")
    monkeypatch.setenv("FLEET_RAY_PLACEMENT", "pack")
    config = load_config(home=tmp_path, cwd=tmp_path)
    assert (config.ray_node_host, config.ray_placement) == (False, "pack")
    monkeypatch.setenv("FLEET_RAY_NODE_HOST", "1")
    assert load_config(home=tmp_path, cwd=tmp_path).ray_node_host is True
    monkeypatch.setenv("FLEET_RAY_PLACEMENT", "scatter")
    with pytest.raises(UsageError, match="spread or pack"):
        load_config(home=tmp_path, cwd=tmp_path)


def test_a_childs_key_is_made_below_its_node_directory_and_its_finish_always_releases():
    """The opening round trip makes the key in the node directory (a relative TLS directory
    that climbs out is refused); :meth:`NodeHost.finish` releases the child's state and
    removes its node directory even when its last step fails."""
    host = NodeHost()
    [directory, csr] = host.open(
        "k#1", [("make_node", ("t", "k")), ("request_certificate", ("scratch/tls", "t", "k"))]
    )
    assert csr.startswith(b"-----BEGIN CERTIFICATE REQUEST-----")
    assert os.listdir(os.path.join(directory, "scratch", "tls")) == ["key.pem"]
    for climbing in ("../tls", "scratch/../../tls", "/abs/../tls"):
        with pytest.raises(RuntimeError, match=r"not below|TLS key"):
            host.call("k#1", "request_certificate", (climbing, "t", "k"))
    assert not os.path.exists(os.path.join(os.path.dirname(directory), "tls"))
    with pytest.raises(RuntimeError, match="not below"):
        host.finish("k#1", [("request_certificate", ("../elsewhere", "t", "k"))])
    assert host.count() == 0
    assert not os.path.exists(directory)


def test_a_hosts_threads_follow_its_nodes_lanes():
    """Three a lane (a child's exit watch, its refusals poll, and a poll outlasting its child
    while the lane's next child holds two) and spare ones for the calls that never block; a
    node listed without lanes still gets a working host."""
    from orchestrator.launch._ray_host import threads_for  # noqa: PLC0415

    assert threads_for(16) == 64
    assert threads_for(1) == 19
    assert threads_for(0) == 19
    slots = Slots()
    assert slots.lanes("a", "agent_slot", NODES) == 2
    assert slots.lanes("plain", "agent_slot", NODES) == 0
    assert slots.lanes("nowhere", "agent_slot", NODES) == 0


def test_half_a_node_links_wiring_is_refused_not_quietly_dropped() -> None:
    from orchestrator.launch._ray import RayLauncher  # noqa: PLC0415

    with pytest.raises(ValueError, match=r"placed, vouch and nursery together \(given: placed\)"):
        RayLauncher(node_host=True, placed=lambda _link, _key: None)
    assert not RayLauncher(node_host=True).carries  # none of it: children dial, as asked
