"""A Ray child's sandbox plan, realised on its node (``orchestrator.launch._nodeplan``).

The node's side runs here in-process on a real node directory made by :class:`ChildActor`
(no Ray needed for that), with the real sandbox probe: a plan may make a child see less,
never more, and the supervisor takes only a node directory name it recognises.
"""

import itertools
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

import sandbox
from orchestrator._errors import OperationFailed, PolicyError
from orchestrator.launch import _nodeplan
from orchestrator.launch._nodeplan import (
    NodePlan,
    node_directory_of,
    node_root,
    node_roots,
    realise,
)
from orchestrator.launch._ray_node import ChildActor


@pytest.fixture
def actor() -> Iterator[ChildActor]:
    a = ChildActor()
    a.make_node("t", "a1")
    a.write_files({os.path.join(a.node_dir, "loadout.json"): b"{}"})
    yield a
    a.clean_up()


@pytest.fixture
def sibling() -> Iterator[Path]:
    other = ChildActor()
    other.make_node("t", "a2")
    yield Path(other.node_dir)
    other.clean_up()


def plan_in(node: str, **changes: Any) -> NodePlan:
    plan = NodePlan(
        owner="a1",
        policy="read_only",
        sandbox_off=False,
        allow_unsandboxed=False,
        argv_tail=("-I", "-m", "child", os.path.join(node, "loadout.json")),
        loadout_file=os.path.join(node, "loadout.json"),
        workspace=os.path.join(node, "checkout"),
        scratch=os.path.join(node, "scratch"),
        hidden=("/nonexistent-fleet-home",),
    )
    return attrs.evolve(plan, **changes)


def test_the_node_directory_is_fresh_private_and_in_the_nodes_root_of_them(actor):
    node = Path(actor.node_dir)
    assert str(node.parent) == node_root()
    assert node_root() in node_roots()
    assert node.name.startswith("fleet-node-t-a1-")
    assert (node.stat().st_mode & 0o777) == 0o700
    assert sorted(p.name for p in node.iterdir()) == ["checkout", "loadout.json", "scratch"]
    assert node_directory_of(str(node), "t", "a1") == node


@pytest.fixture
def memory(tmp_path, monkeypatch) -> Iterator[Path]:
    """A memory root of ours with room (this machine's own is not what these tests judge)."""
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    monkeypatch.setattr(_nodeplan, "MEMORY_ROOT", str(root))
    monkeypatch.setattr(_nodeplan, "MEMORY_FREE", 1)
    monkeypatch.delenv("TMPDIR", raising=False)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    yield root
    tempfile.tempdir = None


def test_node_directories_go_to_memory_when_it_has_room(memory):
    assert node_root() == str(memory)
    assert node_roots() == (str(memory), tempfile.gettempdir())
    actor = ChildActor()
    try:
        assert Path(actor.make_node("t", "a1")).parent == memory
    finally:
        actor.clean_up()


def test_a_memory_root_that_is_full_a_link_or_nobodys_is_passed_over(memory, monkeypatch, tmp_path):
    monkeypatch.setattr(_nodeplan, "MEMORY_FREE", 1 << 62)  # more than any machine has
    assert node_root() == tempfile.gettempdir()
    assert str(memory) in node_roots()  # full, its directories are still hidden and swept
    monkeypatch.setattr(_nodeplan, "MEMORY_FREE", 1)
    link = tmp_path / "link"
    link.symlink_to(memory)
    monkeypatch.setattr(_nodeplan, "MEMORY_ROOT", str(link))
    assert node_root() == tempfile.gettempdir()  # never through a link
    other = tmp_path / "other"
    other.mkdir()
    other.chmod(0o777)  # writable by all, but not sticky: another user could swap its entries
    if os.getuid() == 0:
        os.chown(other, 65534, 65534)
    else:
        other = Path("/")
    monkeypatch.setattr(_nodeplan, "MEMORY_ROOT", str(other))
    assert node_root() == tempfile.gettempdir()
    monkeypatch.setattr(_nodeplan, "MEMORY_ROOT", str(tmp_path / "gone"))
    assert node_root() == tempfile.gettempdir()
    assert node_roots() == (tempfile.gettempdir(),)


