"""Which paths of a worker's change may land without a person's say, and why.

A child's change is judged path by path before anything reaches the parent's tree. Most files
are *ordinary*: they do nothing until the user runs the project. Some *run later or instruct an
agent* on the host, outside every sandbox, the moment the parent's own tools touch them: agent
and MCP configuration, agent instruction files, Git attributes, modules and hook managers,
direnv and env files, editor folders, CI workflows, package manifests whose scripts or
dependencies change, build files and test bootstraps, any file that becomes executable, and
every symlink. Those are *held*: copy-back lands the ordinary files and keeps the held ones in
the worktree until a person names each of them (``fleet apply aN PATH``).

:func:`HoldRules.why` answers with a one-line reason, or ``None`` for an ordinary path. The
built-in rules cannot be switched off; ``copyback.hold`` in the user's ``config.yaml`` (never in
a child's reach) adds globs. Patterns are matched case-insensitively on ``/``-separated
components, as ``.gitignore`` lines are: a pattern without a ``/`` matches a component at any
depth (and so everything below a matching directory), one with a ``/`` inside matches a run of
components anywhere unless it starts with ``/`` (then from the root), a trailing ``/`` matches
only directories, ``**`` matches any number of components and ``*``/``?``/``[...]`` work within
one component. When a manifest cannot be parsed, it is held: when in doubt, hold.
"""

from __future__ import annotations

import fnmatch
import json
import tomllib
from typing import TYPE_CHECKING, Any, Final

import attrs

from orchestrator._config import hold_globs
from orchestrator.workspace._pathguard import fold_name

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = ["BUILTIN", "Held", "HoldRules", "matches"]

_SYMLINK: Final = 0o120000
_EXECUTABLE: Final = 0o100755


@attrs.frozen(kw_only=True)
class Held:
    """A changed path kept out of the parent's tree until a person names it, and why."""

    path: str
    why: str


_AGENT = "agent configuration: an agent CLI on the host reads it as settings, hooks or MCP servers"
_INSTRUCT = "agent instructions: an agent on the host reads it as its user's instructions"
_GIT = "Git configuration: attributes, submodules or hooks run commands on the host"
_ENV = "environment file: direnv or a tool loads it into the host's shell"
_EDITOR = "editor settings: an editor on the host runs its tasks or settings on open"
_CI = "CI configuration: runs with the repository's secrets when pushed"
_BUILD = "build file or test bootstrap: runs on the host when the project is built or tested"
_INSTALL = "package manager configuration: runs or fetches code on the host at install"

