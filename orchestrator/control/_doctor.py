"""``fleet doctor``: what fleet needs on this machine, checked for real."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any, Final

import sandbox
from orchestrator._config import Config
from orchestrator.launch._launcher import child_argv

FORK_SERVER_TIMEOUT = 30.0
#: The agent CLIs the ``pi``, ``claude`` and ``codex`` backends run: the variable that names
#: another binary, the npm package and the oldest version the backend supports (the child's
#: backends check the same at launch; a test keeps the two in step).
BACKEND_CLIS: Final = {
    "pi": ("FLEET_PI_BIN", "@mariozechner/pi-coding-agent", (0, 73, 1)),
    "claude": ("FLEET_CLAUDE_BIN", "@anthropic-ai/claude-code", (2, 1, 0)),
    "codex": ("FLEET_CODEX_BIN", "@openai/codex", (0, 171, 0)),
}
_VERSION: Final = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def _version(argv: list[str]) -> tuple[bool, str]:
    if shutil.which(argv[0]) is None:
        return False, f"{argv[0]} not found on PATH"
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{argv[0]} did not run: {exc}"
    text = (out.stdout or out.stderr).strip().splitlines()
    return out.returncode == 0, text[0] if text else f"exit {out.returncode}"


def _backend_cli(backend: str, environ: Mapping[str, str]) -> tuple[bool, str]:
    """Whether *backend*'s agent CLI runs here and is new enough, with how to get it."""
    variable, package, minimum = BACKEND_CLIS[backend]
    binary = environ.get(variable) or backend
    how = f"npm install -g {package}, or set {variable}"
    ok, detail = _version([binary, "--version"])
    if not ok:
        return False, f"{detail} ({how}); the {backend} backend cannot start"
    found = _VERSION.search(detail)
    wanted = ".".join(map(str, minimum))
    if found is None:
        return False, f"{binary} --version said {detail!r}, no version ({how})"
    version = tuple(int(part) for part in found.groups())
    if version < minimum:
        return False, f"{found.group(0)} is older than {wanted} ({how})"
    return True, f"{found.group(0)} ({shutil.which(binary) or binary})"


def _state_dir(config: Config) -> tuple[bool, str]:
    home = config.home
    probe = home if home.exists() else home.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if os.access(probe, os.W_OK):
        return True, f"{home} (writable)"
    return False, f"{home}: {probe} is not writable (set FLEET_HOME)"


def _fork_server(config: Config) -> tuple[bool, str]:
    """Start a fork server for real and wait for its ready message."""
    if not config.fork_server:
        return True, "off (FLEET_FORK_SERVER=0): every child starts as a fresh interpreter"
    python = child_argv(config.python, "")[0]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            [python, "-I", "-m", "child._forkserver", str(theirs.fileno()), "doctor"],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        return False, f"{python} did not run: {exc}"
    finally:
        theirs.close()
    with ours, process:
        ours.settimeout(FORK_SERVER_TIMEOUT)
        try:
            ready = json.loads(ours.recv(4096) or b"{}").get("ready") == process.pid
        except (OSError, ValueError):
            ready = False
        elapsed = time.monotonic() - started
        ours.close()  # the server exits when our end closes
        try:
            _, stderr = process.communicate(timeout=FORK_SERVER_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
    if ready:
        return True, f"ready in {elapsed:.2f} s: unsandboxed children start as its forks"
    lines = stderr.decode(errors="replace").strip().splitlines()
    why = lines[-1] if lines else f"exit {process.returncode}"
    return False, f"did not start ({why}): every child starts as a fresh interpreter"


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
    ok, detail = _fork_server(config)
    checks.append({"name": "fork server", "ok": ok, "detail": detail, "required": False})
    ok, detail = _state_dir(config)
    checks.append({"name": "state dir", "ok": ok, "detail": detail, "required": True})
    for backend in BACKEND_CLIS:
        ok, detail = _backend_cli(backend, os.environ)
        checks.append({"name": f"{backend} cli", "ok": ok, "detail": detail, "required": False})
    return checks
