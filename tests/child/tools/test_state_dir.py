"""Every builtin file tool refuses the fleet state directory, sandboxed or not.

The state directory holds every session's control token, sockets and loadouts; a child's own
workspace (a worker's worktree) and scratch inside it stay usable.
"""

import pytest
import trio

from child.tools import ToolContext, build_tools

TOKEN = "c0ffee-control-token"  # noqa: S105 - a decoy secret


@pytest.fixture
def world(tmp_path):
    state = tmp_path / "state"
    other = state / "sessions" / "other"
    other.mkdir(parents=True)
    (other / "control.token").write_text(TOKEN)
    worktree = state / "sessions" / "t" / "worktrees" / "a1"
    worktree.mkdir(parents=True)
    (worktree / "mine.txt").write_text("my own file\n")
    scratch = state / "sessions" / "t" / "scratch" / "a1"
    scratch.mkdir(parents=True)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.txt").write_text("hello\n")
    (repo / "innocent.txt").symlink_to(other / "control.token")
    (repo / "sessions").symlink_to(state / "sessions")
    return {"state": state, "other": other, "repo": repo, "worktree": worktree, "scratch": scratch}


async def call(world, workspace, name, **args):
    ctx = ToolContext(workspace=workspace, state_dir=world["state"], own=(world["scratch"],))
    with trio.fail_after(10):
        return await build_tools([name], ctx)[name].run(ctx, args)


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("read", {"path": "{other}/control.token"}),
        ("read", {"path": "innocent.txt"}),
        ("read", {"path": "{repo}/../state/sessions/other/control.token"}),
        ("ls", {"path": "{state}"}),
        ("ls", {"path": "sessions/other"}),
        ("find", {"pattern": "*.token", "path": "{state}"}),
        ("grep", {"pattern": "c0ffee", "path": "{other}"}),
        ("write", {"path": "{other}/planted", "content": "x"}),
        ("edit", {"path": "innocent.txt", "old_text": "c0ffee", "new_text": "x"}),
    ],
)
async def test_a_scouts_tools_refuse_the_state_directory(world, tool, args):
    filled = {k: v.format(**world) if isinstance(v, str) else v for k, v in args.items()}
    result = await call(world, world["repo"], tool, **filled)
    assert result.is_error, result.text
    assert TOKEN not in result.text
    assert "fleet state directory" in result.text or "outside the workspace" in result.text
    assert "\n" not in result.text.strip()
    assert not (world["other"] / "planted").exists()
    assert (world["other"] / "control.token").read_text() == TOKEN


async def test_a_walk_from_above_skips_the_state_directory(world):
    # find and grep from the common parent never descend into the state directory.
    parent = world["repo"].parent
    found = await call(world, world["repo"], "find", pattern="*.token", path=str(parent))
    assert "control.token" not in found.text
    grepped = await call(world, world["repo"], "grep", pattern="c0ffee", path=str(parent))
    assert TOKEN not in grepped.text


async def test_a_worker_uses_its_own_worktree_and_scratch_inside_the_state_directory(world):
    worktree = world["worktree"]
    read = await call(world, worktree, "read", path="mine.txt")
    assert not read.is_error, read.text
    written = await call(world, worktree, "write", path="new.txt", content="ok\n")
    assert not written.is_error, written.text
    listed = await call(world, worktree, "ls", path=str(world["scratch"]))
    assert not listed.is_error, listed.text
    refused = await call(world, worktree, "read", path=str(world["other"] / "control.token"))
    assert refused.is_error
    assert TOKEN not in refused.text


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("read", {"path": "{runtime}/control.token"}),
        ("ls", {"path": "{runtime}"}),
        ("grep", {"pattern": "c0ffee", "path": "{runtime}"}),
        ("read", {"path": "{elsewhere}/sessions/s/journal.jsonl"}),
    ],
)
async def test_every_fenced_directory_is_refused_like_the_state_directory(
    world, tmp_path, tool, args
):
    """The runtime root (every fleet's control token and sockets) and another fleet's home,
    named in the loadout's ``fenced``: refused as the state directory is."""
    runtime = tmp_path / "run" / "fleet" / "0123456789abcdef"
    runtime.mkdir(parents=True)
    (runtime / "control.token").write_text(TOKEN)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "sessions" / "s").mkdir(parents=True)
    (elsewhere / "sessions" / "s" / "journal.jsonl").write_text(TOKEN)
    ctx = ToolContext(
        workspace=world["repo"],
        state_dir=world["state"],
        fenced=(runtime.parent, elsewhere),
        own=(world["scratch"],),
    )
    filled = {k: v.format(runtime=runtime, elsewhere=elsewhere) for k, v in args.items()}
    with trio.fail_after(10):
        result = await build_tools([tool], ctx)[tool].run(ctx, filled)
    assert result.is_error, result.text
    assert TOKEN not in result.text
    assert "fleet state directory" in result.text
    with trio.fail_after(10):
        mine = await build_tools(["read"], ctx)["read"].run(ctx, {"path": "notes.txt"})
    assert not mine.is_error
