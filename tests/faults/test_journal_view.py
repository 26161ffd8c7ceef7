"""The session journal is the supervisor's only record of the fleet (issue 17 item 4).

Real ``fleet serve`` daemons through the real CLI: a worker's copy-back is refused (the parent
drifted), its supervisor is SIGKILLed, and the next supervisor adopts the kept worktree from
the journal alone; ``fleet stop`` copies it back, and a third supervisor does not adopt it
again. A clean stop writes no registry file and ends the journal with a ``shutdown`` record (the
next supervisor says "stopped"); a torn last journal line loses nothing before it.
"""

import json
import os
import signal
import time
from typing import Any

import pytest

from orchestrator.durability import fold, last_supervisor, parse_journal

pytestmark = pytest.mark.slow

WRITER = """
turns:
  - steps:
      - tool: edit
        args: {path: src/app.py, old_text: "return 42", new_text: "return 43"}
      - reply: "changed app.py"
"""


def _json(faults, *args: str, code: int = 0) -> dict[str, Any]:
    result = faults.cli(*args, "--json")
    assert result.returncode == code, (result.stderr, result.stdout)
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _kill_daemon(faults) -> int:
    session = faults.home / "sessions" / "t"
    time.sleep(0.5)  # the journal is flushed at once after a durable record
    daemon = int((session / "supervisor.lock").read_text().strip())
    os.kill(daemon, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while faults.processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert faults.processes() == []
    return daemon


def _refused_copy_back(faults) -> None:
    """a1, a worker whose stop conflicted with the parent's drift: its worktree is kept."""
    model = faults.script("writer", WRITER)
    _json(faults, "spawn", "--agent", "worker", "--model", model, "bump the answer")
    _json(faults, "wait", "a1", "--timeout", "60")
    (faults.repo / "src" / "app.py").write_text("def main():\n    return 99\n")
    [handoff] = _json(faults, "stop", "a1", code=1)["handoffs"]
    assert [c["path"] for c in handoff["conflicts"]] == ["src/app.py"]
    assert handoff["remaining"]


def test_a_refused_copy_back_is_adopted_once_and_resolved_for_good(faults) -> None:
    session = faults.home / "sessions" / "t"
    worktree = session / "worktrees" / "a1"
    _refused_copy_back(faults)
    daemon = _kill_daemon(faults)
    assert not (session / "registry.json").exists()
    assert worktree.is_dir()

    first = faults.cli("peek", "--json")
    assert first.returncode == 0, first.stderr
    [warning] = first.stderr.strip().splitlines()
    assert f"(pid {daemon}) died" in warning, warning
    assert "a1 (worker, stopped)" in warning, warning
    assert "the worktrees of a1 are kept" in warning, warning
    [stale] = json.loads(first.stdout)["stale"]
    assert stale["key"] == "a1", stale
    assert stale["recoverable"] is True, stale
    assert stale["worktree"] == str(worktree)
    assert stale["running"] is False

    (faults.repo / "src" / "app.py").write_text("def main():\n    return 42\n")  # resolved
    # An adopted child is a FAILED record (its supervisor died), so stop exits 1 as ever.
    [handoff] = _json(faults, "stop", "a1", code=1)["handoffs"]
    assert handoff["conflicts"] == [], handoff
    assert handoff["remaining"] == [], handoff
    assert handoff["applied"] == ["src/app.py"], handoff
    assert (faults.repo / "src" / "app.py").read_text() == "def main():\n    return 43\n"
    assert not worktree.exists()
    records = parse_journal((session / "journal.jsonl").read_bytes()).records
    assert [r.kind for r in records if r.key == "a1"][-1] == "resolved"
    assert fold(records)["a1"].keep is False

    _kill_daemon(faults)
    third = faults.cli("peek", "--json")
    assert third.returncode == 0, third.stderr
    assert third.stderr == ""  # nothing left to report: the worktree was resolved
    assert json.loads(third.stdout)["stale"] == []
    spawned = _json(faults, "spawn", "--model", faults.script("writer", WRITER), "again")
    assert spawned["agents"][0]["key"] == "a2"  # keys go on after the journal's


def test_a_clean_stop_writes_no_registry_and_the_journal_says_stopped(faults) -> None:
    session = faults.home / "sessions" / "t"
    _refused_copy_back(faults)
    daemon = int((session / "supervisor.lock").read_text().strip())
    stopped = faults.cli("serve", "--stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not (session / "registry.json").exists()
    records = parse_journal((session / "journal.jsonl").read_bytes()).records
    last = last_supervisor(records)
    assert last is not None
    assert last.kind == "shutdown", last
    assert last.fields["pid"] == daemon
    assert last.fields["clean"] is True

    again = faults.cli("peek", "--json")
    assert again.returncode == 0, again.stderr
    [warning] = again.stderr.strip().splitlines()
    assert f"(pid {daemon}) stopped" in warning, warning
    assert "the worktrees of a1 are kept" in warning, warning


def test_a_torn_journal_line_loses_nothing_before_it(faults) -> None:
    session = faults.home / "sessions" / "t"
    _refused_copy_back(faults)
    daemon = _kill_daemon(faults)
    with (session / "journal.jsonl").open("ab") as journal:
        journal.write(b'{"v": 1, "seq": 99999, "at": 1.0, "kind": "resol')  # a write cut short

    first = faults.cli("peek", "--json")
    assert first.returncode == 0, first.stderr
    lines = first.stderr.strip().splitlines()
    assert any("the last line is torn" in line for line in lines), lines
    [warning] = [line for line in lines if "previous supervisor" in line]
    assert f"(pid {daemon}) died" in warning, warning
    assert "the worktrees of a1 are kept" in warning, warning
    [stale] = json.loads(first.stdout)["stale"]
    assert stale["key"] == "a1"
    assert stale["recoverable"] is True