#: The built-in rules: (pattern, why). Extended by ``copyback.hold``, never shortened.
BUILTIN: Final[tuple[tuple[str, str], ...]] = (
    # Agent and MCP configuration of every parent fleet installs into, and of other agents.
    *(
        (pattern, _AGENT)
        for pattern in (
            ".claude/",
            ".mcp.json",
            ".codex/",
            ".gemini/",
            ".agents/",
            ".agent/",
            ".pi/",
            "opencode.json",
            "opencode.jsonc",
            ".opencode/",
            ".cursor/",
            ".cursorrules",
            ".windsurf/",
            ".windsurfrules",
            ".clinerules",
            ".roo/",
            ".continue/",
            ".aider.conf.yml",
            ".amazonq/",
            ".kiro/",
            ".junie/",
            ".goose/",
            ".github/copilot-instructions.md",
            ".github/instructions/",
            ".github/prompts/",
            ".github/chatmodes/",
            ".github/agents/",
            ".fleet/",
        )
    ),
    *(
        (pattern, _INSTRUCT)
        for pattern in (
            "AGENTS.md",
            "AGENTS.override.md",
            "AGENT.md",
            "CLAUDE.md",
            "CLAUDE.local.md",
            "GEMINI.md",
        )
    ),
    *(
        (pattern, _GIT)
        for pattern in (
            ".gitattributes",
            ".gitmodules",
            ".githooks/",
            ".husky/",
            ".pre-commit-config.yaml",
            ".pre-commit-hooks.yaml",
            "lefthook.yml",
            "lefthook.yaml",
            "lefthook.json",
            "lefthook-local.yml",
            ".lefthook.yml",
            ".lefthook.yaml",
            ".lefthook/",
            ".overcommit.yml",
            ".simple-git-hooks.*",
            "simple-git-hooks.*",
            ".lintstagedrc*",
            "lint-staged.config.*",
        )
    ),
    *((pattern, _ENV) for pattern in (".envrc", ".env", ".env.*", ".direnv/", ".flaskenv")),
    *(
        (pattern, "tool-version manager configuration: runs hooks and tasks in the host's shell")
        for pattern in (".mise.toml", "mise.toml", ".mise/", ".tool-versions", ".rtx.toml")
    ),
    *(
        (pattern, _EDITOR)
        for pattern in (
            ".vscode/",
            ".idea/",
            ".zed/",
            ".devcontainer/",
            ".devcontainer.json",
            "*.code-workspace",
            ".exrc",
            ".nvimrc",
            ".nvim.lua",
            # editor extensions load these JavaScript configs on open
            "eslint.config.*",
            ".eslintrc.js",
            ".eslintrc.cjs",
            "prettier.config.*",
            ".prettierrc.js",
            ".prettierrc.cjs",
            ".prettierrc.mjs",
        )
    ),
    *(
        (pattern, _CI)
        for pattern in (
            ".github/workflows/",
            ".github/actions/",
            ".gitlab-ci.yml",
            ".gitlab-ci.yaml",
            ".gitlab/",
            ".circleci/",
            ".travis.yml",
            ".buildkite/",
            ".drone.yml",
            ".woodpecker.yml",
            ".woodpecker/",
            "azure-pipelines.yml",
            "bitbucket-pipelines.yml",
            "appveyor.yml",
            "Jenkinsfile",
        )
    ),
    *(
        (pattern, _BUILD)
        for pattern in (
            "Makefile",
            "GNUmakefile",
            "*.mk",
            "justfile",
            ".justfile",
            "Taskfile.yml",
            "Taskfile.yaml",
            "CMakeLists.txt",
            "meson.build",
            "build.rs",
            "Rakefile",
            "setup.py",
            "setup.cfg",
            "conftest.py",
            "noxfile.py",
            "tox.ini",
            "pytest.ini",
            "sitecustomize.py",
            "usercustomize.py",
            "*.pth",
            "build.gradle",
            "build.gradle.kts",
            "settings.gradle",
            "settings.gradle.kts",
            "gradle-wrapper.properties",
            "pom.xml",
            ".mvn/",
            ".bazelrc",
            "WORKSPACE",
            "WORKSPACE.bazel",
            "MODULE.bazel",
            "docker-compose*.yml",
            "docker-compose*.yaml",
            "compose.yml",
            "compose.yaml",
        )
    ),
    *(
        (pattern, _INSTALL)
        for pattern in (
            ".npmrc",
            ".yarnrc",
            ".yarnrc.yml",
            ".yarn/",
            ".pnpmfile.cjs",
            "pnpm-workspace.yaml",
            "package-lock.json",
            "npm-shrinkwrap.json",
            "yarn.lock",
            "pnpm-lock.yaml",
            "bun.lockb",
            "bun.lock",
            "requirements*.txt",
            "Pipfile",
            "Pipfile.lock",
            "poetry.lock",
            "uv.lock",
            "pdm.lock",
            "Gemfile",
            "Gemfile.lock",
            "Cargo.toml",
            ".cargo/",
            "rust-toolchain",
            "rust-toolchain.toml",
            "go.mod",
            "go.work",
        )
    ),
)

# package.json keys that run or fetch nothing; a change to any other key is held.
_PACKAGE_INERT: Final = frozenset(
    {
        "name",
        "version",
        "description",
        "keywords",
        "homepage",
        "bugs",
        "license",
        "author",
        "contributors",
        "maintainers",
        "funding",
        "repository",
        "private",
        "files",
    }
)
# pyproject.toml: [project] keys that run nothing, and [tool.*] tables of tools that load no
# code from their configuration. Everything else (build-system, scripts, entry points,
# dependencies, dependency groups, any other tool) is held.
_PROJECT_INERT: Final = frozenset(
    {
        "name",
        "version",
        "description",
        "readme",
        "license",
        "license-files",
        "authors",
        "maintainers",
        "keywords",
        "classifiers",
        "urls",
        "requires-python",
    }
)
_TOOL_INERT: Final = frozenset({"ruff", "black", "isort", "codespell", "pyright", "typos"})


