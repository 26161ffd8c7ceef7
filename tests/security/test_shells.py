"""A hostile child's background shells (the ``shell`` tool) through the real supervisor: none
outlives its child's stop however it hides (``setsid nohup``, a double fork, SIGTERM ignored, an
emptied environment), none reaches past the sandbox, and a shell printing hundreds of megabytes
costs the child bounded memory and the parent a bounded report.

Real ``python -m child`` processes under real bubblewrap, driven by scripted models, in a real
git repository; each hidden process is a ``sleep`` with a number of its own, found afterwards
among every process on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest
import trio

from orchestrator._config import Config
from orchestrator._records import State
from orchestrator.core._supervisor import SpawnRequest, open_supervisor

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.slow

CEILING = 240
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}
#: Each way a process may hide from its child's stop, as a ``sleep`` numbered for the hunt.
HIDERS = {
    "3011": "setsid nohup sh -c 'exec sleep 3011' >/dev/null 2>&1 &",
    "3012": "(sh -c 'exec sleep 3012' >/dev/null 2>&1 &)",
    "3013": "env -i /bin/sh -c \"setsid /bin/sh -c 'exec sleep 3013' >/dev/null 2>&1 &\"",
    "3014": "(trap '' TERM HUP; exec sleep 3014) >/dev/null 2>&1 &",
}
#: Bytes the flooding shell prints on one endless line, then lines.
FLOOD_BYTES = 200_000_000
FLOOD_LINES = 500_000
#: The file in the child's worktree that starts the flood.
GO = ".flood-go"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Path]]:
    home = Path(tempfile.mkdtemp(prefix="fsh-", dir="/tmp"))  # short socket paths
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("# sample\n")
    agents = repo / ".fleet" / "agents"
    agents.mkdir(parents=True)
    (agents / "runner.md").write_text(
        '---\n{"name": "runner", "description": "runs things", "tools": ["read", "bash"], '
        '"mode": "worktree"}\n---\nYou run things.\n'
    )
    git_env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=repo, env=git_env, check=True, capture_output=True)
    try:
        yield {"home": home, "repo": repo, "tmp": tmp_path}
    finally:
        hunt(kill=True)
        shutil.rmtree(home, ignore_errors=True)


def hunt(*, kill: bool = False) -> list[str]:
    """Every live ``sleep 301N`` on the machine (killed when *kill*)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if cmdline[:1] == ["sleep"] and cmdline[1:2] and cmdline[1] in HIDERS:
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            found.append(f"{process.pid}:{' '.join(cmdline)}")
            if kill:
                process.kill()
    return found


def script(world: dict[str, Path]) -> str:
    """Turn 1 hides its sleeps, tries to escape and starts the flood; the flood's watch wakes
    the child when it ends, and turn 2 reads it."""
    outside = world["tmp"] / "escaped"
    hide = "\n".join([*HIDERS.values(), "echo hidden", "exec sleep 600"])
    escape = (
        f"echo out > {outside}; echo fleet > {world['home']}/planted; "
        f"cat {world['home']}/sessions/t/control.token; echo tried"
    )
    # The flood waits for the test's go, given once turn 1 has ended: a flood that ended
    # while turn 1 still ran would be shown to that turn's next step, and no turn 2 would come.
    flood = (
        f"while [ ! -e {GO} ]; do sleep 0.05; done; rm -f {GO}; "
        f"head -c {FLOOD_BYTES} /dev/zero | tr '\\0' x; yes | head -n {FLOOD_LINES}; echo END"
    )
    first: list[dict[str, Any]] = [
        {"tool": "shell", "args": {"action": "start", "command": hide}},
        {"tool": "shell", "args": {"action": "start", "command": escape}},
        {"tool": "shell", "args": {"action": "start", "command": flood, "watch": "^END$"}},
        {"tool": "shell", "args": {"action": "list"}},
        {"reply": "{{tool:shell}}"},
    ]
    second: list[dict[str, Any]] = [
        {"tool": "shell", "args": {"action": "read", "id": "s3", "lines": 2000}},
        {"reply": "{{tool:shell}}"},
    ]
    path = world["tmp"] / "hostile.yaml"
    # YAML is a superset of JSON: the steps as they are.
    path.write_text(json.dumps({"turns": [{"steps": first}, {"steps": second}]}))
    return f"scripted:{path}"


@pytest.mark.parametrize("sandbox", ["sandboxed", "unsandboxed"])
async def test_no_hostile_background_shell_outlives_its_child_or_its_output_cap(
    world: dict[str, Path], sandbox: str
) -> None:
    if sandbox == "sandboxed" and not shutil.which("bwrap"):
        pytest.skip("no bubblewrap")
    settings: dict[str, Any] = {}
    if sandbox == "unsandboxed":
        settings = {"sandbox": "off", "allow_unsandboxed": True}
    config = Config(
        home=world["home"],
        session="t",
        workspace=world["repo"],
        agents_scope="project",
        model=script(world),
        kill_grace=1.0,
        **settings,
    )
    assert hunt() == [], "a sleep of an earlier run is still alive"
    rss: list[int] = []
    with trio.fail_after(CEILING):
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="hide", agent="runner")])
            [note] = await sup.wait([record.key])
            assert "s3 [running" in note["report"], note
            (Path(record.workspace) / GO).touch()  # turn 1 has ended: the flood may start
            assert record.sandboxed is (sandbox == "sandboxed")
            assert record.pid is not None
            child = psutil.Process(record.pid)
            # The flood runs; its watch wakes the child when it ends and turn 2 reads it. The
            # child's memory meanwhile stays bounded (its shells keep the last lines only).
            while not (record.turn == 2 and record.state is State.IDLE):
                with contextlib.suppress(psutil.Error):
                    rss.append(child.memory_info().rss)
                await trio.sleep(0.25)
            report = record.report
            # Each hidden sleep is running, out of its shell's process group.
            assert len(hunt()) == len(HIDERS), hunt()
            await sup.stop([record.key])
            # Gone with its child's stop (the supervisor is still up).
            with trio.move_on_after(10):
                while hunt():  # noqa: ASYNC110 - the kernel reaps them
                    await trio.sleep(0.1)
            assert hunt() == [], f"outlived its child's stop: {hunt()}"
    # Read when its watch fired on END: the shell has exited, or is just about to.
    assert report.startswith(("[s3 exited 0; ", "[s3 running ")), report[:200]
    assert report.rstrip().endswith("END"), report[-200:]
    assert len(report) < 64 * 1024, len(report)
    assert max(rss) < 200 * 1024 * 1024, f"the child grew to {max(rss)} bytes"
    if sandbox == "sandboxed":
        assert not (world["tmp"] / "escaped").exists()
        assert not (world["home"] / "planted").exists()
