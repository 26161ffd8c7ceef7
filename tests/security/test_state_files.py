"""A hostile sandboxed child against the supervisor's state: the session journal (every child's
facts, resume ids, usage and budget spend), the discussion paper, the control token and the
daemon's own memory, through the real ``fleet`` CLI (``fleet serve`` keeps the real journal).

The child is a ``command``-backend worker (writable worktree: the widest sandbox a child gets)
running :data:`PAYLOAD`: it guesses every path it could (``$FLEET_HOME`` and the session
directory by name, ``/proc/<daemon pid>/…``), walks every descriptor it holds or can see
(``/proc/*/fd``) and its environment, and tries to read and to append to each. Its findings go
to its worktree, where the test reads them on the host, which it checks too: nothing the
child wrote reached the real files, the journal's spend was not changed by it, and nothing it
saw carries a secret.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import Fleet, fleet_processes, running_fleet

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]

MARK = "HOSTILE-MARK-7f3a"

PAYLOAD = r"""
import json, os, stat, sys
targets, out = json.loads(sys.argv[1]), {"read": {}, "wrote": {}, "fds": {}, "env": {}}
for path in [os.path.expandvars(t) for t in targets]:
    try:
        with open(path, "rb") as f:
            out["read"][path] = "ok:" + f.read(4096).decode(errors="replace")
    except OSError as exc:
        out["read"][path] = type(exc).__name__
    try:
        with open(path, "a") as f:
            f.write('{"kind": "usage", "cost": -1000, "mark": "%s"}\n' % sys.argv[2][::-1])
        out["wrote"][path] = "ok"
    except OSError as exc:
        out["wrote"][path] = type(exc).__name__
for pid in [p for p in os.listdir("/proc") if p.isdigit()] + ["self"]:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in names:
        link = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(link)
        except OSError as exc:
            target = type(exc).__name__
        text = ""
        if target.startswith("/") or target.startswith("memfd:"):
            # Regular files only, never blocking: run on the host, another test's tmux server
            # holds /dev/ptmx, whose read waits forever.
            try:
                fd = os.open(link, os.O_RDONLY | os.O_NONBLOCK)
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        text = os.read(fd, 65536).decode(errors="replace")
                finally:
                    os.close(fd)
            except OSError as exc:
                text = type(exc).__name__
        out["fds"][link] = [target, text]
out["env"] = dict(os.environ)
with open("state-probe.json", "w") as f:
    json.dump(out, f)
