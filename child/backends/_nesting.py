"""Whether an agent CLI may use a sandbox of its own, and whether Codex's can run here.

Codex and Claude Code can sandbox their shell commands with bubblewrap, which cannot nest in
fleet's (``bwrap: setting up uid map: Operation not permitted``). :func:`inside_fleet_sandbox`
says when fleet's own sandbox is the fence (the CLI's is then off); outside it, Codex keeps its
own, and :func:`check_codex_sandbox` checks that it runs at all before the first turn (when it
cannot, Codex reports nothing: every command would fail and the model would get the bwrap
line as the command's output). See docs/backends.md, "Nested sandboxes".
"""

import os
import shutil
from collections.abc import Mapping
from typing import Final

import trio

import ipc
from child.backends._cli_env import CliError

#: Set to "1" by the supervisor's launch exactly when it wrapped the child in its OS sandbox.
SANDBOXED_ENV: Final = "FLEET_SANDBOXED"
PROBE_TIMEOUT: Final = 30.0
_POLICIES: Final = frozenset({"read_only", "review", "worker"})


def inside_fleet_sandbox(loadout: ipc.Loadout, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this child runs inside fleet's own sandbox, so a CLI must not nest its own.

    The loadout names the policy the supervisor chose (``sandbox``); the launch says whether
    it really wrapped the child (``FLEET_SANDBOXED=1``; ``0`` under ``--allow-unsandboxed``),
    which the loadout, sealed before the launch, cannot. Both must agree: anything else keeps
    the CLI's own sandbox on."""
    return loadout.sandbox in _POLICIES and environ.get(SANDBOXED_ENV) == "1"


async def codex_sandbox_problem(binary: str, *, env: Mapping[str, str], cwd: str) -> str:
    """``""`` when ``codex sandbox -- true`` runs here, else the line that says why not."""
    found = shutil.which(binary, path=env.get("PATH")) or binary
    with trio.move_on_after(PROBE_TIMEOUT):
        done = await trio.run_process(
            [found, "sandbox", "--", "true"],
            env=dict(env),
            cwd=cwd,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        if done.returncode == 0:
            return ""
        lines = [
            line.strip()
            for line in done.stderr.decode(errors="replace").splitlines()
            if line.strip() and not line.startswith("WARNING")
        ]
        return (lines[-1] if lines else f"exit {done.returncode}")[:200]
    return f"codex sandbox did not answer in {PROBE_TIMEOUT:.0f} s"


async def check_codex_sandbox(binary: str, *, env: Mapping[str, str], cwd: str) -> None:
    """Refuse, with one line, a Codex whose own sandbox cannot run a command here."""
    problem = await codex_sandbox_problem(binary, env=env, cwd=cwd)
    if problem:
        raise CliError(
            f"backend codex: Codex's own sandbox cannot run here ({problem}), so every "
            "command would fail; run the child in fleet's sandbox (install bubblewrap)",
            backend="codex",
            binary=binary,
        )
