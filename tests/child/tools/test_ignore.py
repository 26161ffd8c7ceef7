"""find and grep skip what ripgrep skips, by rg and by the Python fallback, on a real git repo."""

import contextlib
import os
import random
import shutil
import subprocess

import pytest
import trio

from child.tools import ToolContext, _fs, build_tools
from child.tools._ignore import python_files, rg_files

RG = shutil.which("rg")


@pytest.fixture(params=["rg", "python"])
def lister(request, monkeypatch):
    if request.param == "rg":
        assert RG, "rg is not on PATH (make test installs ripgrep)"
    monkeypatch.setattr(_fs, "USE_RG", request.param == "rg")
    return request.param


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    files = {
        ".gitignore": ".venv/\nnode_modules\n*.log\n!keep.log\n/build\n",
        "app.py": "hello = 1\n",
        "keep.log": "hello log kept\n",
        "debug.log": "hello log ignored\n",
        ".venv/lib/python3/site-packages/pkg/mod.py": "hello = 'site-packages'\n",
        "node_modules/left-pad/index.js": "hello\n",
        "build/out.py": "hello = 'built'\n",
        "src/build/gen.py": "hello = 'not the top build'\n",
        "src/.gitignore": "secret.py\ncache/**\n!cache/readme.py\n",
        "src/secret.py": "hello\n",
        "src/cache/readme.py": "hello\n",
        "src/cache/blob.py": "hello\n",
        "src/sub/.ignore": "*.tmp.py\n",
        "src/sub/x.tmp.py": "hello\n",
        "src/sub/real.py": "hello\n",
        "local.py": "hello = 'excluded locally'\n",
        ".hidden/tool.py": "hello\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / ".git" / "info").mkdir(exist_ok=True)
    (root / ".git" / "info" / "exclude").write_text("local.py\n")
    return root


VISIBLE_PY = [
    ".hidden/tool.py",
    "app.py",
    "src/build/gen.py",
    "src/cache/readme.py",
    "src/sub/real.py",
]


def rg_sorted(root, keep):
    assert RG, "rg is not on PATH (make test installs ripgrep)"
    listed = rg_files(RG, root, keep)
    assert listed is not None, "rg failed"
    return sorted(listed)


async def call(root, name, **args):
    ctx = ToolContext(workspace=root)
    with trio.fail_after(10):
        return await build_tools([name], ctx)[name].run(ctx, args)


async def test_find_skips_git_ignored_trees_and_honours_nested_rules(repo, lister):
    result = await call(repo, "find", pattern="*.py")
    assert sorted(result.text.splitlines()) == VISIBLE_PY
    logs = await call(repo, "find", pattern="*.log")
    assert logs.text == "keep.log\n"
    assert "No files match" in (await call(repo, "find", pattern="site-packages")).text
    # Named explicitly, an ignored tree is searched (as rg searches a path it is given).
    inside = await call(repo, "find", pattern="*.py", path=".venv")
    assert inside.text == ".venv/lib/python3/site-packages/pkg/mod.py\n"
    assert (await call(repo, "find", pattern="src/*")).text.splitlines() == [
        "src/build/",
        "src/cache/",
        "src/sub/",
        "src/.gitignore",
    ]


async def test_grep_skips_git_ignored_trees(repo, lister):
    result = await call(repo, "grep", pattern="hello")
    files = sorted({line.split(":", 1)[0] for line in result.text.splitlines()})
    assert files == sorted([*VISIBLE_PY, "keep.log"])
    # A search rooted inside a subdirectory still obeys the repository's rules above it.
    inner = await call(repo, "grep", pattern="hello", path="src")
    assert "secret" not in inner.text
    assert "x.tmp" not in inner.text
    assert "src/sub/real.py:1:hello" in inner.text


async def test_gitignore_is_ignored_outside_a_repository_but_dot_ignore_is_not(tmp_path, lister):
    (tmp_path / ".gitignore").write_text("*.py\n")
    (tmp_path / ".ignore").write_text("*.txt\n")
    (tmp_path / "a.py").write_text("")
    (tmp_path / "a.txt").write_text("")
    assert (await call(tmp_path, "find", pattern="a.*")).text == "a.py\n"


@pytest.mark.parametrize(
    ("rules", "names"),
    [
        ("*.py\n!b.py\n", ["a.py", "b.py", "c/b.py", "c/d.py"]),
        ("c/\n", ["c/x", "cx", "d/c/y"]),
        ("/c\n", ["c/x", "d/c/y"]),
        ("**/foo\n", ["foo", "a/foo", "a/b/foo/x"]),
        ("a/**/z\n", ["a/z", "a/b/z", "a/b/c/z", "b/a/z"]),
        ("d/**\n!d/keep\n", ["d/keep", "d/drop", "d/e/f"]),
        ("[ab]?.txt\n\\#x\n", ["a1.txt", "c1.txt", "#x", "b22.txt"]),
        ("# comment\n\n*.o \n", ["x.o", "# comment", "y.c"]),
        ("*\n!*/\n!*.md\n", ["r.md", "a/b.md", "a/c.txt"]),
        ("[z-a]\n[unclosed\n*.o\n", ["x.o", "z", "[unclosed", "y.c"]),
        ("ab//\n", ["ab/c", "d"]),
        ("*\n!\n", ["a", "b/c"]),
        ("b/*\n!/\n", ["a", "b/c"]),
        ("**//\n", ["a", "b/c", "d/e/f"]),
        ("*/**//\n", ["a", "b/c", "d/e/f"]),
    ],
)
def test_the_python_fallback_lists_what_rg_lists(tmp_path, rules, names):
    assert RG, "rg is not on PATH (make test installs ripgrep)"
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text(rules)
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")

    def keep(_path):
        return True

    async def both():
        ours = await trio.to_thread.run_sync(lambda: sorted(python_files(tmp_path, keep)))
        theirs = await trio.to_thread.run_sync(lambda: rg_sorted(tmp_path, keep))
        return ours, theirs

    ours, theirs = trio.run(both)
    assert ours == theirs


def _lay_out(root, files):
    for name, text in files.items():
        if name.endswith("/.git"):
            subprocess.run(["git", "init", "-q", str(root / name[: -len("/.git")])], check=True)
            continue
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


async def test_an_rg_that_fails_leaves_the_listing_to_the_python_walk(repo, tmp_path, monkeypatch):
    broken = tmp_path / "bin"
    broken.mkdir()
    (broken / "rg").write_text("#!/bin/sh\nexit 2\n")
    (broken / "rg").chmod(0o755)
    monkeypatch.setenv("PATH", f"{broken}:{os.environ['PATH']}")
    assert shutil.which("rg") == str(broken / "rg")
    result = await call(repo, "find", pattern="*.py")
    assert sorted(result.text.splitlines()) == VISIBLE_PY


@pytest.fixture
def linked_worktree(tmp_path):
    """A linked worktree of a repository whose exclude file names local.txt (present)."""
    main, linked = tmp_path / "main", tmp_path / "linked"
    main.mkdir()
    git = ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t", "-C", str(main)]
    subprocess.run([*git, "init", "-q"], check=True)
    (main / ".git" / "info").mkdir(exist_ok=True)
    (main / ".git" / "info" / "exclude").write_text("local.txt\n")
    (main / "a.txt").write_text("")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    subprocess.run([*git, "worktree", "add", "-q", str(linked)], check=True)
    (linked / "local.txt").write_text("")
    return linked


async def test_a_linked_worktree_uses_its_main_repositorys_exclude_file(linked_worktree, lister):
    assert (await call(linked_worktree, "find", pattern="*.txt")).text == "a.txt\n"


LAYOUTS = {
    # A repository inside a plain directory whose .gitignore must not apply; a nested
    # repository, where the outer repository's rules stop.
    "nested-repos": {
        ".gitignore": "*.x\n",
        ".ignore": "*.y\n",
        "repo/.git": "",
        "repo/.gitignore": "*.z\n",
        "repo/a.x": "",
        "repo/a.y": "",
        "repo/a.z": "",
        "repo/a.w": "",
        "repo/inner/.git": "",
        "repo/inner/.gitignore": "*.w\n",
        "repo/inner/b.x": "",
        "repo/inner/b.z": "",
        "repo/inner/deep/c.w": "",
    },
    # .ignore beats a deeper .gitignore's re-include; a directory rule cannot be re-opened.
    "precedence": {
        "repo/.git": "",
        "repo/.gitignore": "build/\n!build/keep.txt\n*.tmp\n!important.tmp\na/**/c\n",
        "repo/a/.ignore": "*.md\n",
        "repo/a/b/.gitignore": "!s.md\n",
        "repo/a/b/s.md": "",
        "repo/a/r.md": "",
        "repo/a/b/c/f": "",
        "repo/a/b/g": "",
        "repo/build/keep.txt": "",
        "repo/x.tmp": "",
        "repo/important.tmp": "",
        "repo/deep/er/est/q": "",
        "repo/foo ": "",
        "repo/!bang": "",
    },
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_python_fallback_agrees_with_rg_from_every_directory(tmp_path, layout):
    assert RG, "rg is not on PATH (make test installs ripgrep)"
    _lay_out(tmp_path, LAYOUTS[layout])
    roots = [
        tmp_path,
        *(p for p in sorted(tmp_path.rglob("*")) if p.is_dir() and ".git" not in p.parts),
    ]

    def keep(_path):
        return True

    def both():
        return [
            (
                root,
                sorted(python_files(root, keep)),
                rg_sorted(root, keep),
            )
            for root in roots
        ]

    async def listed():
        return await trio.to_thread.run_sync(both)

    for root, ours, theirs in trio.run(listed):
        assert ours == theirs, root


def test_random_ignore_files_list_the_same_by_rg_and_by_the_python_walk(tmp_path):
    """A seeded fuzz: small trees, random gitignore lines from the syntax's pieces."""
    assert RG, "rg is not on PATH (make test installs ripgrep)"
    rng = random.Random(20261202)  # noqa: S311 - a reproducible fuzz, not a secret
    names = ["a", "b", "ab", "a.py", "b.md", ".h", "x y"]
    atoms = ["a", "b", "*", "?", "**", "/", "!", ".py", "\\", " ", "#", "/**/", "b/", "[ab]"]
    root = tmp_path / "fuzz"
    subprocess.run(["git", "init", "-q", str(root)], check=True)

    def keep(_path):
        return True

    def trial():
        for entry in root.iterdir():
            if entry.name != ".git":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        for _ in range(10):
            path = root.joinpath(*(rng.choice(names) for _ in range(rng.randint(1, 3))))
            with contextlib.suppress(OSError):  # a name already taken by a file or a directory
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
        lines = [
            "".join(rng.choice(atoms) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 4))
        ]
        (root / ".gitignore").write_text("\n".join(lines) + "\n")
        return lines, sorted(python_files(root, keep)), rg_sorted(root, keep)

    async def run():
        return [await trio.to_thread.run_sync(trial) for _ in range(40)]

    for lines, ours, theirs in trio.run(run):
        assert ours == theirs, lines
