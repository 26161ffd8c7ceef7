"""A hostile child on a Ray node against the way its work comes back (no Ray needed: the node's
side is the actor's own code run in this process, the supervisor's side ``import_bundle`` and
the ordinary copy-back, as in ``tests/orchestrator/workspace/test_bundle.py``).

The child controls its work tree, so it controls what its node bundles: an oversize change is
refused *on the node* in one line before Git reads it or the bundle is read (a 300 MB return
killed the node before the supervisor's size check could refuse it); a bundle with two heads, a
``.git`` path or a symlink out of the tree imports nothing; a child printing gigabytes costs its
actor no memory.
"""

from __future__ import annotations

import os
import subprocess
import tracemalloc
from typing import TYPE_CHECKING, Any

import pytest
from ray.exceptions import RayTaskError

from orchestrator.launch import _ray_node
from orchestrator.launch._ray_launched import LaunchedRay
from orchestrator.launch._ray_node import MAX_RETURN, ChildActor, ReturnRefused
from orchestrator.workspace._bundle import MAX_BUNDLE, import_bundle, ship_snapshot
from orchestrator.workspace._copyback import finalize
from orchestrator.workspace._git import WorktreeError
from orchestrator.workspace._review import ReviewStore
from orchestrator.workspace._worktree import Snapshot, create_worktree
from tests.orchestrator.workspace._gitutil import git, write

if TYPE_CHECKING:
    from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}
APP = "def main():\n    return 42\n"


