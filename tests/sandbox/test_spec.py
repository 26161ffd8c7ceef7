"""SandboxSpec: who may write, and the network default of each policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import Policy, SandboxError, SandboxSpec


@pytest.mark.parametrize("policy", [Policy.READ_ONLY, Policy.REVIEW])
def test_only_workers_may_have_writable_paths(policy, tmp_path):
    with pytest.raises(SandboxError, match=f"policy {policy.value} was given writable paths"):
        SandboxSpec(policy=policy, scratch=tmp_path, writable=(tmp_path / "wt",))


def test_worker_keeps_its_writable_paths(tmp_path):
    spec = SandboxSpec(policy=Policy.WORKER, scratch=tmp_path, writable=(tmp_path / "wt",))
    assert spec.writable == (tmp_path / "wt",)


@pytest.mark.parametrize(
    ("policy", "network", "allowed"),
    [
        (Policy.READ_ONLY, None, False),
        (Policy.REVIEW, None, True),
        (Policy.WORKER, None, False),
        (Policy.READ_ONLY, True, True),
        (Policy.REVIEW, False, False),
        (Policy.WORKER, True, True),
    ],
)
def test_network_defaults_to_the_policy_and_can_be_overridden(policy, network, allowed, tmp_path):
    assert SandboxSpec(policy=policy, scratch=tmp_path, network=network).allows_network is allowed


def test_paths_given_as_strings_and_lists_become_path_tuples(tmp_path):
    spec = SandboxSpec(
        policy=Policy.WORKER,
        scratch=str(tmp_path),
        visible=[str(tmp_path / "repo")],
        writable=[tmp_path / "wt"],
        sockets=[str(tmp_path / "ipc")],
    )
    assert spec.scratch == tmp_path
    assert spec.visible == (tmp_path / "repo",)
    assert spec.writable == (tmp_path / "wt",)
    assert spec.sockets == (tmp_path / "ipc",)
    hash(spec)  # frozen and hashable: usable as a cache key
    assert spec == SandboxSpec(
        policy=Policy.WORKER,
        scratch=tmp_path,
        visible=(Path(tmp_path / "repo"),),
        writable=(tmp_path / "wt",),
        sockets=(tmp_path / "ipc",),
    )


def test_policy_values_are_the_wire_names():
    assert [p.value for p in Policy] == ["read_only", "review", "worker"]
