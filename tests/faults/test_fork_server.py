"""Unsandboxed ``process`` children start as forks of the fork server, and survive its faults.

Each scenario runs a real supervisor with ``sandbox="off"`` (and ``allow_unsandboxed``): the
children are real forks of a real ``python -I -m child._forkserver``, and every ending goes
through ``faults.ended``.
"""

import os
import shutil
import signal
import stat
import sys
import time
from pathlib import Path

import psutil
import pytest
import trio

from orchestrator._config import load_config
from orchestrator._records import State
from orchestrator.core._supervisor import SpawnRequest, open_supervisor
from orchestrator.launch._forkserver import ForkServer

pytestmark = pytest.mark.slow

CEILING = 60
REPLY = """
turns:
  - steps:
      - reply: "done in {{turn}}"
  - steps:
      - reply: "again"
"""
HANG = """
turns:
  - steps:
      - say: "working"
      - hang: true
"""


def _server(sup: object) -> psutil.Process:
    forks = getattr(sup, "fork_server", None)
    assert forks is not None
    assert forks.pid is not None
    return psutil.Process(forks.pid)


async def test_a_child_is_a_fork_of_the_server_and_ends_cleanly(faults) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(sandbox="off", allow_unsandboxed=True)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", model=faults.script("r", REPLY))])
            [note] = await sup.wait([record.key])
            assert note["report"] == "done in 1"
            server = _server(sup)
            child = faults.child_process(record.key)
            assert child.pid == record.pid
            assert child.ppid() == server.pid
            assert child.name() == f"fleet {record.key}"
            assert "child._forkserver" in child.cmdline()
            # Its own session and stdio: pipes to the supervisor, not the server's log file.
            assert os.getsid(child.pid) == child.pid
            for fd in (1, 2):
                assert os.readlink(f"/proc/{child.pid}/fd/{fd}").startswith("pipe:")
            assert str(sup.paths.root / "fork-server.log") not in {
                f.path for f in child.open_files()
            }
            log = (sup.paths.logs / f"{record.key}.log").read_text()
            assert f"launched process pid {record.pid} (forked)" in log
            # Context is kept across turns, as in any child.
            await sup.prompt(record.key, "more")
            [note] = await sup.wait([record.key])
            assert note["report"] == "again"
            pids = faults.tree(record.pid)
            [handoff] = await sup.stop([record.key])
            assert handoff["state"] == "stopped"
            await faults.ended(sup, record.key, state=State.STOPPED, pids=pids)
        # Closing the supervisor ends the server too.
        await faults.gone([server.pid])
    assert faults.processes() == []


async def test_a_forked_childs_environment_and_directory_are_its_own(faults) -> None:
    probe = ("sh", "-c", 'echo "run=$FLEET_RUN child=$FLEET_CHILD dir=$(pwd)"')
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(sandbox="off", allow_unsandboxed=True)) as sup:
            [record] = await sup.spawn(
                [SpawnRequest(task="probe", backend="command", command=probe)]
            )
            [note] = await sup.wait([record.key])
            marker = f"t/{record.key}/{os.getpid()}"
            assert f"run={marker} child=1 dir={faults.repo}" in note["report"]
            await sup.stop([record.key])


async def test_a_killed_fork_is_reported_killed_with_the_servers_exit_status(faults) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(sandbox="off", allow_unsandboxed=True)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", model=faults.script("h", HANG))])
            await faults.until(lambda: record.state is State.WORKING)
            pids = faults.tree(record.pid)
            faults.child_process(record.key).send_signal(signal.SIGKILL)
            note = await faults.ended(sup, record.key, state=State.FAILED, kind="killed", pids=pids)
            assert note["failure"]["error"] == "child killed by SIGKILL"


async def test_a_crashing_fork_shows_its_exit_code(faults) -> None:
    crash = faults.script("c", "turns:\n  - steps:\n      - say: bye\n      - crash: 7\n")
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(sandbox="off", allow_unsandboxed=True)) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", model=crash)])
            note = await faults.ended(sup, record.key, state=State.FAILED, kind="exited")
            assert note["failure"]["error"] == "child exited with code 7"


async def test_when_the_server_dies_children_go_on_and_new_ones_start_fresh(faults) -> None:
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(sandbox="off", allow_unsandboxed=True)) as sup:
            [forked] = await sup.spawn([SpawnRequest(task="t", model=faults.script("h", HANG))])
            await faults.until(lambda: forked.state is State.WORKING)
            server = _server(sup)
            server.kill()
            await faults.gone([server.pid])
            await faults.until(
                lambda: sup.fork_server is not None and bool(sup.fork_server.failure)
            )
            # The orphaned fork still answers its supervisor.
            assert faults.child_process(forked.key).is_running()
            peek = sup.peek([forked.key])["agents"][0]
            assert peek["state"] == "working"
            [fresh] = await sup.spawn([SpawnRequest(task="t", model=faults.script("r", REPLY))])
            [note] = await sup.wait([fresh.key])
            assert note["report"] == "done in 1"
            # A fresh interpreter, inheriting its connection and loadout as descriptors.
            fresh_cmdline = psutil.Process(fresh.pid).cmdline()
            assert "child._forkserver" not in fresh_cmdline
            assert fresh_cmdline[-4::2] == ["--fd", "--loadout-fd"]
            assert not (sup.paths.loadouts / f"{fresh.key}.json").exists()
            pids = faults.tree(forked.pid) + faults.tree(fresh.pid)
            handoffs = await sup.stop([forked.key, fresh.key])
            assert [h["state"] for h in handoffs] == ["stopped", "stopped"]
            await faults.gone(pids)
    assert faults.processes() == []


