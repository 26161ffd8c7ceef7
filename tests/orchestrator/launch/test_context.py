"""A remote child's resume context is hostile input: what its node reads, what the supervisor
keeps and what a revive writes on a new node follow no link, leave no place, stay capped.

Real files, links, FIFOs and hard links in a node directory made by the real ``ChildActor``
(called in process: its ``context`` and ``restore`` are what Ray runs on the node)."""

import os
import stat
import tempfile
from pathlib import Path

import pytest

from orchestrator.launch import _context
from orchestrator.launch._context import ContextRefused, gather, keep, restore, wants
from orchestrator.launch._ray_node import ChildActor

SECRET = b"the supervisor's session key\n"


@pytest.fixture
def actor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ChildActor:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    node = ChildActor()
    node.make_node("s1", "a1")
    return node


def _scratch(actor: ChildActor) -> Path:
    return Path(actor.node_dir) / "scratch"


def _modes(tree: Path) -> set[tuple[str, int]]:
    return {(str(p.relative_to(tree)), stat.S_IMODE(p.lstat().st_mode)) for p in tree.rglob("*")}


def test_each_backend_sends_only_what_it_resumes_from(actor: ChildActor) -> None:
    scratch = _scratch(actor)
    (scratch / "transcript.json").write_bytes(b'{"v": 1}')
    (scratch / "notes.txt").write_bytes(b"not context")
    projects = scratch / "claude/home/.claude/projects/-w"
    projects.mkdir(parents=True)
    (projects / "u-1.jsonl").write_bytes(b"claude")
    (projects / "u-2.jsonl").write_bytes(b"another session")
    (scratch / "claude/home/.claude/settings.json").write_bytes(b"{}")
    day = scratch / "codex/config/codex/sessions/2026/12/05"
    day.mkdir(parents=True)
    (day / "rollout-x-t-9.jsonl").write_bytes(b"codex")
    assert actor.context("builtin", "") == {"transcript.json": b'{"v": 1}'}
    assert actor.context("claude", "u-1") == {
        "claude/home/.claude/projects/-w/u-1.jsonl": b"claude"
    }
    assert actor.context("codex", "t-9") == {
        "codex/config/codex/sessions/2026/12/05/rollout-x-t-9.jsonl": b"codex"
    }
    assert actor.context("pi", "") == {}
    assert actor.context("command", "") == {}
    # An id the child reported is never a pattern or a path.
    for hostile in ("*", "../../etc", "u-1/../u-2", ""):
        assert actor.context("claude", hostile) == {}
        assert actor.context("codex", hostile) == {}


