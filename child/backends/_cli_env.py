"""What every agent-CLI backend (Pi, Claude Code, Codex) needs before it starts its CLI.

- :class:`PrivateDirs`: a private ``HOME``, ``TMPDIR`` and config directory per child, under the
  loadout's ``scratch`` directory (or a temp directory), removed on close. The CLIs write
  settings, caches and session files there, never into the user's real home.
- :func:`cli_environment`: the CLI's environment, built from scratch — the locale, ``PATH`` and a
  few harmless variables, plus only the secrets whose *names* the agent definition lists. Proxy
  variables are never passed on, except the sandbox's own egress relay (``_egress``).
- :func:`probe_version`: ``<binary> --version``; a missing or too-old CLI is one-line
  :class:`CliError` that says what to install.
"""

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs
import trio

from child.backends._egress import proxy_environment

log = logging.getLogger("child")

#: Seconds without any CLI output, while the model is being waited on, before a turn is failed.
DEFAULT_STALL_SECONDS: Final = 180.0
STALL_ENV: Final = "FLEET_STALL_TIMEOUT"
PROBE_TIMEOUT: Final = 30.0
#: Variables copied from our environment: enough to run node and a shell, nothing secret.
_BASE_NAMES: Final = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL")
_PROXY_NAMES: Final = frozenset({"http_proxy", "https_proxy", "all_proxy", "no_proxy", "ftp_proxy"})
_VERSION: Final = re.compile(r"(\d+)\.(\d+)\.(\d+)")


class CliError(Exception):
    """An agent CLI cannot be used; the message is one line with the fix."""

    def __init__(self, message: str, *, backend: str, binary: str) -> None:
        super().__init__(message)
        self.backend = backend
        self.binary = binary


@attrs.frozen(order=True)
class Version:
    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> "Version | None":
        match = _VERSION.search(text)
        return cls(*map(int, match.groups())) if match else None

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def stall_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """The stall timeout: ``$FLEET_STALL_TIMEOUT`` seconds when valid, else the default."""
    raw = environ.get(STALL_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_STALL_SECONDS
    return value if 0 < value < float("inf") else DEFAULT_STALL_SECONDS


def binary_for(backend: str, default: str, environ: Mapping[str, str] = os.environ) -> str:
    """The CLI to run: ``$FLEET_<BACKEND>_BIN`` (a path or a name on PATH), else *default*."""
    return environ.get(f"FLEET_{backend.upper()}_BIN") or default


@attrs.define(eq=False)
class PrivateDirs:
    """``root/{home,tmp,config}``, mode 0700, owned by one child's backend."""

    root: Path

    @classmethod
    def create(cls, scratch: str, label: str) -> "PrivateDirs":
        """Under *scratch* when the loadout names one (the sandbox keeps it writable)."""
        parent = scratch if scratch and Path(scratch).is_dir() else None
        root = Path(tempfile.mkdtemp(prefix=f"fleet-{label}-", dir=parent))
        for name in ("home", "tmp", "config"):
            (root / name).mkdir(mode=0o700)
        return cls(root=root)

    @classmethod
    def kept(cls, scratch: str, label: str) -> "PrivateDirs":
        """``scratch/label``, the same for every start of this child: a resumable CLI's
        session store outlives the process (a revived child finds it there)."""
        root = Path(scratch) / label
        for path in (root, root / "home", root / "tmp", root / "config"):
            path.mkdir(mode=0o700, exist_ok=True)
        return cls(root=root)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def config(self) -> Path:
        """Not below ``tmp``: Codex's sandboxed tools break when its home is inside TMPDIR."""
        return self.root / "config"

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def cli_environment(
    dirs: PrivateDirs,
    *,
    secrets: Sequence[str],
    extra: Mapping[str, str],
    source: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """The CLI's whole environment (see the module docstring); *extra* wins over the rest."""
    env = {name: source[name] for name in _BASE_NAMES if name in source}
    for name in secrets:
        if name.lower() in _PROXY_NAMES:
            log.warning("not passing %s to the agent CLI: proxy variables are stripped", name)
        elif name in source:
            env[name] = source[name]
    env |= {
        "HOME": str(dirs.home),
        "TMPDIR": str(dirs.tmp),
        "XDG_CONFIG_HOME": str(dirs.config),
        "XDG_CACHE_HOME": str(dirs.root / "tmp" / "cache"),
        "TERM": "dumb",
        "NO_COLOR": "1",
        "FLEET_CHILD": "1",
    }
    env |= extra
    kept = {k: v for k, v in env.items() if k.lower() not in _PROXY_NAMES}
    return kept | proxy_environment(source)  # only the sandbox's own egress relay


async def probe_version(
    backend: str,
    binary: str,
    *,
    minimum: Version,
    package: str,
    env: Mapping[str, str],
) -> Version:
    """Run ``binary --version``; refuse a missing, broken or too-old CLI with one line."""
    found = shutil.which(binary, path=env.get("PATH"))
    hint = (
        f"install {package}@{minimum} or newer, or point FLEET_{backend.upper()}_BIN at it "
        "and restart the supervisor: fleet serve --stop"
    )
    if found is None:
        raise CliError(
            f"backend {backend}: {binary} is not on PATH ({hint})", backend=backend, binary=binary
        )
    try:
        with trio.fail_after(PROBE_TIMEOUT):
            done = await trio.run_process(
                [found, "--version"],
                env=dict(env),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    except (OSError, trio.TooSlowError) as exc:
        cause = "timed out" if isinstance(exc, trio.TooSlowError) else str(exc)
        raise CliError(
            f"backend {backend}: {found} --version failed: {cause} ({hint})",
            backend=backend,
            binary=found,
        ) from None
    output = (done.stdout + done.stderr).decode(errors="replace")
    version = Version.parse(output)
    if done.returncode != 0 or version is None:
        first = (output.strip().splitlines() or ["no output"])[0][:120]
        raise CliError(
            f"backend {backend}: {found} --version exited {done.returncode}: {first} ({hint})",
            backend=backend,
            binary=found,
        )
    if version < minimum:
        raise CliError(
            f"backend {backend}: {found} is version {version}, older than {minimum} ({hint})",
            backend=backend,
            binary=found,
        )
    return version