def _python_that(tmp_path: Path, as_server: str) -> Path:
    """An interpreter that runs every child, but runs the shell commands *as_server* when it
    is asked to be a fork server (bash: dash takes one-digit descriptors only)."""
    python = tmp_path / "python"
    python.write_text(
        f"#!{shutil.which('bash')}\n"
        f'case "$*" in *child._forkserver*) {as_server};; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


async def test_a_server_that_cannot_start_leaves_children_to_fresh_interpreters(
    faults, tmp_path: Path
) -> None:
    # An interpreter that runs every child but refuses to be a fork server.
    python = _python_that(tmp_path, 'echo "no fork server here" >&2; exit 9')
    with trio.fail_after(CEILING):
        async with open_supervisor(
            faults.config(sandbox="off", allow_unsandboxed=True, python=str(python))
        ) as sup:
            [record] = await sup.spawn([SpawnRequest(task="t", model=faults.script("r", REPLY))])
            [note] = await sup.wait([record.key])
            assert note["report"] == "done in 1"
            assert sup.fork_server is not None
            assert sup.fork_server.failure == "did not start (said None) (exit 9)"
            assert "no fork server here" in (sup.paths.root / "fork-server.log").read_text()
            await sup.stop([record.key])
    assert faults.processes() == []


async def test_a_server_that_closes_its_socket_before_it_exits_is_reported_with_its_status(
    faults, tmp_path: Path
) -> None:
    """The kernel gives a process's exit status a moment after it has closed its descriptors:
    a server seen to close its end is waited for (briefly), so its failure says how it ended."""
    # $4 is the server's socket (``-I -m child._forkserver FD``): closed, then a pause.
    python = _python_that(tmp_path, f'eval "exec $4>&-"; {shutil.which("sleep")} 0.3; exit 9')
    with trio.fail_after(CEILING):
        async with open_supervisor(
            faults.config(sandbox="off", allow_unsandboxed=True, python=str(python))
        ) as sup:
            assert sup.fork_server is not None
            assert not await sup.fork_server.ready()
            assert sup.fork_server.failure == "did not start (said None) (exit 9)"
    assert faults.processes() == []


def test_the_fork_server_can_be_turned_off(faults, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_FORK_SERVER", "0")
    config = load_config(cwd=faults.repo, home=faults.home)
    assert config.fork_server is False
    monkeypatch.setenv("FLEET_FORK_SERVER", "1")
    assert load_config(cwd=faults.repo, home=faults.home).fork_server is True


async def test_without_the_fork_server_a_child_runs_its_own_interpreter(faults) -> None:
    with trio.fail_after(CEILING):
        config = faults.config(sandbox="off", allow_unsandboxed=True, fork_server=False)
        async with open_supervisor(config) as sup:
            assert sup.fork_server is None
            [record] = await sup.spawn([SpawnRequest(task="t", model=faults.script("r", REPLY))])
            await sup.wait([record.key])
            cmdline = faults.child_process(record.key).cmdline()
            assert cmdline[-6:-4] == ["-m", "child"]
            assert cmdline[-4::2] == ["--fd", "--loadout-fd"]
            assert not (sup.paths.loadouts / f"{record.key}.json").exists()
            await sup.stop([record.key])


def test_a_killed_daemon_takes_its_fork_server_and_forks_with_it(faults, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_SANDBOX", "off")
    monkeypatch.setenv("FLEET_ALLOW_UNSANDBOXED", "1")
    spawned = faults.cli("spawn", "--model", faults.script("h", HANG), "look", "--json")
    assert spawned.returncode == 0, spawned.stderr
    deadline = time.monotonic() + 30
    forks: list[psutil.Process] = []
    while len(forks) < 2 and time.monotonic() < deadline:
        forks = [p for p in faults.processes() if "child._forkserver" in p.cmdline()]
        time.sleep(0.1)
    # The fork, and the server itself.
    assert sorted(p.name() == "fleet a1" for p in forks) == [False, True]
    daemon = int((faults.home / "sessions" / "t" / "supervisor.lock").read_text().strip())
    os.kill(daemon, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while faults.processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert faults.processes() == []


async def test_a_server_started_by_a_child_outlives_that_childs_run(faults) -> None:
    # Where children are unsandboxed only now and then (no sandbox works here, say), the
    # server starts with the first such child; it must serve the children after that one.
    with trio.fail_after(CEILING):
        async with open_supervisor(faults.config(sandbox="off", allow_unsandboxed=True)) as sup:
            forks = sup.fork_server
            assert forks is not None
            await forks.aclose()  # the one started up front: replace it with an unstarted one
            sup.fork_server = ForkServer(
                python=forks.python, label=forks.label, env=forks.env, nursery=sup.nursery
            )
            sup.launchers.clear()
            [first] = await sup.spawn([SpawnRequest(task="t", model=faults.script("r", REPLY))])
            await sup.wait([first.key])
            server = _server(sup)
            await sup.stop([first.key])
            [second] = await sup.spawn([SpawnRequest(task="t", model=faults.script("r", REPLY))])
            [note] = await sup.wait([second.key])
            assert note["report"] == "done in 1"
            assert psutil.Process(second.pid).ppid() == server.pid
            await sup.stop([second.key])
    assert faults.processes() == []
