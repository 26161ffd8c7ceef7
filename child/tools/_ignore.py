"""Which files ``find`` and ``grep`` see: everything but what ripgrep would skip.

A walk lists every file under a root except ``.git`` and what the ignore files exclude, the way
``rg --files --hidden`` does: ``.gitignore`` (nested ones too, and the parents' up to the
repository's top, inside a git repository only; a nested repository starts afresh),
``.git/info/exclude``, and ``.ignore`` and ``.rgignore`` (anywhere). Hidden files are kept;
symlinks are not followed. When ``rg`` is on ``PATH`` it does the listing; otherwise
:func:`python_files` applies the same rules itself (the gitignore syntax: ``#`` comments, ``!``
re-includes, a trailing ``/`` for directories only, a ``/`` at the start or in the middle
anchors to the ignore file's directory, ``*``, ``?``, ``[...]`` and ``**``; the last matching
line wins and a deeper file beats a shallower one of its kind, ``.rgignore`` beats ``.ignore``
beats ``.gitignore`` beats the exclude file; a file under an ignored directory stays ignored;
unlike rg's, a ``[...]`` class never matches ``/``).
Directories are reported as the parents of the listed files, so both listings agree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

_GIT_FILES = (".gitignore",)
_ANY_FILES = (".ignore", ".rgignore")
#: rg's precedence between kinds, whatever their depth: a match in an earlier kind decides;
#: within one kind the deepest file's last matching line does.
_KINDS = (".rgignore", ".ignore", ".gitignore", "exclude")
_GIT_KINDS = frozenset({".gitignore", "exclude"})
_RG_POLL_SECONDS = 0.1


@attrs.frozen
class _Rule:
    regex: re.Pattern[str]
    negated: bool
    dir_only: bool
    anchored: bool


@attrs.frozen
class _RuleFile:
    base: Path  # the directory the patterns are relative to
    kind: str  # one of _KINDS
    rules: tuple[_Rule, ...]

    def verdict(self, path: Path, is_dir: bool) -> bool | None:
        """True (ignored), False (re-included) or None (no line matches)."""
        try:
            relative = path.relative_to(self.base).as_posix()
        except ValueError:
            return None
        name = relative.rsplit("/", 1)[-1]
        for rule in reversed(self.rules):
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.fullmatch(relative if rule.anchored else name):
                return not rule.negated
        return None


def parse_ignore(text: str, base: Path, kind: str = ".gitignore") -> _RuleFile:
    """The rules of one ignore file of ``kind`` whose patterns are relative to ``base``."""
    rules = []
    for raw in text.splitlines():
        line = _strip_trailing_spaces(raw)
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        if negated or line.startswith(("\\!", "\\#")):
            line = line[1:]
        if not line and negated:
            line = "**"  # a lone "!" re-includes everything, as in rg
        dir_only = line.endswith("/")
        line = line.removesuffix("/")  # one only: "a//" keeps a slash, so it names nothing
        if not line:
            continue
        anchored = "/" in line
        try:
            regex = re.compile(_translate(line.removeprefix("/")), re.DOTALL)
        except re.error:
            continue  # a malformed line (an unclosed [, a reversed range) is skipped, as in rg
        rules.append(_Rule(regex, negated, dir_only, anchored))
    return _RuleFile(base, kind, tuple(rules))


def _strip_trailing_spaces(line: str) -> str:
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        return stripped[:-1] + " "  # "\ " keeps one escaped trailing space
    return stripped


def _translate(pattern: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            # "**/" alone (from "**//") matches anything, as in rg.
            out.append(".*" if pattern == "**/" else "(?:.*/)?")
            i += 3
        elif (
            pattern.startswith("**", i)
            and (i == 0 or pattern[i - 1] == "/")
            and i + 2 == len(pattern)
        ):
            out.append(".*")
            i += 2
        elif char == "*":
            out.append("[^/]*")
            i += 1
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        elif char == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                raise re.error(f"unclosed [ in {pattern!r}")
            body = pattern[i + 1 : end]
            negate = body[:1] in ("!", "^")
            body = re.sub(r"([\\\[&~|^])", r"\\\1", body[1:] if negate else body)
            body = re.sub(r"(?<=-)-", r"\\-", body)  # "--" would read as a set difference
            out.append(f"[{'^/' if negate else ''}{body}]")
            i = end + 1
        else:
            out.append(re.escape(char))
            i += 1
    return "".join(out)


def _git_top(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        if (directory / ".git").exists():
            return directory
    return None


def _git_dir(top: Path) -> Path:
    """The directory holding ``info/exclude`` for the repository at ``top``: ``.git``, or for a
    linked worktree (``.git`` is a ``gitdir:`` file) the main repository's common directory."""
    dot_git = top / ".git"
    if not dot_git.is_file():
        return dot_git
    try:
        line = dot_git.read_text(errors="replace").strip()
    except OSError:
        return dot_git
    if not line.startswith("gitdir:"):
        return dot_git
    git_dir = top / line.removeprefix("gitdir:").strip()  # an absolute path stays absolute
    try:
        common = (git_dir / "commondir").read_text(errors="replace").strip()
    except OSError:
        return git_dir
    return git_dir / common


