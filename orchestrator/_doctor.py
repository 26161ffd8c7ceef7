"""``fleet doctor``: what fleet needs on this machine, checked for real."""

import os
import shutil
import subprocess
import sys
from typing import Any

import sandbox
from orchestrator._config import Config


def _version(argv: list[str]) -> tuple[bool, str]:
    if shutil.which(argv[0]) is None:
        return False, f"{argv[0]} not found on PATH"
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{argv[0]} did not run: {exc}"
    text = (out.stdout or out.stderr).strip().splitlines()
    return out.returncode == 0, text[0] if text else f"exit {out.returncode}"


def _state_dir(config: Config) -> tuple[bool, str]:
    home = config.home
    probe = home if home.exists() else home.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if os.access(probe, os.W_OK):
        return True, f"{home} (writable)"
    return False, f"{home}: {probe} is not writable (set FLEET_HOME)"


def run_checks(config: Config) -> list[dict[str, Any]]:
    """Each check: name, ok, detail, and whether fleet cannot work without it."""
    checks: list[dict[str, Any]] = []
    ok = sys.version_info >= (3, 11)
    checks.append({"name": "python", "ok": ok, "detail": sys.version.split()[0], "required": True})
    for name, argv, required in (
        ("git", ["git", "--version"], True),
        ("tmux", ["tmux", "-V"], False),
    ):
        ok, detail = _version(argv)
        checks.append({"name": name, "ok": ok, "detail": detail, "required": required})
    result = sandbox.probe()
    detail = (
        f"{result.launcher} {result.version}".strip()
        if result.available
        else f"unavailable: {result.reason} (install bubblewrap, or pass --allow-unsandboxed)"
    )
    checks.append({"name": "sandbox", "ok": result.available, "detail": detail, "required": False})
    ok, detail = _state_dir(config)
    checks.append({"name": "state dir", "ok": ok, "detail": detail, "required": True})
    return checks
