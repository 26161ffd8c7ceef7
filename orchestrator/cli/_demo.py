"""``fleet demo``: three scouts in parallel on a copy of a small sample repository.

Runs on the embedded default — the builtin agent with scripted models — with an in-process
supervisor in a throwaway state directory, so it needs nothing but this package (git is used
when present to make the copy a repository). ``fleet demo --ray`` runs the same scouts on a
local Ray cluster it starts (the ``[ray]`` extra): each under its own actor, dialling back over
mutual TLS, as children on a real cluster do (docs/scale-out.md).
"""

import json
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import trio

import orchestrator
from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.cli import _render

REFRESH = 0.25
UNSANDBOXED_NOTE = "fleet demo: its scripted scouts are ours, so they run unsandboxed"
TASKS = (
    ("layout", "Map the package layout of this repository."),
    ("rounding", "Find where prices are rounded and how."),
    ("tests", "Check what the tests cover, and what they miss."),
)


def _prepare(base: Path) -> tuple[Path, Path]:
    data = resources.files("orchestrator.cli") / "_demo_data"
    repo = base / "inventory"
    scripts = base / "scripts"
    with resources.as_file(data) as source:
        shutil.copytree(Path(source) / "repo", repo)
        shutil.copytree(Path(source) / "scripts", scripts)
    if shutil.which("git"):
        env = {
            "GIT_AUTHOR_NAME": "fleet demo",
            "GIT_AUTHOR_EMAIL": "demo@fleet.invalid",
            "GIT_COMMITTER_NAME": "fleet demo",
            "GIT_COMMITTER_EMAIL": "demo@fleet.invalid",
            "PATH": "/usr/bin:/bin:/usr/local/bin",
        }
        for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "demo"]):
            subprocess.run(argv, cwd=repo, env=env, check=False, capture_output=True)
    return repo, scripts


async def _show_progress(sup: orchestrator.Supervisor, keys: list[str], *, tty: bool) -> None:
    last_lines: dict[str, str] = {}
    while True:
        data = sup.peek(keys)
        if tty:
            sys.stdout.write("\x1b[H\x1b[2J" + _render.peek_table(data) + "\n")
            sys.stdout.flush()
        else:
            for agent in data["agents"]:
                line = f"{agent['key']} {agent['state']:8} {agent['activity']}"
                if last_lines.get(agent["key"]) != line:
                    last_lines[agent["key"]] = line
                    print(line, flush=True)
        if all(a["state"] not in {"starting", "working", "waiting"} for a in data["agents"]):
            return
        await trio.sleep(REFRESH)


async def _demo(base: Path, *, json_output: bool, ray: bool = False) -> int:
    repo, scripts = _prepare(base)
    # The scouts run our own scripted models, not an agent: the one place fleet runs children
    # unsandboxed without the user's --allow-unsandboxed, and it says so.
    config = Config(
        home=base / "state",
        session="demo",
        workspace=repo,
        sandbox="off",
        allow_unsandboxed=True,
        ray_address="local",
    )
    surface = "ray" if ray else "process"
    started = time.monotonic()
    async with orchestrator.open_supervisor(config) as sup:
        records = await sup.spawn(
            [
                SpawnRequest(
                    task=task,
                    agent="scout",
                    name=name,
                    model=f"scripted:{scripts / name}.yaml",
                    surface=surface,
                )
                for name, task in TASKS
            ]
        )
        keys = [r.key for r in records]
        if not json_output:
            print(UNSANDBOXED_NOTE)
            where = " on a local Ray cluster" if ray else ""
            print(f"fleet demo: 3 scouts{where} on {repo}\n")
            await _show_progress(sup, keys, tty=sys.stdout.isatty())
        notes = await sup.wait(keys, every=True)
        table = _render.peek_table(sup.peek())
        handoffs = await sup.stop(keys)
    elapsed = time.monotonic() - started
    if json_output:
        result = {
            "reports": [_report(h) for h in handoffs],
            "surface": surface,
            "seconds": round(elapsed, 2),
        }
        print(json.dumps({**result, "note": UNSANDBOXED_NOTE}))
    else:
        print()
        print(table)
        print()
        print(_render.settled_text(notes))
        print(f"\n3 scouts, {elapsed:.1f} s; only these final reports reached the parent.")
    return 0 if all(h["state"] == "stopped" and not h["error"] for h in handoffs) else 1


def _report(handoff: dict[str, Any]) -> dict[str, Any]:
    return {k: handoff[k] for k in ("key", "name", "state", "last", "error")}


def run_demo(*, json_output: bool = False, ray: bool = False) -> int:
    """Run the demo (its scouts on a local Ray cluster with *ray*); the process exit code."""
    if ray:
        try:
            import ray as _ray  # noqa: F401, PLC0415 - only to say at once that it is missing
        except ImportError:
            print("fleet demo --ray: needs Ray: pip install 'fleet-orchestrator[ray]'")
            return 2
    with tempfile.TemporaryDirectory(prefix="fleet-demo-") as base:
        return trio.run(lambda: _demo(Path(base), json_output=json_output, ray=ray))
