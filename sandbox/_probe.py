"""Does the platform's launcher actually work here? Ask it once, with our exact flags.

A launcher that exists can still be useless: user namespaces disabled by the kernel, bwrap
without its setuid bit, a profile sandbox-exec will not parse. So the probe runs the real
launcher on a throwaway scratch dir and checks the results from outside: the child must be
unable to create a directory in ``/``, able to write its scratch dir, and its write to a file
next to scratch (writable for us, outside the sandbox) must not reach the host. A launcher that
merely runs the command fails the last check even when we are not root.
"""

from __future__ import annotations

import functools
import platform as platform_info
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs

from sandbox._bwrap import bwrap_argv
from sandbox._paths import CanonicalPaths, canonicalize
from sandbox._seatbelt import SANDBOX_EXEC, seatbelt_argv
from sandbox._spec import Policy, SandboxSpec

PROBE_TIMEOUT = 10.0
# $1: a new directory in /, $2: scratch, $3: a host file outside scratch. Exit 3 means the
# sandbox let us create a directory in / (removed again before exiting).
_SELF_TEST = (
    'if mkdir "$1" 2>/dev/null; then rmdir "$1"; exit 3; fi; '
    ': > "$2/probe-ok"; ( : > "$3" ) 2>/dev/null; exit 0'
)
_ROOT_WRITABLE = 3

_Builder = Callable[[CanonicalPaths, tuple[str, ...]], tuple[str, ...]]


@attrs.frozen(kw_only=True)
class ProbeResult:
    """Whether ``launcher`` works here; ``reason`` says why not (one line, ``""`` when it does)."""

    available: bool
    launcher: str
    reason: str
    version: str


@functools.cache
def _cached_probe() -> ProbeResult:
    return probe_platform(sys.platform)


def probe(*, refresh: bool = False) -> ProbeResult:
    """Probe this platform's launcher; cached for the process unless ``refresh``.

    Blocking (one launcher run, tens of milliseconds): from trio, call it once at start-up or
    through ``trio.to_thread.run_sync``.
    """
    if refresh:
        _cached_probe.cache_clear()
    return _cached_probe()


def probe_platform(platform: str) -> ProbeResult:
    """Probe the launcher for ``platform`` (``sys.platform`` spelling) without caching."""
    if platform == "linux":
        return _probe_bwrap()
    if platform == "darwin":
        return _probe_seatbelt()
    return ProbeResult(
        available=False,
        launcher="none",
        reason=f"no sandbox launcher for platform {platform!r} (bubblewrap on Linux, "
        "sandbox-exec on macOS)",
        version="",
    )


def _unavailable(launcher: str, reason: str, version: str = "") -> ProbeResult:
    return ProbeResult(available=False, launcher=launcher, reason=reason, version=version)


def _run(argv: list[str] | tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT,
        check=False,
    )


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else "no output"


def _self_test(launcher: str, version: str, build: _Builder) -> ProbeResult:
    """Run the self-test through ``build``'s argv on a throwaway scratch dir."""
    with tempfile.TemporaryDirectory(prefix="fleet-sandbox-probe-") as directory:
        scratch = Path(directory) / "scratch"
        scratch.mkdir()
        outside = Path(directory) / "outside"
        paths = canonicalize(SandboxSpec(policy=Policy.READ_ONLY, scratch=scratch))
        marker = f"/.fleet-sandbox-probe-{secrets.token_hex(8)}"
        command = ("/bin/sh", "-c", _SELF_TEST, "sh", marker, str(paths.scratch), str(outside))
        try:
            done = _run(build(paths, command))
        except (OSError, subprocess.TimeoutExpired) as exc:
            return _unavailable(launcher, f"{launcher} self-test did not run: {exc}", version)
        if done.returncode == _ROOT_WRITABLE:
            return _unavailable(
                launcher, f"{launcher} ran but / was writable inside; not trusting it", version
            )
        if outside.exists():
            return _unavailable(
                launcher,
                f"{launcher} ran but a write outside scratch reached the host; not trusting it",
                version,
            )
        if done.returncode != 0:
            return _unavailable(
                launcher,
                f"{launcher} self-test failed (exit {done.returncode}): {_first_line(done.stderr)}",
                version,
            )
        if not (paths.scratch / "probe-ok").is_file():
            return _unavailable(
                launcher, f"{launcher} ran but the scratch dir was not writable inside", version
            )
    return ProbeResult(available=True, launcher=launcher, reason="", version=version)


def _probe_bwrap() -> ProbeResult:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return _unavailable("bwrap", "bwrap not found on PATH; install bubblewrap")
    try:
        version = _run([bwrap, "--version"]).stdout.strip().rpartition(" ")[2]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _unavailable("bwrap", f"bwrap --version did not run: {exc}")
    return _self_test(
        "bwrap",
        version,
        lambda paths, command: bwrap_argv(bwrap, paths, command, network=False),
    )


def _probe_seatbelt() -> ProbeResult:
    if not Path(SANDBOX_EXEC).is_file():
        return _unavailable("sandbox-exec", f"{SANDBOX_EXEC} not found; Seatbelt needs macOS")
    # The real generated profile, so a profile this macOS will not parse fails closed here.
    return _self_test(
        "sandbox-exec",
        platform_info.mac_ver()[0],
        lambda paths, command: seatbelt_argv(paths, command, network=False),
    )