def _match_parts(pattern: list[str], parts: list[str]) -> bool:
    """Whether ``pattern`` matches exactly the components ``parts`` (``**``: any number)."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_parts(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and _match_parts(rest, parts[1:])


def matches(pattern: str, path: str) -> bool:
    """Whether the hold ``pattern`` covers ``path`` (the grammar is in the module doc).

    Each component of ``path`` is folded as the most forgiving file system would compare it
    (case, Unicode normalization, HFS+ ignorable code points, NTFS trailing dots and spaces),
    so ``.Claude\u200c/`` or ``.envrc.`` is held where a Mac or Windows reads it as the real one.
    """
    pattern = pattern.casefold()
    anchored = pattern.startswith("/")
    directory = pattern.endswith("/")
    wanted = [part for part in pattern.strip("/").split("/") if part]
    parts = [fold_name(part) for part in path.split("/")]
    starts = [0] if anchored else range(len(parts))
    # A directory pattern must leave the file itself below it; a file pattern may match the
    # path or one of its directories.
    last = len(parts) - 1 if directory else len(parts)
    return any(
        _match_parts(wanted, parts[start:end])
        for start in starts
        for end in range(start + 1, last + 1)
    )


def _changed_keys(old: dict[str, Any], new: dict[str, Any], inert: frozenset[str]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if k not in inert and old.get(k) != new.get(k))


def _parsed(data: bytes | None, parse: Callable[[bytes], object]) -> dict[str, Any] | None:
    """``data`` parsed as a mapping (``{}`` for an absent file); ``None`` when it is not one."""
    if data is None:
        return {}
    try:
        value = parse(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _package_json(old: bytes | None, new: bytes | None) -> str | None:
    before, after = _parsed(old, json.loads), _parsed(new, json.loads)
    if before is None or after is None:
        return "package manifest that does not parse: npm may run anything it names"
    keys = _changed_keys(before, after, _PACKAGE_INERT)
    if keys:
        return f"package manifest: {', '.join(keys)} changed (npm runs scripts and installs)"
    return None


def _toml(data: bytes) -> object:
    return tomllib.loads(data.decode())


def _pyproject(old: bytes | None, new: bytes | None) -> str | None:
    before, after = _parsed(old, _toml), _parsed(new, _toml)
    if before is None or after is None:
        return "pyproject.toml that does not parse: a build may run anything it names"
    tables = {"project": _PROJECT_INERT, "tool": _TOOL_INERT}
    keys = _changed_keys(before, after, frozenset(tables))
    for table, inert in tables.items():
        was, now = before.get(table, {}), after.get(table, {})
        if not isinstance(was, dict) or not isinstance(now, dict):
            keys.append(table)
            continue
        keys += [f"{table}.{key}" for key in _changed_keys(was, now, inert)]
    if keys:
        return f"pyproject.toml: {', '.join(sorted(keys))} changed (runs at build, install or test)"
    return None


_MANIFESTS: Final[dict[str, Callable[[bytes | None, bytes | None], str | None]]] = {
    "package.json": _package_json,
    "pyproject.toml": _pyproject,
}


@attrs.frozen(kw_only=True)
class HoldRules:
    """The built-in rules plus the user's ``copyback.hold`` globs (see the module doc)."""

    extra: tuple[str, ...] = attrs.field(default=(), converter=hold_globs)

    def patterns(self) -> Iterable[tuple[str, str]]:
        yield from BUILTIN
        for glob in self.extra:
            yield glob, f"listed in copyback.hold ({glob})"

    def why(
        self,
        path: str,
        old_mode: int | None,
        new_mode: int | None,
        old_bytes: Callable[[], bytes | None],
        new_bytes: Callable[[], bytes | None],
    ) -> str | None:
        """Why the change of ``path`` from ``old_mode`` to ``new_mode`` (Git modes, ``None`` for
        absent) is held, or ``None`` when it may land with the ordinary files. The loaders give
        a side's bytes; they are called only for a manifest whose content decides."""
        if new_mode == _SYMLINK:
            return "symlink: where it points is read only when something follows it"
        for pattern, why in self.patterns():
            if matches(pattern, path):
                return why
        manifest = _MANIFESTS.get(fold_name(path.rsplit("/", 1)[-1]))
        if manifest is not None:
            reason = manifest(
                old_bytes() if old_mode not in (None, _SYMLINK) else None,
                new_bytes() if new_mode is not None else None,
            )
            if reason is not None:
                return reason
        if new_mode == _EXECUTABLE and old_mode != _EXECUTABLE:
            return "becomes executable: it can be run by name, and tools run such files"
        return None
