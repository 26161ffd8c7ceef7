"""Git plumbing for snapshot and copy-back: one way to run Git, and a neutral view of files.

Every call runs with the user's configuration but no inherited repository overrides, and sets
``core.hooksPath=/dev/null`` and ``core.fsmonitor=false``, so no hook or monitor runs. Commands
that compare or check out work-tree files run against a *neutral* Git directory built in a
scratch directory, whose ``info/attributes`` (the highest-precedence attribute source) unsets
``text``, ``eol``, ``ident``, ``filter`` and ``working-tree-encoding`` for every path, and which
borrows the repository's object store through ``GIT_OBJECT_DIRECTORY``. So no clean or smudge
filter, ``ident`` expansion or line-ending conversion runs, whatever ``.gitattributes`` and the
user's config say.

All functions are synchronous and keep no shared state; call them from a worker thread.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from orchestrator._errors import OperationFailed

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# Inherited GIT_* variables are dropped (a supervisor started from a Git hook would otherwise
# operate on the hook's repository); these only say where the user's configuration lives.
_KEPT_GIT_ENV = frozenset(
    {"GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM", "GIT_EXEC_PATH"}
)
_SAFE_CONFIG = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
_NEUTRAL_ATTRIBUTES = b"* -text -eol -crlf -ident -filter -working-tree-encoding\n"
GITLINK = 0o160000
SYMLINK = 0o120000


class WorktreeError(OperationFailed):
    """A snapshot, worktree or copy-back operation failed; the one-line message says what to do.

    ``repo`` is the parent workspace and ``path`` the offending path (a destination, a submodule,
    a worktree) when known; ``detail`` is Git's own last error line when Git refused.
    """

    def __init__(
        self, message: str, *, repo: Path | None = None, path: Path | None = None, detail: str = ""
    ) -> None:
        super().__init__(message)
        self.repo = repo
        self.path = path
        self.detail = detail


@attrs.frozen(kw_only=True)
class GitLayout:
    """Where one work tree's Git data lives (all absolute)."""

    root: Path
    objects: Path
    index: Path
    object_format: str


@attrs.frozen(kw_only=True)
class RawChange:
    """One record of ``git diff-* --raw``: the path, its index/tree side and its new mode."""

    path: str
    old_mode: int
    old_sha: str
    new_mode: int


def git_env() -> dict[str, str]:
    """The environment for every Git call: the user's config, no repository overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in _KEPT_GIT_ENV}
    env.update(
        GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", GIT_NO_REPLACE_OBJECTS="1", LC_ALL="C"
    )
    return env


def run_git(
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    op: str,
    stdin: bytes | None = None,
    repo: Path | None = None,
) -> bytes:
    """Run ``git args`` and return its stdout; a failure raises :class:`WorktreeError`."""
    proc = subprocess.run(
        ["git", *_SAFE_CONFIG, *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        detail = lines[-1] if lines else f"exit status {proc.returncode}"
        raise WorktreeError(
            f"{op}: git {args[0]} failed ({detail}); fix the repository state Git names and retry",
            repo=repo,
            path=cwd,
            detail=detail,
        )
    return proc.stdout


def layout_of(path: Path, op: str) -> GitLayout:
    """The Git layout of the work tree containing ``path``; not a work tree raises."""
    out = run_git(
        [
            "rev-parse",
            "--path-format=absolute",
            "--show-toplevel",
            "--git-path",
            "objects",
            "--git-path",
            "index",
            "--show-object-format",
        ],
        cwd=path,
        env=git_env(),
        op=op,
    )
    root, objects, index, object_format = os.fsdecode(out).splitlines()
    return GitLayout(
        root=Path(os.path.realpath(root)),
        objects=Path(objects),
        index=Path(index),
        object_format=object_format,
    )


def neutral_env(
    scratch: Path, layout: GitLayout, *, work_tree: Path, index: Path
) -> dict[str, str]:
    """An environment whose Git commands see ``work_tree`` byte for byte (see the module doc)."""
    gitdir = scratch / "neutral.git"
    if not gitdir.exists():
        (gitdir / "refs").mkdir(parents=True)
        (gitdir / "info").mkdir()
        (gitdir / "HEAD").write_bytes(b"ref: refs/heads/fleet\n")
        extension = f"[extensions]\n\tobjectFormat = {layout.object_format}\n"
        version = 0 if layout.object_format == "sha1" else 1
        (gitdir / "config").write_text(
            f"[core]\n\trepositoryformatversion = {version}\n\tbare = false\n"
            + (extension if version else "")
        )
        (gitdir / "info" / "attributes").write_bytes(_NEUTRAL_ATTRIBUTES)
        # A split index keeps most entries in sharedindex.* files found beside the Git dir.
        for shared in layout.index.parent.glob("sharedindex.*"):
            os.link(shared, gitdir / shared.name)
    return git_env() | {
        "GIT_DIR": str(gitdir),
        "GIT_WORK_TREE": str(work_tree),
        "GIT_INDEX_FILE": str(index),
        "GIT_OBJECT_DIRECTORY": str(layout.objects),
    }


def parse_raw(out: bytes) -> list[RawChange]:
    """Records of ``git diff-files``/``diff-index`` ``-z --raw --no-renames`` output."""
    fields = out.split(b"\0")
    changes = []
    for meta, path in zip(fields[0:-1:2], fields[1::2], strict=True):
        old_mode, new_mode, old_sha, _, _ = meta[1:].decode().split(" ")
        changes.append(
            RawChange(
                path=os.fsdecode(path),
                old_mode=int(old_mode, 8),
                old_sha=old_sha,
                new_mode=int(new_mode, 8),
            )
        )
    return changes


def untracked(layout: GitLayout, index: Path, op: str) -> list[str]:
    """Untracked files that are not ignored, judged with ``index`` as the tracked set.

    Runs in the work tree's own repository so ``info/exclude`` and ``core.excludesFile`` apply.
    Nested repositories (listed with a trailing ``/``) are left out: they are not files.
    """
    out = run_git(
        ["ls-files", "-z", "--others", "--exclude-standard"],
        cwd=layout.root,
        env=git_env() | {"GIT_INDEX_FILE": str(index)},
        op=op,
    )
    return [os.fsdecode(p) for p in out.split(b"\0") if p and not p.endswith(b"/")]
