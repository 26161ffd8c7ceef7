"""``fleet doctor``: every check runs for real on this machine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from child.backends import _claude, _codex, _pi
from orchestrator._config import Config
from orchestrator.control._doctor import BACKEND_CLIS, run_checks

ROOT = Path(__file__).resolve().parents[3]


def _config(tmp_path: Path, **overrides: object) -> Config:
    return Config(home=tmp_path / "state", session="t", workspace=tmp_path, **overrides)  # type: ignore[arg-type]


@pytest.mark.slow
def test_every_check_runs_and_what_fleet_needs_is_here(tmp_path: Path) -> None:
    checks = {check["name"]: check for check in run_checks(_config(tmp_path))}
    assert list(checks) == [
        "python",
        "git",
        "tmux",
        "sandbox",
        "fork server",
        "state dir",
        "pi cli",
        "claude cli",
        "codex cli",
    ]
    assert checks["python"] == {
        "name": "python",
        "ok": True,
        "detail": sys.version.split()[0],
        "required": True,
    }
    assert checks["git"]["ok"]
    assert checks["git"]["detail"].startswith("git version ")
    assert checks["state dir"]["ok"]
    assert checks["state dir"]["detail"] == f"{tmp_path / 'state'} (writable)"
    assert checks["fork server"]["ok"], checks["fork server"]["detail"]
    assert checks["fork server"]["detail"].startswith("ready in ")
    assert {name for name, check in checks.items() if check["required"]} == {
        "python",
        "git",
        "state dir",
    }


@pytest.mark.slow
def test_a_fork_server_that_cannot_start_is_reported_but_not_required(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        'case "$*" in *child._forkserver*) echo "no fork server here" >&2; exit 9;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    checks = {c["name"]: c for c in run_checks(_config(tmp_path, python=str(python)))}
    assert checks["fork server"] == {
        "name": "fork server",
        "ok": False,
        "detail": "did not start (no fork server here): every child starts as a fresh interpreter",
        "required": False,
    }


def test_a_fork_server_turned_off_is_said_so(tmp_path: Path) -> None:
    checks = {c["name"]: c for c in run_checks(_config(tmp_path, fork_server=False))}
    assert checks["fork server"]["ok"]
    assert checks["fork server"]["detail"].startswith("off (FLEET_FORK_SERVER=0)")


@pytest.mark.slow
def test_the_doctor_verb_prints_every_check_and_exits_zero(tmp_path: Path) -> None:
    env = {**os.environ, "FLEET_HOME": str(tmp_path / "state"), "FLEET_SESSION": "t"}
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "doctor", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    names = [check["name"] for check in json.loads(result.stdout)["checks"]]
    assert names[:6] == ["python", "git", "tmux", "sandbox", "fork server", "state dir"]
    assert names[6:] == ["pi cli", "claude cli", "codex cli"]


def _fake_cli(tmp_path: Path, name: str, says: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho '{says}'\n")
    path.chmod(0o755)
    return path


def test_each_backend_cli_is_run_and_its_version_checked(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_PI_BIN", str(_fake_cli(tmp_path, "pi", "0.70.0")))
    monkeypatch.setenv("FLEET_CLAUDE_BIN", str(_fake_cli(tmp_path, "claude", "2.1.197 (Claude)")))
    monkeypatch.setenv("FLEET_CODEX_BIN", str(tmp_path / "missing-codex"))
    checks = {c["name"]: c for c in run_checks(_config(tmp_path, fork_server=False))}
    assert checks["pi cli"]["ok"] is False
    assert checks["pi cli"]["detail"] == (
        "0.70.0 is older than 0.73.1 (npm install -g @mariozechner/pi-coding-agent, "
        "or set FLEET_PI_BIN)"
    )
    assert checks["claude cli"] == {
        "name": "claude cli",
        "ok": True,
        "detail": f"2.1.197 ({tmp_path / 'claude'})",
        "required": False,
    }
    assert checks["codex cli"]["ok"] is False
    assert "not found" in checks["codex cli"]["detail"]
    assert "npm install -g @openai/codex" in checks["codex cli"]["detail"]


def test_the_minimums_are_the_backends_own() -> None:
    for backend, module in (("pi", _pi), ("claude", _claude), ("codex", _codex)):
        minimum = module.MINIMUM
        assert BACKEND_CLIS[backend][2] == (minimum.major, minimum.minor, minimum.patch)