print("probed")
"""


def daemon_pid(fleet: Fleet) -> int:
    """The supervisor's pid: the fleet process whose parent is none of the fleet's."""
    mine = {p.pid: p for p in fleet_processes(fleet.home)}
    [daemon] = [p for p in mine.values() if p.ppid() not in mine]
    return int(daemon.pid)


def test_a_hostile_worker_can_neither_read_nor_write_the_journal_paper_or_spend(
    tmp_path: Path,
) -> None:
    with running_fleet(tmp_path, prefix="fls-") as fleet:
        session = fleet.home / "sessions" / "t"
        honest = fleet.script(
            "honest",
            """
            turns:
              - steps:
                  - tool: read
                    args: {path: README.md}
                  - reply: "## Summary\\nread it"
            """,
        )
        fleet.json("spawn", "--model", honest, "read the readme")
        fleet.json("wait", "a1", "--timeout", "60", timeout=90)
        fleet.json("discuss", "ask", "which database, and why?")
        journal, paper = session / "journal.jsonl", session / "paper.json"
        assert journal.exists(), sorted(os.listdir(session))
        assert paper.exists(), sorted(os.listdir(session))
        token = (fleet.paths.control_token).read_text().strip()
        paper_before = paper.read_bytes()
        spend_before = fleet.json("peek")
        pid = daemon_pid(fleet)

        guessed = [
            str(journal),
            str(paper),
            str(fleet.paths.control_token),
            str(session / "supervisor.log"),
            str(session / "logs" / "a1.log"),
            f"/proc/{pid}/environ",
            f"/proc/{pid}/mem",
            f"/proc/{pid}/maps",
            f"/proc/{pid}/cmdline",
            f"/proc/{pid}/fd/0",
            "$FLEET_HOME/sessions/t/journal.jsonl",  # as the child's own environment says
            "$FLEET_HOME/sessions/t/paper.json",
        ]
        (fleet.repo / "probe.py").write_text(PAYLOAD)
        command = f"{sys.executable} probe.py {shlex.quote(json.dumps(guessed))} {MARK[::-1]}"
        [hostile] = fleet.json(
            "spawn", "--agent", "worker", "--backend", "command", "--command", command, "probe"
        )["agents"]
        [note] = fleet.json("wait", hostile["key"], "--timeout", "60", timeout=90)["settled"]
        assert "probed" in note["report"], note
        [peeked] = fleet.json("peek", hostile["key"])["agents"]
        assert peeked["sandboxed"] is True, peeked
        # Its worktree, on the host (wherever the session keeps worktrees).
        [probe] = fleet.home.glob("**/state-probe.json")
        found: dict[str, Any] = json.loads(probe.read_text())
        secrets = {
            "control token": token,
            "journal": journal.read_text()[:200],
            "paper": paper_before.decode()[:200],
        }

        # Nothing guessed was readable, whatever its name.
        # (A path read twice may hold what the child itself appended, in its own tmpfs.)
        for path, result in found["read"].items():
            own = result.startswith("ok:") and all(MARK in line for line in result[3:].splitlines())
            assert own or not result.startswith("ok"), (path, result[:200])
        # Every descriptor the child holds or sees is its own: pipes, sockets, /dev/null, its
        # worktree, its scratch and interpreter; never a state file.
        for link, (target, text) in found["fds"].items():
            for word in ("journal", "paper", "control", "tmux", "supervisor", "loadouts"):
                assert word not in target, (link, target)
            for name, secret in secrets.items():
                assert secret not in text, (link, target, name)
        assert found["fds"], "the child saw no descriptor at all (the probe did not run)"
        # Its environment names no state file and holds no secret of the fleet. (The rest
        # of the parent's environment is passed on by design: an agent CLI needs its own.)
        for name, value in found["env"].items():
            assert token not in value, name
            for state in (journal, paper, fleet.paths.control_token, fleet.paths.control_socket):
                assert str(state) not in value, (name, value)

        time.sleep(1)  # anything the child managed to append would be flushed by now
        assert MARK not in journal.read_text(), "the child wrote the journal"
        assert paper.read_bytes() == paper_before, "the child changed the paper"
        assert MARK not in (fleet.paths.control_token).read_text()
        # Its own spend is what the fleet metered, not what it tried to append.
        usage = fleet.json("peek")["usage"]
        assert usage.pop("children") == spend_before["usage"].pop("children") + 1
        # It is one more spawn and turn of the session (the session's caps count them).
        for counted in ("spawns", "turns"):
            assert usage.pop(counted) == spend_before["usage"].pop(counted) + 1
        assert usage == spend_before["usage"]
        fleet.json("stop", hostile["key"], timeout=90)


def test_the_payload_does_find_a_readable_journal_when_one_is_in_view(tmp_path: Path) -> None:
    # The probe's own check: run unsandboxed on the host, it reads and appends a journal it is
    # shown, and reports each of its descriptors; so the sandboxed run above can fail.
    journal = tmp_path / "journal.jsonl"
    journal.write_text('{"v": 1}\n')
    out = tmp_path / "w"
    out.mkdir()
    subprocess.run(
        [sys.executable, "-c", PAYLOAD, json.dumps([str(journal)]), MARK[::-1]],
        cwd=out,
        check=True,
        capture_output=True,
    )
    found = json.loads((out / "state-probe.json").read_text())
    assert found["read"][str(journal)].startswith("ok:")
    assert found["wrote"][str(journal)] == "ok"
    assert MARK in journal.read_text()
    assert any(t == "/dev/null" or t.startswith(("pipe:", "/")) for t, _ in found["fds"].values())
