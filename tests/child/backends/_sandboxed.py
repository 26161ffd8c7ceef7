"""A CLI backend's turn run inside fleet's own sandbox (bubblewrap), as a supervisor runs it.

:func:`sandboxed_turn` starts this module as a script under :func:`sandbox.wrap` (policy
``review``, so the loopback model server outside stays reachable; the nested-sandbox trouble
is about user namespaces, not the network) with ``FLEET_SANDBOXED=1``, as
:func:`orchestrator.launch._sandboxing.place` sets it. The script builds the backend from a
loadout, runs one turn and prints the result and the tool activity as JSON.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import sandbox

ROOT = Path(__file__).resolve().parents[3]


def sandboxed_turn(
    binary: str, tmp_path: Path, base_url: str, *, sandboxed: bool = True, **fields: Any
) -> dict[str, Any]:
    """The turn's ``{ok, text, error, tool_ends}`` from *binary*'s backend (``pi``, ``claude``,
    ``codex``) run inside the sandbox; *fields* go into its loadout."""
    from tests.child.backends._backends import make_loadout  # noqa: PLC0415
    from tests.fakes._agent_clis import NPM_BIN  # noqa: PLC0415 - only for the caller's side

    make_loadout(tmp_path)  # the workspace and scratch, made before the sandbox hides writes
    scratch = tmp_path / "scratch"
    request: dict[str, Any] = {"binary": str(NPM_BIN / binary), "kind": binary}
    request |= {"tmp": str(tmp_path), "base_url": base_url}
    request["fields"] = {"sandbox": "read_only"} | fields
    argv = [sys.executable, "-m", "tests.child.backends._sandboxed", json.dumps(request)]
    spec = sandbox.SandboxSpec(
        policy=sandbox.Policy.REVIEW,
        scratch=scratch,
        visible=tuple(
            {tmp_path, ROOT, NPM_BIN.resolve().parent, Path(sys.prefix), Path(sys.base_prefix)}
        ),
        cwd=tmp_path,
    )
    wrapped = sandbox.wrap(argv, spec)
    assert wrapped.wrapped, wrapped.reason  # bwrap is installed for these tests
    env = os.environ | wrapped.env | {"FLEET_SANDBOXED": "1" if sandboxed else "0"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        wrapped.argv,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    outcome: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return outcome


async def _main(request: dict[str, Any]) -> None:
    from tests.child.backends._cli import make_backend_at  # noqa: PLC0415 - inside the sandbox

    backend, host = make_backend_at(
        request["kind"],
        request["binary"],
        Path(request["tmp"]),
        request["base_url"],
        **request["fields"],
    )
    try:
        result = await backend.run_turn("run it")
    finally:
        await backend.aclose()
    ends = [e.text for e in host.activities("tool_end")]
    print(
        json.dumps({"ok": result.ok, "text": result.text, "error": result.error, "tool_ends": ends})
    )


if __name__ == "__main__":
    import trio

    trio.run(_main, json.loads(sys.argv[1]))
