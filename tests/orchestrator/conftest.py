"""Fixtures shared by the orchestrator tests."""

import pytest


@pytest.fixture
def git_home(tmp_path, monkeypatch):
    """An isolated Git configuration: no system config, a private global one, fixed identity."""
    home = tmp_path / "home"
    home.mkdir()
    config = home / ".gitconfig"
    config.write_text(
        '[init]\n\tdefaultBranch = main\n[protocol "file"]\n\tallow = always\n'
        "[advice]\n\tdetachedHead = false\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for role in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{role}_NAME", "Test")
        monkeypatch.setenv(f"GIT_{role}_EMAIL", "test@example.com")
    return home