def test_a_hostile_child_cannot_make_its_node_read_links_fifos_or_hard_links(
    actor: ChildActor, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    scratch = _scratch(actor)
    (scratch / "transcript.json").symlink_to(secret)
    assert actor.context("builtin", "") == {}
    os.unlink(scratch / "transcript.json")
    os.mkfifo(scratch / "transcript.json")  # reading it would block the node for ever
    assert actor.context("builtin", "") == {}
    os.unlink(scratch / "transcript.json")
    os.link(secret, scratch / "transcript.json")  # the secret's own inode
    assert actor.context("builtin", "") == {}
    # A linked directory anywhere on the way is not entered.
    outside = tmp_path / "outside" / "-w"
    outside.mkdir(parents=True)
    (outside / "u-1.jsonl").write_bytes(SECRET)
    home = scratch / "claude/home/.claude"
    home.mkdir(parents=True)
    (home / "projects").symlink_to(outside.parent)
    assert actor.context("claude", "u-1") == {}
    (home / "projects").unlink()
    (home / "projects").mkdir()
    (home / "projects" / "-w").symlink_to(outside)
    assert actor.context("claude", "u-1") == {}
    (scratch / "claude").rename(scratch / "moved")
    (scratch / "claude").symlink_to(scratch / "moved")
    assert actor.context("claude", "u-1") == {}


def test_a_context_over_the_cap_or_too_wide_is_refused_in_one_line(
    actor: ChildActor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = _scratch(actor)
    (scratch / "transcript.json").write_bytes(b"x" * 4097)
    with pytest.raises(ContextRefused) as refused:
        gather(str(scratch), wants("builtin", ""), cap=4096)
    assert str(refused.value) == (
        "its context (transcript or session files) is over the 4096-byte cap"
    )
    # A sparse file of the whole cap and more is not read whole: at most cap + 1 bytes.
    with open(scratch / "transcript.json", "r+b") as handle:
        handle.truncate(_context.CAP * 4)
    with pytest.raises(ContextRefused):
        actor.context("builtin", "")
    # A tree of many entries is walked no further than the limit.
    monkeypatch.setattr(_context, "WALK_LIMIT", 50)
    sessions = scratch / "codex/config/codex/sessions"
    sessions.mkdir(parents=True)
    for n in range(60):
        (sessions / f"d{n}").mkdir()
    with pytest.raises(ContextRefused, match="over 50 entries"):
        actor.context("codex", "t-9")


@pytest.mark.parametrize(
    "name",
    [
        "../escaped.json",
        "/tmp/abs.json",
        "claude//x.jsonl",
        "./transcript.json",
        "context-refused",  # would forge the supervisor's own refusal line
        ".bashrc",
        "claude/home/.bashrc",
        "claude/home/.claude/settings.json",  # hooks Claude Code would run
        "claude/home/.claude/projects/u-1.jsonl",  # not in a project
        "transcript.json\n",
    ],
)
def test_the_supervisor_keeps_only_a_backends_resume_files(tmp_path: Path, name: str) -> None:
    place = tmp_path / "scratch" / "a1"
    place.parent.mkdir(mode=0o700)
    keep(str(place), {"transcript.json": b"before"}, wants("builtin", ""))
    needs = wants("builtin", "") + wants("claude", "u-1")
    with pytest.raises(ValueError, match="is not a"):
        keep(str(place), {"transcript.json": b"after", name: b"planted"}, needs)
    # Nothing changed, and nothing was left beside it.
    assert (place / "transcript.json").read_bytes() == b"before"
    assert sorted(p.name for p in place.parent.iterdir()) == ["a1"]
    assert not (tmp_path / "escaped.json").exists()


def test_what_the_supervisor_keeps_is_private_and_replaces_the_copy_before(
    tmp_path: Path,
) -> None:
    place = tmp_path / "a1"
    needs = wants("codex", "t-9")
    first = "codex/config/codex/sessions/2026/12/04/rollout-t-9.jsonl"
    second = "codex/config/codex/sessions/2026/12/05/rollout-t-9.jsonl"
    # What a supervisor that died mid-keep left: removed; another child's: untouched.
    (tmp_path / ".a1.4194305.0" / "x").mkdir(parents=True)
    (tmp_path / ".a10.4194305.0").mkdir()
    keep(str(place), {first: b"one"}, needs)
    assert sorted(os.listdir(tmp_path)) == [".a10.4194305.0", "a1"]
    (tmp_path / ".a10.4194305.0").rmdir()
    keep(str(place), {second: b"two"}, needs)
    assert _context.read_kept(str(place), needs) == {second: b"two"}
    modes = _modes(place)
    assert {m for p, m in modes if (place / p).is_dir()} == {0o700}
    assert {m for p, m in modes if (place / p).is_file()} == {0o600}
    assert stat.S_IMODE(place.stat().st_mode) == 0o700
    assert sorted(os.listdir(tmp_path)) == ["a1"]
    with pytest.raises(ContextRefused):
        keep(str(place), {second: b"x" * 11}, needs, cap=10)
    assert _context.read_kept(str(place), needs) == {second: b"two"}


@pytest.mark.parametrize("exchange", [True, False], ids=["exchanged", "moved-aside"])
def test_a_kept_context_is_never_missing_while_it_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    """A supervisor killed mid-keep must leave a copy at the place: the new one is exchanged
    with the one before in one step, nothing moves the kept copy away first. Where the file
    system cannot exchange, the copy is moved aside and the new one in, as before."""
    place = tmp_path / "a1"
    needs = wants("codex", "t-9")
    name = "codex/config/codex/sessions/2026/12/04/rollout-t-9.jsonl"
    keep(str(place), {name: b"one"}, needs)
    moved: list[tuple[str, str]] = []
    rename = os.rename

    def recorded(src: str, dst: str) -> None:
        moved.append((str(src), str(dst)))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", recorded)
    if not exchange:
        monkeypatch.setattr(_context, "_exchange", lambda *_: False)
    for data in (b"two", b"three"):
        keep(str(place), {name: data}, needs)
        assert _context.read_kept(str(place), needs) == {name: data}
    away = [dst for src, dst in moved if src == str(place)]  # the kept copy moved off
    assert len(away) == (0 if exchange else 2)
    assert sorted(os.listdir(tmp_path)) == ["a1"]
    assert {m for _, m in _modes(place)} == {0o700, 0o600}


def test_a_one_file_context_is_replaced_in_place_and_a_refusal_is_swapped_out(
    tmp_path: Path,
) -> None:
    """The builtin agent's transcript kept again: the file renamed over in the same place (no
    directory swapped), durable and private; a leftover of a keep that died there goes; a
    place that holds a refusal (or anything else) is replaced whole, as before."""
    place = tmp_path / "a1"
    needs = wants("builtin", "")
    keep(str(place), {"transcript.json": b"one"}, needs)
    inode = place.stat().st_ino
    (place / ".transcript.json.4194305.0a1b2c3d.tmp").write_bytes(b"half")  # a keep that died
    keep(str(place), {"transcript.json": b"two"}, needs)
    assert place.stat().st_ino == inode  # replaced in place
    assert sorted(os.listdir(place)) == ["transcript.json"]
    assert stat.S_IMODE((place / "transcript.json").stat().st_mode) == 0o600
    assert _context.read_kept(str(place), needs) == {"transcript.json": b"two"}
    _context.refuse(str(place), "its context is over the cap")
    keep(str(place), {"transcript.json": b"three"}, needs)
    assert sorted(os.listdir(place)) == ["transcript.json"]
    assert _context.refused(str(place)) == ""
    assert _context.read_kept(str(place), needs) == {"transcript.json": b"three"}
    # Nothing kept (no transcript yet): the place holds nothing, swapped whole.
    keep(str(place), {}, needs)
    assert os.listdir(place) == []
    assert sorted(os.listdir(tmp_path)) == ["a1"]


def test_a_restore_writes_only_beneath_the_new_scratch(actor: ChildActor, tmp_path: Path) -> None:
    scratch = _scratch(actor)
    outside = tmp_path / "outside"
    outside.mkdir()
    with pytest.raises(ValueError, match="not a context file"):
        actor.restore({"../../outside/planted": b"x"})
    # A link already there (a node directory is fresh, but still) is not followed.
    (scratch / "claude").symlink_to(outside)
    with pytest.raises(OSError, match=r"Too many levels of symbolic links|Not a directory"):
        actor.restore({"claude/home/.claude/projects/-w/u-1.jsonl": b"x"})
    assert list(outside.iterdir()) == []
    (scratch / "claude").unlink()
    actor.restore({"transcript.json": b"{}", "claude/home/.claude/projects/-w/u-1.jsonl": b"c"})
    assert (scratch / "transcript.json").read_bytes() == b"{}"
    assert stat.S_IMODE((scratch / "claude/home").stat().st_mode) == 0o700
    assert stat.S_IMODE((scratch / "transcript.json").stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):  # never over a file that is there
        restore(str(scratch), {"transcript.json": b"again"})