def test_a_tmpdir_given_to_the_node_wins_over_memory(memory, monkeypatch, tmp_path):
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    monkeypatch.setenv("TMPDIR", str(chosen))
    tempfile.tempdir = None
    assert node_root() == str(chosen)
    assert node_roots() == (str(memory), str(chosen))


@pytest.mark.parametrize("bad", ["t/../x", "../../etc", ""])
def test_a_node_directory_for_a_strange_id_is_refused(bad):
    with pytest.raises(RuntimeError, match="not a session or child id"):
        ChildActor().make_node("t", bad)


@pytest.mark.parametrize(
    "path",
    [
        "/etc",
        "relative/fleet-node-t-a1-" + "0" * 32,
        "/tmp/fleet-node-t-a2-" + "0" * 32,  # another child's
        "/tmp/x/../fleet-node-t-a1-" + "0" * 32,
        "/tmp/fleet-node-t-a1-" + "g" * 32,
        "/tmp/fleet-node-t-a1-" + "0" * 8,
    ],
)
def test_the_supervisor_takes_only_a_node_directory_it_recognises(path):
    with pytest.raises(OperationFailed, match="no valid node directory"):
        node_directory_of(path, "t", "a1")


@pytest.mark.skipif(not sandbox.probe().available, reason="needs a working sandbox")
def test_the_plan_is_wrapped_here_with_this_interpreter(actor):
    made = realise(plan_in(actor.node_dir), node_dir=actor.node_dir, egress="", env={"A": "1"})
    assert made.sandboxed
    assert made.reason == ""
    assert made.cwd == os.path.join(actor.node_dir, "checkout")
    assert os.path.abspath(sys.executable) in made.argv
    # The loadout is no argument and no path of the view: the child inherits it (--loadout-fd).
    loadout = os.path.join(actor.node_dir, "loadout.json")
    assert made.argv[-4:] == (os.path.abspath(sys.executable), "-I", "-m", "child")
    assert loadout not in made.argv
    assert made.env["A"] == "1"
    assert made.env["FLEET_SANDBOXED"] == "1"
    assert made.env["TMPDIR"] == os.path.join(actor.node_dir, "scratch")
    # This node's temp dir (every other child's node directory) is hidden in the view; its
    # memory root is under the view's own /dev (no mount of its own), but for the child's paths.
    pairs = list(zip(made.argv, made.argv[1:], strict=False))
    assert ("--tmpfs", tempfile.gettempdir()) in pairs
    assert ("--dev", "/dev") in pairs
    assert not [pair for pair in pairs if pair[0] == "--tmpfs" and pair[1].startswith("/dev")]


@pytest.mark.skipif(not sandbox.probe().available, reason="needs a working sandbox")
def test_the_node_hides_its_own_fence_whatever_the_plan_says(actor, another_fleet):
    """Another fleet of the user on the node (its home registered there) and the node's
    runtime root are hidden though the supervisor's plan does not name them."""
    xdg, other = another_fleet
    made = realise(plan_in(actor.node_dir), node_dir=actor.node_dir, egress="", env={})
    assert hidden_in(made.argv, other)
    assert hidden_in(made.argv, xdg)


def hidden_in(argv: Sequence[str], path: Path) -> bool:
    """Whether bwrap *argv* hides *path*: a tmpfs of its own, or (below ``/tmp``) the view's
    ``/tmp`` tmpfs with no bind bringing back a tree that holds it."""
    pairs = set(itertools.pairwise(argv))
    if ("--tmpfs", str(path)) in pairs:
        return True
    binds = [argv[i + 2] for i, arg in enumerate(argv) if arg in ("--bind", "--ro-bind")]
    return (
        ("--tmpfs", "/tmp") in pairs
        and path.is_relative_to("/tmp")
        and not any(path.is_relative_to(dest) for dest in binds if dest != "/")
    )


