"""Fixtures for the sandbox tests: a repo/scratch/worktree layout and a sandboxed attempt runner."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from sandbox import SandboxSpec, probe, wrap
from tests._needs import missing

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Awaitable, Callable

# Runs inside the sandbox: tries each "kind:argument" operation and prints {op: result}, where
# result is "ok", "ok:<content>" for reads, or the errno name the attempt failed with.
ATTEMPT = r"""
import errno, json, socket, sys
out = {}
for op in sys.argv[1:]:
    kind, _, arg = op.partition(":")
    try:
        if kind == "read":
            with open(arg) as f:
                out[op] = "ok:" + f.read()
            continue
        if kind == "append":
            with open(arg, "a") as f:
                f.write("appended")
        elif kind == "create":
            with open(arg, "x") as f:
                f.write("created")
        elif kind == "tcp":
            host, port = arg.rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=5).close()
        elif kind in ("unix", "abstract"):
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(arg if kind == "unix" else "\0" + arg)
                s.sendall(b"hello")
        out[op] = "ok"
    except OSError as exc:
        out[op] = errno.errorcode.get(exc.errno, str(exc))
print(json.dumps(out))
"""


@attrs.frozen(kw_only=True)
class Layout:
    repo: Path
    scratch: Path
    worktree: Path
    ipc: Path


@pytest.fixture(scope="session")
def bwrap_works() -> None:
    result = probe()
    if " ran but " in result.reason:
        # bwrap works here but our flags let the child out: a regression, not an environment.
        pytest.fail(f"the sandbox failed its own probe: {result.reason}")
    if result.launcher != "bwrap" or not result.available:
        pytest.fail(missing("sandbox") or f"needs sandbox: {result.reason}", pytrace=False)


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    """A repository with one file, a scratch dir, a worktree and a 0700 IPC dir, all under /tmp."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README").write_text("original")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    ipc = tmp_path / "ipc"
    ipc.mkdir(mode=0o700)
    return Layout(repo=repo, scratch=scratch, worktree=worktree, ipc=ipc)


def with_runtime(spec: SandboxSpec) -> SandboxSpec:
    """*spec* with this interpreter's prefix visible: a checkout (and its venv) may live under
    /tmp, which the sandbox replaces with an empty tmpfs."""
    runtime = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    return attrs.evolve(spec, visible=(*spec.visible, *sorted(runtime)))


async def _run_inside(spec: SandboxSpec, *argv: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` under ``spec`` (wrapped for real) and return its captured result."""
    wrapped = wrap(argv, with_runtime(spec))
    assert wrapped.wrapped, wrapped.reason
    with trio.fail_after(30):
        return await trio.run_process(
            wrapped.argv,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, **wrapped.env},
        )


async def _attempt(spec: SandboxSpec, *ops: str) -> dict[str, str]:
    """Try each operation inside the sandbox; see :data:`ATTEMPT`."""
    done = await _run_inside(spec, sys.executable, "-c", ATTEMPT, *ops)
    assert done.returncode == 0, done.stderr.decode()
    result: dict[str, str] = json.loads(done.stdout)
    return result


@pytest.fixture
def run_inside(bwrap_works: None) -> Callable[..., Awaitable[subprocess.CompletedProcess[bytes]]]:
    """``await run_inside(spec, *argv)``: run a command under real bubblewrap."""
    return _run_inside


@pytest.fixture
def attempt(bwrap_works: None) -> Callable[..., Awaitable[dict[str, str]]]:
    """``await attempt(spec, "append:/path", "tcp:127.0.0.1:80", ...)`` -> {op: result}."""
    return _attempt
