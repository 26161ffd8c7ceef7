"""A full state directory costs an operation, never the fleet (containment issue, item 7).

``FLEET_HOME`` is a small tmpfs the test mounts and then fills. A spawn, which needs space for
its loadout, log and scratch, is refused with one line naming the directory; the supervisor and
its running child keep serving; and once space returns the session journal on disk describes
the fleet as it is now, not as it was when the disk filled.
"""

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.durability import ChildFacts, fold, parse_journal
from tests.e2e.conftest import GIT_ENV, Fleet, fleet_processes, make_repo

pytestmark = pytest.mark.slow


class _Filler:
    """The filesystem of a directory filled to the last byte and the last inode: a spawn's
    loadout is a memfd now, but its scratch directory and log still need room."""

    def __init__(self, directory: Path) -> None:
        self.root = directory / "filler"
        self.root.mkdir()
        fd = os.open(self.root / "bytes", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for size in (1 << 16, 1 << 10, 1):
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * size)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            for n in range(1 << 20):
                (self.root / f"i{n}").touch()

    def unlink(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _fill(directory: Path) -> _Filler:
    return _Filler(directory)


@pytest.fixture
def tmpfs_fleet(tmp_path: Path) -> Iterator[Fleet]:
    home = Path(tempfile.mkdtemp(prefix="flf-full-", dir="/tmp"))
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=4096,mode=0700", "tmpfs", str(home)],
        check=True,
    )
    env = {**os.environ, **GIT_ENV, "FLEET_HOME": str(home), "FLEET_SESSION": "t"}
    env.pop("FLEET_MODEL", None)
    env["FLEET_SANDBOX"] = "off"  # this is about space, not confinement: keep it quick
    env["FLEET_ALLOW_UNSANDBOXED"] = "1"
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    fleet = Fleet(repo=make_repo(tmp_path / "repo"), home=home, scripts=scripts, env=env)
    try:
        yield fleet
    finally:
        shutil.rmtree(home / "filler", ignore_errors=True)
        fleet.run("serve", "--stop", timeout=90)
        deadline = time.monotonic() + 15
        while fleet_processes(home) and time.monotonic() < deadline:
            time.sleep(0.1)
        leftovers = fleet_processes(home)
        for process in leftovers:
            process.kill()
        subprocess.run(["umount", "-l", str(home)], check=False)
        with contextlib.suppress(OSError):
            home.rmdir()
        assert not leftovers, f"fleet processes survived the test: {leftovers}"


def _live(fleet: Fleet) -> list[ChildFacts]:
    """The children the journal on disk says are live, in spawn order (what a later
    supervisor would find)."""
    data = (fleet.home / "sessions" / "t" / "journal.jsonl").read_bytes()
    return [f for f in fold(parse_journal(data).records).values() if not f.ended]


def _journal_pid(fleet: Fleet, key: str) -> int:
    [child] = [c for c in _live(fleet) if c.key == key]
    assert child.pid is not None
    return child.pid


def _until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_full_state_directory_refuses_a_spawn_and_the_fleet_keeps_serving(tmpfs_fleet):
    fleet = tmpfs_fleet
    echo = shlex.join([sys.executable, "-c", "print('echo ' + input())"])
    spawn = ["spawn", "--backend", "command", "--command", echo, "--allow-unsandboxed"]
    [child] = fleet.json(*spawn, "first")["agents"]
    key = child["key"]
    [note] = fleet.json("wait", key, "--timeout", "60")["settled"]
    assert note["report"].strip() == "echo first"
    sleeper = shlex.join([sys.executable, "-c", "import time; time.sleep(120)"])
    [doomed] = fleet.json(*spawn[:4], sleeper, *spawn[5:], "doomed")["agents"]
    _until(lambda: [c.state for c in _live(fleet)] == ["idle", "working"])
    _until(lambda: _live(fleet)[1].pid is not None)

    filler = _fill(fleet.home)
    refused = fleet.run(*spawn, "second", "--json")
    assert refused.returncode == 1, refused
    [line] = refused.stderr.splitlines()
    assert str(fleet.home) in line, line
    assert "no space left" in line.lower(), line
    error = json.loads(refused.stdout)["error"]
    assert error["kind"] != "internal", error
    # A child that fails now has its failure logged where it can be (the log file cannot
    # grow): the run ends as failed, the supervisor goes on.
    os.kill(_journal_pid(fleet, doomed["key"]), signal.SIGKILL)
    result = fleet.run("wait", doomed["key"], "--timeout", "60", "--json")
    [note] = json.loads(result.stdout)["settled"]
    assert note["state"] == "failed", note
    assert note["failure"]["kind"] == "killed", note
    # The supervisor and the running child keep serving while the disk is full.
    assert [a["key"] for a in fleet.json("peek")["agents"]] == [key]
    fleet.json("resume", key, "again")
    [note] = fleet.json("wait", key, "--timeout", "60")["settled"]
    assert note["report"].strip() == "echo again"
    # A change the journal cannot write while the disk is full: the child is stopped.
    [handoff] = fleet.json("stop", key)["handoffs"]
    assert handoff["state"] == "stopped"
    time.sleep(0.6)
    # (An append may still fit in the journal file's last page while the disk is full, so
    # whether the records above are on disk yet is not asserted; that they get there is.)

    filler.unlink()  # space returns: the journal catches up without another change
    _until(lambda: _live(fleet) == [])
    [again] = fleet.json(*spawn, "third")["agents"]
    [note] = fleet.json("wait", again["key"], "--timeout", "60")["settled"]
    assert note["report"].strip() == "echo third"
    _until(lambda: [c.key for c in _live(fleet)] == [again["key"]])