def test_unsandboxed_only_when_allowed_and_the_reason_says_so(actor):
    plan = plan_in(actor.node_dir, sandbox_off=True)
    with pytest.raises(PolicyError, match=r"^spawn a1: the sandbox is turned off"):
        realise(plan, node_dir=actor.node_dir, egress="", env={})
    made = realise(
        attrs.evolve(plan, allow_unsandboxed=True),
        node_dir=actor.node_dir,
        egress="",
        env={"TMPDIR": "/supervisors/own/tmp"},
    )
    assert not made.sandboxed
    assert made.reason == "sandbox turned off (--allow-unsandboxed)"
    assert made.env["FLEET_SANDBOXED"] == "0"
    assert made.env["TMPDIR"] == tempfile.gettempdir()  # the node's, not the supervisor's
    assert made.argv[0] == os.path.abspath(sys.executable)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"workspace": "/etc"}, "workspace '/etc' is not"),
        ({"scratch": "/"}, "scratch '/' is not"),
        ({"argv_tail": ("-c", "print(1)")}, "is not the child's"),
        ({"argv_tail": ("-I", "-m", "child", "/etc/passwd")}, "is not the child's"),
        ({"argv_tail": ("-I", "-m", "child", "--fd", "3", "--loadout-fd", "4")}, "not the child"),
        ({"egress": "/tmp/someone-elses.sock"}, "is not the one served here"),
    ],
)
def test_a_plan_naming_other_paths_is_refused_in_one_line(actor, change, says):
    with pytest.raises(PolicyError) as got:
        realise(plan_in(actor.node_dir, **change), node_dir=actor.node_dir, egress="", env={})
    assert says in str(got.value)
    assert "\n" not in str(got.value)
    assert str(got.value).startswith("spawn a1: its node refused the sandbox plan: ")


def test_a_plan_cannot_show_the_actors_git_dir_as_its_loadout(actor):
    git = os.path.join(actor.node_dir, "git")
    os.mkdir(git, 0o700)
    with pytest.raises(PolicyError, match="is not the file"):
        realise(
            plan_in(actor.node_dir, loadout_file=git), node_dir=actor.node_dir, egress="", env={}
        )


@pytest.mark.skipif(not sandbox.probe().available, reason="needs a working sandbox")
def test_no_visible_path_may_bring_back_what_is_hidden(actor, sibling, tmp_path):
    home = tmp_path / "home"
    (home / "sessions").mkdir(parents=True)
    node = actor.node_dir
    hostile = [
        "/",  # its bind would bring back the host's /tmp and /proc over the sandbox's
        "/tmp",
        tempfile.gettempdir(),
        str(sibling),  # another child's node directory
        str(sibling / "scratch"),
        os.path.join(node, "scratch"),  # a node directory even if its own
        str(home / "sessions"),  # inside the hidden state directory
    ]
    for path in hostile:
        plan = plan_in(node, visible=(path,), hidden=(str(home),))
        with pytest.raises(PolicyError, match="would show"):
            realise(plan, node_dir=node, egress="", env={})
    # A symlink to a sibling's directory is judged by where it leads.
    link = tmp_path / "innocent"
    link.symlink_to(sibling)
    with pytest.raises(PolicyError, match="would show hidden"):
        realise(plan_in(node, visible=(str(link),)), node_dir=node, egress="", env={})
    # A model's directory in the temp dir (not a node directory) is fine; one not on this
    # node is left out.
    models = tmp_path / "models"
    models.mkdir()
    plan = plan_in(node, visible=(str(models), "/not/on/this/node"), hidden=(str(home),))
    made = realise(plan, node_dir=node, egress="", env={})
    assert str(models) in made.argv
    assert "/not/on/this/node" not in made.argv
    shutil.rmtree(models)