@pytest.fixture
def snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Snapshot:
    for name, value in GIT_ENV.items():
        monkeypatch.setenv(name, value)
    repo = tmp_path / "repo"
    write(repo / "src" / "app.py", APP)
    write(repo / "README.md", "# sample\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    return create_worktree(repo, tmp_path / "worktree")


def on_node(snapshot: Snapshot, tmp_path: Path) -> tuple[ChildActor, str, Path]:
    """The snapshot checked out on a 'node' (a directory here) by the child's actor."""
    actor = ChildActor()
    actor.node_dir = str(tmp_path / "node")
    os.mkdir(actor.node_dir, 0o700)
    shipped = ship_snapshot(snapshot)
    tree = tmp_path / "node" / "checkout"
    actor.receive(shipped.bundle, str(tree), read_only=False)
    return actor, shipped.commit, tree


def test_the_nodes_cap_is_the_supervisors() -> None:
    assert MAX_RETURN == MAX_BUNDLE


def test_an_oversize_change_is_refused_on_the_node_before_git_reads_it(
    snapshot: Snapshot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    actor, _base, tree = on_node(snapshot, tmp_path)
    # The hostile child leaves more than the cap in its work tree (a sparse file: no disk).
    with (tree / "huge.bin").open("wb") as handle:
        handle.truncate(3 * 1024 * 1024)
    write(tree / "src" / "app.py", "changed\n")
    ran: list[str] = []
    real = ChildActor._git

    def spy(self: ChildActor, *args: str) -> bytes:
        ran.append(args[0])
        return real(self, *args)

    monkeypatch.setattr(ChildActor, "_git", spy)
    with pytest.raises(ReturnRefused) as refused:
        actor.bring_back(cap=1024 * 1024)
    line = str(refused.value)
    assert "\n" not in line
    assert "over the 1048576-byte cap" in line, line
    assert "nothing was sent back" in line, line
    # Git only listed the changes: it never hashed, packed or bundled the oversize file.
    assert ran == ["status"], ran
    assert not (tmp_path / "node" / "git").exists()  # the node's private Git dir is gone
    assert actor.bring_back() == b""  # and nothing can be brought back afterwards


def test_a_bundle_over_the_cap_is_refused_before_it_is_read(
    snapshot: Snapshot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    actor, _base, tree = on_node(snapshot, tmp_path)
    write(tree / "src" / "app.py", "changed\n")  # a few bytes of change, a bundle of hundreds
    opened: list[str] = []
    real_open = open

    def spy_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(_ray_node, "open", spy_open, raising=False)
    with pytest.raises(ReturnRefused, match=r"-byte bundle, over the 64-byte cap"):
        actor.bring_back(cap=64)
    assert not any(p.endswith("back.bundle") for p in opened), opened
    assert not (tmp_path / "node" / "git").exists()


def test_an_honest_change_under_the_cap_still_comes_back(
    snapshot: Snapshot, tmp_path: Path
) -> None:
    actor, base, tree = on_node(snapshot, tmp_path)
    write(tree / "src" / "app.py", "def main():\n    return 43\n")
    import_bundle(snapshot, actor.bring_back(), base)
    result = finalize(snapshot, ReviewStore(tmp_path / "review"), "a1")
    assert result.applied == ("src/app.py",) or list(result.applied) == ["src/app.py"]


def test_a_nodes_refusal_reaches_the_handoff_as_its_one_line(tmp_path: Path) -> None:
    line = "the node's changes are over 300000000 bytes, over the 268435456-byte cap"

    class Ref:
        pass

    class Method:
        def remote(self) -> Ref:
            return Ref()

    class Actor:
        bring_back = Method()

    class Ray:
        @staticmethod
        def get(_ref: Ref, timeout: float) -> bytes:
            assert timeout > 0
            raise RayTaskError(
                "bring_back", "Traceback ...", ReturnRefused(line)
            ).as_instanceof_cause()

    launched = LaunchedRay(pid=1, node="n", actor=Actor(), ships_back=True)
    launched._bring_back(Ray())
    assert launched.returned is None
    assert launched.lost == line


def test_a_child_printing_gigabytes_costs_its_actor_no_memory(tmp_path: Path) -> None:
    actor = ChildActor()
    size = 64 * 1024 * 1024
    actor.proc = subprocess.Popen(
        ["sh", "-c", f"head -c {size} /dev/zero; printf 'the end'"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    tracemalloc.start()
    try:
        code, tail = actor.wait()
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == 0
    assert len(tail) == 8192
    assert tail.endswith(b"the end")
    assert peak < 4 * 1024 * 1024, f"the actor held {peak} bytes of the child's output"


# -- bundles the supervisor receives: each refused in one line, nothing imported -------------


def forge(snapshot: Snapshot, tmp_path: Path, entries: bytes, *, heads: int = 1) -> bytes:
    """A bundle on the snapshot whose head's tree is *entries* (``git mktree`` input), with
    *heads* heads."""
    repo = tmp_path / "forge"
    git(tmp_path, "clone", "-q", "--no-checkout", str(snapshot.repo), str(repo))
    git(repo, "fetch", "-q", str(snapshot.repo), snapshot.commit)
    made = subprocess.run(
        ["git", "mktree", "--missing"], cwd=repo, input=entries, capture_output=True, check=True
    )
    tree = made.stdout.decode().strip()
    refs = []
    for n in range(heads):
        commit = git(repo, "commit-tree", "-p", snapshot.commit, "-m", f"evil {n}", tree)
        git(repo, "update-ref", f"refs/heads/evil{n}", commit)
        refs.append(f"refs/heads/evil{n}")
    out = tmp_path / "evil.bundle"
    git(repo, "bundle", "create", "-q", str(out), *refs, f"^{snapshot.commit}")
    return out.read_bytes()


def blob(cwd: Path, data: bytes) -> str:
    done = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"],
        cwd=cwd,
        input=data,
        capture_output=True,
        check=True,
    )
    return done.stdout.decode().strip()


def assert_untouched(snapshot: Snapshot) -> None:
    assert (snapshot.worktree / "src" / "app.py").read_text() == APP
    assert git(snapshot.worktree, "status", "--porcelain") == ""
    assert (snapshot.repo / "src" / "app.py").read_text() == APP


def test_a_bundle_with_two_heads_is_refused(snapshot: Snapshot, tmp_path: Path) -> None:
    sha = blob(snapshot.repo, b"evil\n")
    data = forge(snapshot, tmp_path, f"100644 blob {sha}\tREADME.md\n".encode(), heads=2)
    with pytest.raises(WorktreeError, match="carry one head") as refused:
        import_bundle(snapshot, data, snapshot.commit)
    assert "\n" not in str(refused.value)
    assert_untouched(snapshot)


@pytest.mark.parametrize("name", [".git", ".Git", "src/.git"])
def test_a_bundle_naming_a_git_directory_is_refused(
    snapshot: Snapshot, tmp_path: Path, name: str
) -> None:
    hook = blob(snapshot.repo, b"#!/bin/sh\ntouch /tmp/pwned\n")
    inner = (
        subprocess.run(
            ["git", "mktree"],
            cwd=snapshot.repo,
            input=f"100755 blob {hook}\tpost-checkout\n".encode(),
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    parent, _, last = name.rpartition("/")
    entries = f"040000 tree {inner}\t{last}\n"
    if parent:
        entries = (
            "040000 tree "
            + subprocess.run(
                ["git", "mktree"],
                cwd=snapshot.repo,
                input=entries.encode(),
                capture_output=True,
                check=True,
            )
            .stdout.decode()
            .strip()
            + f"\t{parent}\n"
        )
    data = forge(snapshot, tmp_path, entries.encode())
    with pytest.raises(WorktreeError, match="forbidden path"):
        import_bundle(snapshot, data, snapshot.commit)
    assert_untouched(snapshot)


def test_a_bundled_symlink_out_of_the_tree_lands_nothing_outside(
    snapshot: Snapshot, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("the host's\n")
    link = blob(snapshot.repo, str(outside).encode())
    up = blob(snapshot.repo, b"../../../../../../../../etc")
    app = blob(snapshot.repo, b"changed\n")
    inner = (
        subprocess.run(
            ["git", "mktree"],
            cwd=snapshot.repo,
            input=f"100644 blob {app}\tapp.py\n120000 blob {up}\tetc\n".encode(),
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    entries = f"120000 blob {link}\tREADME.md\n040000 tree {inner}\tsrc\n"
    import_bundle(snapshot, forge(snapshot, tmp_path, entries.encode()), snapshot.commit)
    result = finalize(snapshot, ReviewStore(tmp_path / "review"), "a1")
    # Copy-back holds both links (every symlink waits for a person) and lands the ordinary file.
    assert result.applied == ("src/app.py",), result
    assert {h.path for h in result.held} == {"README.md", "src/etc"}, result
    assert outside.read_text() == "the host's\n"
    assert not (snapshot.repo / "README.md").is_symlink()
    assert (snapshot.repo / "README.md").read_text() == "# sample\n"
    assert not (snapshot.repo / "src" / "etc").exists()
    # Named, each link still meets the path guard: nothing outside the tree is reached.
    named = finalize(
        snapshot, ReviewStore(tmp_path / "review"), "a1", names=["README.md", "src/etc"]
    )
    assert not named.applied, named
    assert "\n" not in named.error
    assert outside.read_text() == "the host's\n"
    assert not (snapshot.repo / "README.md").is_symlink()
    assert not (snapshot.repo / "src" / "etc").exists()
