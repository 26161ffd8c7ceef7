"""edit and write: real files, the workspace path guard and the ownership hook."""

import os
import stat

import pytest
import trio

from child.tools import ToolContext, build_tools


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (root / "app.py").write_text("a = 1\nb = 2\n")
    return root


@pytest.fixture
def outside(tmp_path):
    target = tmp_path / "outside"
    target.mkdir()
    (target / "secret.txt").write_text("keep\n")
    return target


async def call(ctx, name, **args):
    with trio.fail_after(10):
        return await build_tools([name], ctx)[name].run(ctx, args)


def leftovers(root):
    return [p for p in root.rglob("*") if p.name.endswith(".fleet-tmp")]


async def test_write_creates_parents_and_exact_content(ws):
    ctx = ToolContext(workspace=ws)
    result = await call(ctx, "write", path="new/deep/file.txt", content="x\r\ny\n")
    assert result.text == "Created new/deep/file.txt (5 bytes)."
    assert (ws / "new" / "deep" / "file.txt").read_bytes() == b"x\r\ny\n"
    result = await call(ctx, "write", path="new/deep/file.txt", content="")
    assert result.text == "Overwrote new/deep/file.txt (0 bytes)."
    assert (ws / "new" / "deep" / "file.txt").read_bytes() == b""
    assert leftovers(ws) == []


async def test_write_keeps_an_existing_mode_and_new_files_follow_the_umask(ws):
    script = ws / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o750)
    await call(ToolContext(workspace=ws), "write", path="run.sh", content="#!/bin/sh\necho\n")
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    umask = os.umask(0o027)
    try:
        await call(ToolContext(workspace=ws), "write", path="fresh.txt", content="")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((ws / "fresh.txt").stat().st_mode) == 0o640


async def test_write_through_an_inside_symlink_writes_its_target(ws):
    (ws / "alias.py").symlink_to(ws / "app.py")
    await call(ToolContext(workspace=ws), "write", path="alias.py", content="c = 3\n")
    assert (ws / "alias.py").is_symlink()
    assert (ws / "app.py").read_text() == "c = 3\n"


async def test_write_breaks_a_hard_link_instead_of_writing_outside(ws, outside):
    os.link(outside / "secret.txt", ws / "hard.txt")
    await call(ToolContext(workspace=ws), "write", path="hard.txt", content="mine\n")
    assert (outside / "secret.txt").read_text() == "keep\n"
    assert (ws / "hard.txt").read_text() == "mine\n"


async def test_write_to_a_directory_is_refused(ws):
    (ws / "dir").mkdir()
    result = await call(ToolContext(workspace=ws), "write", path="dir", content="")
    assert result.is_error
    assert result.text == "write: dir is a directory; name a file"


async def test_edit_replaces_the_single_occurrence(ws):
    result = await call(
        ToolContext(workspace=ws), "edit", path="app.py", old_text="b = 2", new_text="b = 20\nc = 3"
    )
    assert result.text == "Edited app.py at line 2: replaced 1 line(s) with 2."
    assert (ws / "app.py").read_text() == "a = 1\nb = 20\nc = 3\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("x = 1\n", "edit: old_text was not found in app.py; read the file and copy the exact"),
        ("v\nv\nv\n", "edit: old_text occurs 3 times in app.py; include more surrounding lines"),
    ],
)
async def test_edit_refuses_zero_or_many_matches_and_leaves_the_file(ws, content, message):
    (ws / "app.py").write_text(content)
    old_text = "v" if "v" in content else "missing"
    result = await call(
        ToolContext(workspace=ws), "edit", path="app.py", old_text=old_text, new_text="w"
    )
    assert result.is_error
    assert result.text.startswith(message)
    assert (ws / "app.py").read_text() == content


async def test_edit_keeps_crlf_line_endings(ws):
    (ws / "win.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    result = await call(
        ToolContext(workspace=ws), "edit", path="win.txt", old_text="one\ntwo", new_text="1\n2"
    )
    assert not result.is_error
    assert (ws / "win.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (None, {"old_text": "a", "new_text": "a"}, "identical; nothing would change"),
        (b"\0\1binary", {"old_text": "a", "new_text": "b"}, "is a binary file"),
        (b"caf\xe9", {"old_text": "a", "new_text": "b"}, "is not UTF-8 text"),
    ],
)
async def test_edit_refuses_no_op_binary_and_non_utf8(ws, setup, args, message):
    if setup is not None:
        (ws / "app.py").write_bytes(setup)
    result = await call(ToolContext(workspace=ws), "edit", path="app.py", **args)
    assert result.is_error
    assert message in result.text


async def test_edit_of_a_missing_file_says_to_use_write(ws):
    result = await call(ToolContext(workspace=ws), "edit", path="no.py", old_text="a", new_text="")
    assert result.text == (
        "edit: no.py does not exist; create it with write, or check the path with ls"
    )


