"""What a test needs from the machine, checked before it starts: ``@pytest.mark.needs(...)``.

A test that needs something absent fails at once, in its set-up, with one line naming what is
missing and how to get it: never a skip (a missing tool is a broken set-up, not a pass) and
never a timeout halfway through. ``make test`` installs everything named here.

Names:

- ``pi``, ``pi-next``, ``claude``, ``codex``, ``gemini``, ``opencode``: the pinned CLI in
  ``.npm-prefix/bin`` (``scripts/install-agent-clis``);
- ``sandbox``: a working bubblewrap sandbox (:func:`sandbox.probe`);
- ``netns``: ``unshare -n`` works (root, util-linux's ``unshare`` and iproute2's ``ip``);
- ``cgroup``: a cgroup can be made (root, a cgroup v2 or v1 ``cpuacct`` hierarchy);
- any other name: that command on ``PATH`` (``scripts/system-packages`` installs them).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import sandbox

REPO = Path(__file__).resolve().parents[1]
CLIS = frozenset({"pi", "pi-next", "claude", "codex", "gemini", "opencode"})
#: command → the Debian package that has it (the names scripts/system-packages installs).
PACKAGES = {
    "bwrap": "bubblewrap",
    "rg": "ripgrep",
    "fdfind": "fd-find",
    "node": "nodejs",
    "ip": "iproute2",
    "unshare": "util-linux",
}


def npm_bin() -> Path:
    """Where the pinned CLIs are (``FLEET_TEST_NPM_BIN`` overrides, for tests of this module)."""
    return Path(os.environ.get("FLEET_TEST_NPM_BIN") or REPO / ".npm-prefix" / "bin")


@functools.cache
def missing(name: str) -> str:
    """Why *name* is not usable here, in one line starting with ``needs NAME:``; "" when it is."""
    if name in CLIS:
        path = npm_bin() / name
        if os.access(path, os.X_OK):
            return ""
        how = "`make test` installs it (scripts/install-agent-clis)"
        return f"needs {name}: {path} is missing; {how}"
    if name == "sandbox":
        result = sandbox.probe()
        if result.available:
            return ""
        return (
            f"needs sandbox: {result.reason}; `make test` installs bubblewrap "
            "(scripts/system-packages)"
        )
    if name == "netns":
        return _netns()
    if name == "cgroup":
        return _cgroup()
    if shutil.which(name):
        return ""
    package = PACKAGES.get(name, name)
    return (
        f"needs {name}: not on PATH; `make test` installs it "
        f"(scripts/system-packages: apt-get install {package})"
    )


def _cgroup() -> str:
    """A cgroup of our own can be made (scripts/suite-cpu counts a run's CPU in one)."""
    if os.geteuid() != 0:
        return "needs cgroup: making a cgroup needs root; run the tests as root"
    for parent in (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup")):
        if os.access(parent, os.W_OK) and (
            parent.name == "cpuacct" or (parent / "cgroup.controllers").exists()
        ):
            return ""
    return "needs cgroup: no writable cgroup v2 or cpuacct hierarchy under /sys/fs/cgroup"


def _netns() -> str:
    for tool in ("unshare", "ip"):
        if line := missing(tool):
            return line.replace(f"needs {tool}:", f"needs netns: {tool}", 1)
    if os.geteuid() != 0:
        return "needs netns: `unshare -n` needs root; run the tests as root"
    probe = subprocess.run(
        ["unshare", "-n", "true"], capture_output=True, text=True, check=False, timeout=10
    )
    if probe.returncode == 0:
        return ""
    reason = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
    return f"needs netns: `unshare -n true` failed here: {reason}"
