"""PiInstaller on temp homes and projects: idempotent, and uninstall restores every byte."""

import hashlib
import os
from pathlib import Path

import pytest

from orchestrator._errors import UsageError
from orchestrator.parents._install_pi import MARKER, PiInstaller, extension_source


def snapshot(root: Path) -> dict[str, str]:
    """Every path under *root* with its content hash (directories as ``dir``)."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        found[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.delenv("PI_CODING_AGENT_DIR", raising=False)
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    (project / "README.md").write_text("# p\n")
    return home, project


@pytest.mark.parametrize("scope", ["project", "user"])
def test_install_twice_then_uninstall_is_a_byte_identical_round_trip(places, scope) -> None:
    home, project = places
    root = home.parent
    before = snapshot(root)
    installer = PiInstaller(["/opt/fleet/bin/fleet"])
    [line] = installer.install(scope, home=home, project=project)
    base = project / ".pi" if scope == "project" else home / ".pi" / "agent"
    target = base / "extensions" / "fleet" / "index.js"
    assert line == f"wrote {target}"
    text = target.read_text()
    assert text.startswith(MARKER)
    assert 'const BAKED_FLEET_BIN = ["/opt/fleet/bin/fleet"];' in text
    assert installer.install(scope, home=home, project=project) == [f"{target} already up to date"]
    lines = installer.uninstall(scope, home=home, project=project)
    assert lines[0] == f"removed {target}"
    assert snapshot(root) == before
    assert installer.uninstall(scope, home=home, project=project) == [f"{target} not installed"]


def test_uninstall_leaves_directories_that_existed_and_others_files(places) -> None:
    home, project = places
    extensions = project / ".pi" / "extensions"
    extensions.mkdir(parents=True)
    (extensions / "mine.ts").write_text("export default () => {};\n")
    (project / ".pi" / "settings.json").write_text('{"theme": "dark"}\n')
    before = snapshot(project)
    installer = PiInstaller(["/x/fleet"])
    installer.install("project", home=home, project=project)
    assert installer.uninstall("project", home=home, project=project) == [
        f"removed {extensions / 'fleet' / 'index.js'}",
        f"removed {extensions / 'fleet'}/",
    ]
    assert snapshot(project) == before


def test_a_new_fleet_path_updates_and_a_foreign_file_is_never_touched(places) -> None:
    home, project = places
    PiInstaller(["/old/fleet"]).install("project", home=home, project=project)
    target = project / ".pi" / "extensions" / "fleet" / "index.js"
    assert PiInstaller(["/new/fleet"]).install("project", home=home, project=project) == [
        f"updated {target}"
    ]
    assert '["/new/fleet"]' in target.read_text()
    PiInstaller(["/new/fleet"]).uninstall("project", home=home, project=project)
    assert not (project / ".pi").exists()
    target.parent.mkdir(parents=True)
    target.write_text("// somebody else's extension\n")
    with pytest.raises(UsageError, match="is not fleet's"):
        PiInstaller(["/x"]).install("project", home=home, project=project)
    with pytest.raises(UsageError, match="is not fleet's"):
        PiInstaller(["/x"]).uninstall("project", home=home, project=project)
    assert target.read_text() == "// somebody else's extension\n"


def test_user_scope_follows_pi_coding_agent_dir(places, monkeypatch) -> None:
    home, project = places
    agent_dir = home / "custom-agent"
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(agent_dir))
    [line] = PiInstaller(["/x"]).install("user", home=home, project=project)
    assert line == f"wrote {agent_dir / 'extensions' / 'fleet' / 'index.js'}"
    PiInstaller(["/x"]).uninstall("user", home=home, project=project)
    assert not agent_dir.exists()


def test_the_default_fleet_is_an_absolute_argv_and_the_source_ships() -> None:
    argv = PiInstaller().fleet_argv
    assert os.path.isabs(argv[0])
    assert "fleet tool --list" in extension_source(argv)
