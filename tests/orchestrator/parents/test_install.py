"""``fleet install``/``uninstall`` round trips on temp homes: byte-identical files afterwards."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from orchestrator._errors import UsageError
from orchestrator.parents._install import CLAUDE_RULE, INSTALLERS, fleet_argv

PRE_EXISTING = {
    "proj/.mcp.json": (
        '{\n    "mcpServers": {\n        "other": {"command": "other-server"}\n    }\n}\n'
    ),
    "proj/.claude/settings.local.json": '{"permissions": {"allow": ["Bash(ls:*)"]}, "x": 1}',
    "proj/.codex/config.toml": (
        '# my codex settings\nmodel = "o4"  # the model I like\n\n'
        '[mcp_servers.other]\ncommand = "other-server"\n'
    ),
    "home/.claude.json": '{"oauthAccount": {"emailAddress": "me@example.com"}, "numStartups": 3}\n',
    "home/.codex/config.toml": "# only a comment\n[features]\nplugins = false\n",
    "home/.gemini/settings.json": '{\n  "theme": "dark"\n}\n',
    "proj/opencode.json": (
        '{\n  "$schema": "https://opencode.ai/config.json",\n'
        '  "mcp": {"o": {"type": "local", "command": ["o"]}}\n}\n'
    ),
}


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _dirs(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()}


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    monkeypatch.delenv("CODEX_HOME", raising=False)
    (tmp_path / "home").mkdir()
    (tmp_path / "proj").mkdir()
    return tmp_path, tmp_path / "home", tmp_path / "proj"


@pytest.mark.parametrize("parent", sorted(INSTALLERS))
@pytest.mark.parametrize("scope", ["project", "user"])
@pytest.mark.parametrize("existing", [False, True])
def test_install_is_idempotent_and_uninstall_restores_every_byte(
    places: tuple[Path, Path, Path], parent: str, scope: str, existing: bool
) -> None:
    root, home, project = places
    if existing:
        for rel, text in PRE_EXISTING.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    files, dirs = _tree(root), _dirs(root)
    installer = INSTALLERS[parent]
    first = installer.install(scope, home=home, project=project)  # type: ignore[arg-type]
    assert first
    assert all(line.startswith(("wrote ", "updated ")) for line in first), first
    installed = _tree(root)
    assert installed != files
    again = installer.install(scope, home=home, project=project)  # type: ignore[arg-type]
    assert all(line.endswith(" already up to date") for line in again), again
    assert _tree(root) == installed
    gone = installer.uninstall(scope, home=home, project=project)  # type: ignore[arg-type]
    assert all(line.startswith(("updated ", "removed ")) for line in gone), gone
    assert _tree(root) == files
    assert _dirs(root) == dirs
    twice = installer.uninstall(scope, home=home, project=project)  # type: ignore[arg-type]
    assert all(line.endswith(" not installed") for line in twice), twice


def test_the_entries_start_this_fleet_and_allow_only_its_tools(places) -> None:
    _root, home, project = places
    for parent in INSTALLERS:
        INSTALLERS[parent].install("project", home=home, project=project)
    command, *args = fleet_argv()
    assert Path(command).is_absolute()
    assert args == ["-P", "-m", "orchestrator", "mcp"]
    claude = json.loads((project / ".mcp.json").read_text())["mcpServers"]["fleet"]
    assert (claude["command"], claude["args"]) == (command, args)
    local = json.loads((project / ".claude" / "settings.local.json").read_text())
    assert local["permissions"]["allow"] == [CLAUDE_RULE] == ["mcp__fleet"]
    assert local["enabledMcpjsonServers"] == ["fleet"]
    codex = tomllib.loads((project / ".codex" / "config.toml").read_text())["mcp_servers"]
    assert codex["fleet"]["default_tools_approval_mode"] == "approve"
    assert codex["fleet"]["command"] == command
    gemini = json.loads((project / ".gemini" / "settings.json").read_text())["mcpServers"]
    assert gemini["fleet"]["trust"] is True
    opencode = json.loads((project / "opencode.json").read_text())["mcp"]["fleet"]
    assert opencode["command"] == [command, *args]
    result = subprocess.run(
        command_line := [command, *args[:3], "--help"], capture_output=True, check=False
    )
    assert result.returncode == 0, command_line


def test_a_broken_file_is_one_clear_line_and_stays_untouched(places) -> None:
    _root, home, project = places
    broken = project / ".mcp.json"
    broken.write_text("{not json")
    result = _fleet(project, home, "install", "claude")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "not valid JSON" in result.stderr
    assert broken.read_text() == "{not json"
    assert not (project / ".claude").exists()


def test_the_cli_prints_what_changed_for_every_parent_pi_too(places) -> None:
    _root, home, project = places
    result = _fleet(project, home, "install", "gemini", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    [note] = data.pop("notes")
    assert note.startswith("note: gemini reads ")
    assert "trusted folder" in note
    assert data == {
        "parent": "gemini",
        "changed": [{"path": str(project / ".gemini" / "settings.json"), "action": "wrote"}],
    }
    result = _fleet(project, home, "uninstall", "gemini", "--user")
    assert result.returncode == 0
    assert result.stdout.strip().endswith("not installed")
    result = _fleet(project, home, "install", "pi", "--json")
    assert result.returncode == 0, result.stderr
    target = project / ".pi" / "extensions" / "fleet" / "index.js"
    assert json.loads(result.stdout)["changed"] == [{"path": str(target), "action": "wrote"}]
    result = _fleet(project, home, "install", "pi", "--json")
    assert json.loads(result.stdout)["changed"] == [{"path": str(target), "action": "unchanged"}]
    result = _fleet(project, home, "uninstall", "pi")
    assert result.returncode == 0
    assert not (project / ".pi").exists()


def _fleet(cwd: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home)}
    env.pop("CODEX_HOME", None)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_linked_dotfile_stays_a_link_and_keeps_its_mode(places) -> None:
    root, home, project = places
    real = root / "dotfiles" / "claude.json"
    real.parent.mkdir()
    real.write_text('{"numStartups": 1}\n')
    real.chmod(0o600)
    (home / ".claude.json").symlink_to(real)
    before = real.read_bytes()
    INSTALLERS["claude"].install("user", home=home, project=project)
    assert (home / ".claude.json").is_symlink()
    assert "fleet" in json.loads(real.read_text())["mcpServers"]
    assert real.stat().st_mode & 0o777 == 0o600
    INSTALLERS["claude"].uninstall("user", home=home, project=project)
    assert (home / ".claude.json").is_symlink()
    assert real.read_bytes() == before
    assert not [p for p in real.parent.iterdir() if p.name != "claude.json"]  # no temp left


# A repository can commit any of these as a link: into the user's own settings, or anywhere.
PROJECT_FILES = {
    "claude": [".mcp.json", ".claude"],
    "codex": [".codex"],
    "gemini": [".gemini"],
    "opencode": ["opencode.json"],
    "pi": [".pi"],
}


@pytest.mark.parametrize(
    ("parent", "link"), [(p, link) for p, links in PROJECT_FILES.items() for link in links]
)
def test_project_install_never_writes_through_a_committed_link(places, parent, link) -> None:
    root, home, project = places
    outside = home / ".claude" if link.startswith(".") and "." not in link[1:] else home / "x.json"
    if outside.suffix:
        outside.write_text("{}\n")
    else:
        outside.mkdir()
        (outside / "settings.json").write_text('{"keep": 1}\n')
    (project / link).symlink_to(outside)
    before = _tree(root)
    result = _fleet(project, home, "install", parent)
    assert result.returncode == 2, result.stdout
    assert result.stderr.count("\n") == 1, result.stderr
    assert "symbolic link" in result.stderr
    assert str(project / link) in result.stderr
    assert _tree(root) == before
    result = _fleet(project, home, "uninstall", parent)
    assert _tree(root) == before


def test_a_link_deeper_in_the_project_is_refused_too(places) -> None:
    _root, home, project = places
    (project / ".claude").mkdir()
    target = home / "settings.local.json"
    target.write_text("{}\n")
    (project / ".claude" / "settings.local.json").symlink_to(target)
    with pytest.raises(UsageError, match="symbolic link"):
        INSTALLERS["claude"].install("project", home=home, project=project)
    assert target.read_text() == "{}\n"


@pytest.mark.parametrize("parent", sorted(INSTALLERS))
@pytest.mark.parametrize("scope", ["project", "user"])
def test_nothing_an_install_writes_is_group_or_other_writable_or_holds_a_secret(
    places, monkeypatch, parent, scope
) -> None:
    root, home, project = places
    secrets = {"ANTHROPIC_API_KEY": "sk-ant-SECRET1", "OPENAI_API_KEY": "sk-SECRET2"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FLEET_HOME", "/tmp/SECRET3-home")
    if parent == "codex":
        existing = (project if scope == "project" else home) / ".codex" / "config.toml"
        existing.parent.mkdir()
        existing.write_text("# mine\n")
        existing.chmod(0o666)
    old = os.umask(0)
    try:
        INSTALLERS[parent].install(scope, home=home, project=project)
    finally:
        os.umask(old)
    written = [p for p in root.rglob("*") if not p.is_symlink()]
    assert written
    for path in written:
        assert path.stat().st_mode & 0o022 == 0, (path, oct(path.stat().st_mode))
        if path.is_file():
            text = path.read_text()
            assert "SECRET" not in text, path


def test_opencode_files_carry_the_schema_opencode_would_insert(places) -> None:
    _root, home, project = places
    INSTALLERS["opencode"].install("project", home=home, project=project)
    path = project / "opencode.json"
    text = path.read_text()
    assert text.startswith('{\n  "$schema": "https://opencode.ai/config.json",\n')
    INSTALLERS["opencode"].uninstall("project", home=home, project=project)
    assert not path.exists()


@pytest.mark.parametrize(
    ("parent", "scope", "says"),
    [
        ("codex", "project", "trust_level"),
        ("gemini", "project", "trusted folder"),
        ("gemini", "user", "trusted folder"),
        ("pi", "project", "/trust"),
    ],
)
def test_install_says_in_one_line_how_to_trust_the_project(places, parent, scope, says) -> None:
    _root, home, project = places
    result = _fleet(project, home, "install", parent, f"--{scope}", "--json")
    assert result.returncode == 0, result.stderr
    [note] = json.loads(result.stdout)["notes"]
    assert says in note
    assert "\n" not in note
    human = _fleet(project, home, "install", parent, f"--{scope}")
    assert human.stdout.splitlines()[-1] == note
    for quiet in ("claude", "opencode"):
        result = _fleet(project, home, "install", quiet, f"--{scope}", "--json")
        assert json.loads(result.stdout)["notes"] == []