def _load(directory: Path, names: tuple[str, ...]) -> list[_RuleFile]:
    files = []
    for name in names:
        try:
            text = (directory / name).read_text(errors="replace")
        except OSError:
            continue
        files.append(parse_ignore(text, directory, name))
    return files


def _enter(stack: list[_RuleFile], directory: Path, in_repo: bool) -> list[_RuleFile]:
    """The rules in force below ``directory``: a repository's top (it holds ``.git``) drops the
    git rules from above it and brings its own exclude file; then its own ignore files."""
    if (directory / ".git").exists():
        stack = [rule_file for rule_file in stack if rule_file.kind not in _GIT_KINDS]
        exclude = _load(_git_dir(directory) / "info", ("exclude",))
        stack += [attrs.evolve(rule_file, base=directory) for rule_file in exclude]
    return stack + _load(directory, (_GIT_FILES if in_repo else ()) + _ANY_FILES)


def _ignored(stack: list[_RuleFile], path: Path, is_dir: bool) -> bool:
    for kind in _KINDS:
        for rule_file in reversed(stack):  # deepest first
            if rule_file.kind == kind:
                verdict = rule_file.verdict(path, is_dir)
                if verdict is not None:
                    return verdict
    return False


def python_files(root: Path, keep: Callable[[Path], bool]) -> Iterator[str]:
    """The relative posix paths of the files under ``root`` that ripgrep would list."""
    top = _git_top(root)
    stack: list[_RuleFile] = []
    for parent in reversed(root.parents):
        stack = _enter(stack, parent, top is not None and parent.is_relative_to(top))
    yield from _walk(root, root, stack, top is not None, keep)


def _walk(
    root: Path,
    directory: Path,
    stack: list[_RuleFile],
    in_repo: bool,
    keep: Callable[[Path], bool],
) -> Iterator[str]:
    trio.from_thread.check_cancelled()
    in_repo = in_repo or (directory / ".git").exists()
    stack = _enter(stack, directory, in_repo)
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError:
        return
    subdirs = []
    for entry in entries:
        path = Path(entry.path)
        is_dir = entry.is_dir(follow_symlinks=False)
        if entry.is_symlink() or entry.name == ".git" or not keep(path):
            continue
        if _ignored(stack, path, is_dir):
            continue
        if is_dir:
            subdirs.append(path)
        elif entry.is_file(follow_symlinks=False):
            yield path.relative_to(root).as_posix()
    for sub in subdirs:
        yield from _walk(root, sub, stack, in_repo, keep)


def rg_files(rg: str, root: Path, keep: Callable[[Path], bool]) -> list[str] | None:
    """The same listing from ``rg --files`` (polled, so a cancelled search ends rg promptly);
    ``None`` when rg cannot list (it does not start, or fails with nothing listed)."""
    argv = [rg, "--files", "--hidden", "--null", "--no-config", "--no-ignore-global"]
    argv += ["--no-messages", "--glob", "!.git"]
    try:
        process = subprocess.Popen(
            argv,
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
    except OSError:
        return None
    try:
        while True:
            try:
                out, _ = process.communicate(timeout=_RG_POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                trio.from_thread.check_cancelled()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # 0: files listed; 1: none; 2: an error, with whatever it could list (an unreadable
    # directory is skipped, as the Python walk skips it). A crash or nothing at all: not rg's.
    if process.returncode not in (0, 1) and not out:
        return None
    listed = (os.fsdecode(raw).removeprefix("./") for raw in out.split(b"\0") if raw)
    return [relative for relative in listed if keep(root / relative)]


def list_files(root: Path, keep: Callable[[Path], bool], *, use_rg: bool = True) -> list[str]:
    """Every listed file under ``root``: by ``rg`` when it is on PATH and works, else by the
    Python walk."""
    rg = shutil.which("rg") if use_rg else None
    files = rg_files(rg, root, keep) if rg else None
    return list(python_files(root, keep)) if files is None else files


def tree_order(files: list[str]) -> Iterator[tuple[str, bool]]:
    """``(relative, is_dir)`` for the files and their parent directories, in a top-down walk's
    order: a directory's subdirectories, then its files, then each subdirectory's contents."""
    tree = _Dir()
    for relative in files:
        node = tree
        *parents, name = relative.split("/")
        for part in parents:
            node = node.dirs.setdefault(part, _Dir())
        node.files.append(name)
    yield from _emit(tree, "")


@attrs.define
class _Dir:
    dirs: dict[str, _Dir] = attrs.field(factory=dict)
    files: list[str] = attrs.field(factory=list)


def _emit(node: _Dir, prefix: str) -> Iterator[tuple[str, bool]]:
    names = sorted(node.dirs)
    for name in names:
        yield prefix + name, True
    for name in sorted(node.files):
        yield prefix + name, False
    for name in names:
        yield from _emit(node.dirs[name], prefix + name + "/")
