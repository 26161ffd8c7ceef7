"""Fixtures of the launcher tests."""

from pathlib import Path

import pytest

from orchestrator._runtime import register_home


@pytest.fixture
def another_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A runtime root of the test's own (``XDG_RUNTIME_DIR``) and another fleet's home
    registered there: what every sandbox of the user must hide."""
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    other = tmp_path / "other-fleet"
    other.mkdir()
    register_home(other)
    return xdg, other