def _escape(ws, outside, kind):
    """Create the escape ``kind`` inside ``ws``; return the path a tool is asked to write."""
    if kind == "dotdot":
        return "sub/../../outside/secret.txt"
    if kind == "absolute":
        return str(outside / "secret.txt")
    if kind == "symlink-file":
        (ws / "link.txt").symlink_to(outside / "secret.txt")
        return "link.txt"
    if kind == "symlink-ancestor":
        (ws / "linkdir").symlink_to(outside)
        return "linkdir/secret.txt"
    if kind == "dangling":
        (ws / "dangling").symlink_to(outside / "created-by-tool.txt")
        return "dangling"
    if kind == "dangling-ancestor":
        (ws / "ghost").symlink_to(outside / "not-yet")
        return "ghost/created.txt"
    if kind == "symlink-dotdot":
        # Lexically ws/escaped.txt, but the kernel applies ".." after following the link.
        (ws / "linkdir").symlink_to(outside)
        return "linkdir/../escaped.txt"
    if kind == "git":
        return ".git/config"
    if kind == "git-nested":
        return "vendor/.git/HEAD"
    raise AssertionError(kind)


ESCAPES = [
    ("dotdot", "is outside the workspace"),
    ("absolute", "is outside the workspace"),
    ("symlink-file", "a symlink makes it resolve to"),
    ("symlink-ancestor", "a symlink makes it resolve to"),
    ("dangling", "a symlink makes it resolve to"),
    ("dangling-ancestor", "a symlink makes it resolve to"),
    ("symlink-dotdot", "a symlink makes it resolve to"),
    ("git", "is inside Git metadata (.git)"),
    ("git-nested", "is inside Git metadata (.git)"),
]


@pytest.mark.parametrize(("kind", "reason"), ESCAPES)
@pytest.mark.parametrize("tool", ["write", "edit"])
async def test_writes_outside_the_workspace_are_refused(ws, outside, tool, kind, reason):
    path = _escape(ws, outside, kind)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    git_before = (ws / ".git" / "config").read_bytes()
    args = {"content": "pwned\n"} if tool == "write" else {"old_text": "keep", "new_text": "pwn"}
    result = await call(ToolContext(workspace=ws), tool, path=path, **args)
    assert result.is_error
    assert result.text.startswith(f"{tool}: refused {path}: ")
    assert reason in result.text
    assert "\n" not in result.text
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before
    assert not (outside / "not-yet").exists()
    assert not (outside.parent / "escaped.txt").exists()
    assert (ws / ".git" / "config").read_bytes() == git_before
    assert not (ws / "vendor").exists()


async def test_may_write_is_asked_once_per_path_with_the_real_path(ws):
    asked = []

    async def may_write(path):
        asked.append(path)
        await trio.lowlevel.checkpoint()

    ctx = ToolContext(workspace=ws, may_write=may_write)
    tools = build_tools(["write", "edit"], ctx)
    with trio.fail_after(10):
        await tools["write"].run(ctx, {"path": "./x.txt", "content": "1"})
        await tools["edit"].run(ctx, {"path": "x.txt", "old_text": "1", "new_text": "2"})
        await tools["write"].run(ctx, {"path": "y.txt", "content": "1"})
    assert asked == [ws / "x.txt", ws / "y.txt"]
    assert (ws / "x.txt").read_text() == "2"


@pytest.mark.parametrize("tool", ["write", "edit"])
async def test_a_may_write_refusal_blocks_the_write_and_is_asked_again_later(ws, tool):
    answers = ["ownership: app.py is owned by a2; ask the parent", None]

    async def may_write(path):
        await trio.lowlevel.checkpoint()
        return answers.pop(0)

    ctx = ToolContext(workspace=ws, may_write=may_write)
    args = {"content": "z\n"} if tool == "write" else {"old_text": "a = 1", "new_text": "z"}
    refused = await call(ctx, tool, path="app.py", **args)
    assert refused.is_error
    assert refused.text == "ownership: app.py is owned by a2; ask the parent"
    assert (ws / "app.py").read_text() == "a = 1\nb = 2\n"
    allowed = await call(ctx, tool, path="app.py", **args)
    assert not allowed.is_error
    assert (ws / "app.py").read_text() != "a = 1\nb = 2\n"


async def test_a_failing_edit_does_not_ask_for_ownership(ws):
    asked = []

    async def may_write(path):
        asked.append(path)
        await trio.lowlevel.checkpoint()

    ctx = ToolContext(workspace=ws, may_write=may_write)
    result = await call(ctx, "edit", path="app.py", old_text="zzz", new_text="y")
    assert result.is_error
    assert asked == []
