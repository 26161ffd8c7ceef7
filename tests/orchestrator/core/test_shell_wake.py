"""Background shells through the real supervisor: a watch wakes an idle child; its shells die
with it. Real ``python -m child`` processes running scripted models in a real git repository."""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from orchestrator._config import Config
from orchestrator._records import ChildRecord, State
from orchestrator.core._requests import WAKE_PROMPT
from orchestrator.core._supervisor import SpawnRequest, open_supervisor

pytestmark = pytest.mark.slow

CEILING = 60
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "README.md").write_text("# sample\n")
    agents = root / ".fleet" / "agents"
    agents.mkdir(parents=True)
    (agents / "runner.md").write_text(
        '---\n{"name": "runner", "description": "runs things", "tools": ["read", "bash"], '
        '"mode": "worktree"}\n---\nYou run things.\n'
    )
    git_env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=root, env=git_env, check=True, capture_output=True)
    return root


@pytest.fixture
def home() -> Iterator[Path]:
    # Socket paths must stay short (sun_path), so FLEET_HOME is not under pytest's tmp_path.
    path = Path(tempfile.mkdtemp(prefix="fsw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def config(home: Path, repo: Path, script: str, **settings: Any) -> Config:
    path = repo.parent / "script.yaml"
    path.write_text(textwrap.dedent(script))
    return Config(
        home=home,
        session="t",
        workspace=repo,
        agents_scope="project",
        model=f"scripted:{path}",
        **settings,
    )


async def idle_after(record: ChildRecord, turn: int) -> None:
    """Until *record* is idle after turn *turn* (the supervisor has no event for it)."""
    while not (record.turn == turn and record.state is State.IDLE):  # noqa: ASYNC110
        await trio.sleep(0.05)


WAKES = """
turns:
  - steps:
      - tool: shell
        args: {action: start, command: "sleep 1; echo BUILD OK; exec sleep 60", watch: "OK$"}
      - reply: "first: {{last}}"
  - steps:
      - tool: shell
        args: {action: read, id: s1}
      - reply: "second: {{task}} | {{last}}"
"""


@pytest.mark.needs("sandbox")
async def test_a_watch_wakes_an_idle_sandboxed_child_with_a_prompt(home: Path, repo: Path) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(config(home, repo, WAKES)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="build it", agent="runner")])
            [first] = await sup.wait([record.key])
            assert first["state"] == "idle", first
            assert first["report"].startswith("first: started s1 (pid ")
            # Nobody prompts it: the watch does, once the line appears.
            await idle_after(record, 2)
            report = record.report
            assert report.startswith(f"second: {WAKE_PROMPT} | [s1 running"), report
            assert report.endswith("BUILD OK")
            assert record.turn == 2
            assert record.state is State.IDLE
            assert sup.peek()["agents"][0]["sandboxed"] is True


KEEPS = """
turns:
  - steps:
      - tool: shell
        args: {action: start, command: "trap '' TERM; sleep 300 & echo bg $!; wait"}
      - tool: bash
        args: {command: "sleep 0.3"}
      - tool: shell
        args: {action: read, id: s1}
      - reply: "{{tool:shell}}"
"""


async def test_a_sigkilled_childs_shells_die_with_it(home: Path, repo: Path) -> None:
    settings = {"sandbox": "off", "allow_unsandboxed": True}
    with trio.fail_after(CEILING):
        async with open_supervisor(config(home, repo, KEEPS, **settings)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="keep it up", agent="runner")])
            [note] = await sup.wait([record.key])
            [leader] = map(int, re.findall(r"pid (\d+)", note["report"]))
            [grandchild] = map(int, re.findall(r"^bg (\d+)$", note["report"], re.MULTILINE))
            assert record.pid is not None
            assert {leader, grandchild} <= set(_descendants(record.pid))
            os.kill(record.pid, signal.SIGKILL)
            assert await _all_dead([leader, grandchild]) == []


@pytest.mark.needs("sandbox")
async def test_a_sigkilled_sandboxed_childs_shells_die_with_it(home: Path, repo: Path) -> None:
    # A sandboxed child is forked inside the sandboxed fork server's pid namespace, whose init
    # outlives it: the namespace does not take the shells down. End to end the supervisor's
    # marker sweep of the dead child's tree also would; tests/child/tools/test_shell.py shows
    # the child's own guardian and PDEATHSIG do it without a supervisor.
    with trio.fail_after(CEILING):
        async with open_supervisor(config(home, repo, KEEPS)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="keep it up", agent="runner")])
            [note] = await sup.wait([record.key])
            assert note["report"].startswith("[s1 running"), note["report"]
            assert record.pid is not None
            sleeps = [p for p in _descendants(record.pid) if _args(p)[:2] == ["sleep", "300"]]
            assert len(sleeps) == 1
            os.kill(record.pid, signal.SIGKILL)
            assert await _all_dead(sleeps) == []


def _descendants(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def _args(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


async def _all_dead(pids: list[int]) -> list[int]:
    """The *pids* still alive after up to 5 s."""
    with trio.move_on_after(5):
        while not all(map(_dead, pids)):  # noqa: ASYNC110 - the kernel kills them
            await trio.sleep(0.05)
    return [pid for pid in pids if not _dead(pid)]


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


RACES = """
turns:
  - steps:
      - tool: shell
        args: {action: start, command: "sleep 0.3; echo OK", watch: "OK"}
      - wait: 1.5
      - reply: "first"
  - steps:
      - reply: "second: {{task}}"
"""


async def test_a_watch_that_fires_during_the_last_step_still_wakes_the_child(
    home: Path, repo: Path
) -> None:
    # The note misses the turn's last model step, and the child asks for a wake while the
    # supervisor still counts the turn as running: it is honoured once the turn settles.
    settings = {"sandbox": "off", "allow_unsandboxed": True}
    with trio.fail_after(CEILING):
        async with open_supervisor(config(home, repo, RACES, **settings)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="go", agent="runner")])
            await idle_after(record, 2)
            assert record.report == f"second: {WAKE_PROMPT}"


PAUSES = """
turns:
  - steps:
      - tool: shell
        args: {action: start, command: "sleep 1; echo OK", watch: "OK"}
      - reply: "first"
  - steps:
      - reply: "second: {{task}}"
"""


async def test_a_paused_child_is_not_woken_by_its_watch(home: Path, repo: Path) -> None:
    settings = {"sandbox": "off", "allow_unsandboxed": True}
    with trio.fail_after(CEILING):
        async with open_supervisor(config(home, repo, PAUSES, **settings)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="go", agent="runner")])
            [note] = await sup.wait([record.key])
            assert note["report"] == "first"
            await sup.pause(record.key)
            assert record.state is State.PAUSED
            await trio.sleep(2)  # the watch fired meanwhile (after 1 s)
            assert (record.turn, record.state) == (1, State.PAUSED)
            await sup.prompt(record.key, "carry on")
            await idle_after(record, 2)
            assert record.report == "second: carry on"
