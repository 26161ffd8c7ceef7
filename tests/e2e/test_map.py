"""``fleet map`` end to end: 200 scripted scouts over a real git repository through the real CLI
and supervisor; a supervisor SIGKILLed mid-map and ``--resume`` finishing exactly the rest."""

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Fleet

pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]

ROWS = 200
REPEATS = 20
SCRIPT = """\
turns:
  - steps:
      - reply: "{{task}}"
"""


def work_list(path: Path) -> Path:
    """200 distinct files plus 20 repeats (rows 201..220 repeat rows 1..20)."""
    rows = [{"file": f"src/f{i:03}.py", "n": i} for i in range(ROWS)]
    rows += [{"file": f"src/f{i:03}.py", "n": 1000 + i} for i in range(REPEATS)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def outcomes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def map_args(fleet: Fleet, rows: Path, out: Path) -> list[str]:
    model = fleet.script("row", SCRIPT)
    return ["map", str(rows), "row {n}: {file}", "--model", model, "--dedupe-key", "file"]


def test_a_200_row_map_gives_every_row_one_result_and_drops_repeats(fleet: Fleet, tmp_path):
    out = tmp_path / "out.jsonl"
    rows = work_list(tmp_path / "rows.jsonl")
    args = [*map_args(fleet, rows, out), "--out", str(out), "--max-subagents", "8", "--lane", "6"]
    data = fleet.json(*args, timeout=600)
    assert (data["state"], data["total"], data["done"], data["failed"]) == ("done", 200, 200, 0)
    assert data["dropped"] == REPEATS
    written = outcomes(out)
    assert sorted(o["row"] for o in written) == list(range(1, ROWS + 1))
    for entry in written:
        n = entry["row"] - 1
        # Each row's answer is its own task: a fresh child per row, no leak from the last one.
        assert entry["result"] == f"row {n}: src/f{n:03}.py"
        assert entry["key"] == f"src/f{n:03}.py"
        assert entry["status"] == "done"
        assert entry["usage"]["tokens"] > 0
    # The rows never reached the parent's notes, and no row's child is left.
    peek = fleet.json("peek")
    assert peek["agents"] == []


def test_a_missing_column_is_a_usage_error_naming_it_and_nothing_runs(fleet: Fleet, tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text("file,n\na.py,1\nb.py,2\n")
    result = fleet.run("map", str(rows), "look at {path}", "--json")
    assert result.returncode == 2
    line = "fleet map: row 1 has no column 'path' (the task template uses {path}; "
    assert result.stderr.strip().splitlines() == [line + "the row has 'file', 'n')"]
    assert not (fleet.home / "sessions" / "t" / "maps").exists() or not list(
        (fleet.home / "sessions" / "t" / "maps").iterdir()
    )


def test_a_sigkilled_supervisor_resumes_exactly_the_missing_rows(fleet: Fleet, tmp_path):
    out = tmp_path / "out.jsonl"
    rows = work_list(tmp_path / "rows.jsonl")
    args = [*map_args(fleet, rows, out), "--out", str(out), "--json"]
    follower = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=fleet.repo,
        env=fleet.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lock = fleet.home / "sessions" / "t" / "supervisor.lock"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if out.exists() and len(outcomes(out)) >= 30:
            break
        time.sleep(0.05)
    else:
        follower.kill()
        pytest.fail("the map made no progress")
    os.kill(int(lock.read_text().strip()), signal.SIGKILL)
    _, stderr = follower.communicate(timeout=60)
    assert follower.returncode == 5, stderr
    before = {o["row"] for o in outcomes(out)}
    assert 30 <= len(before) < ROWS

    data = fleet.json("map", "--resume", "m1", timeout=600)
    assert (data["state"], data["done"], data["failed"]) == ("done", 200, 0)
    assert data["resumed"] >= len(before)
    written = outcomes(out)
    counts = collections.Counter(o["row"] for o in written)
    assert sorted(counts) == list(range(1, ROWS + 1))
    assert set(counts.values()) == {1}, "a row completed twice"
    ledger = fleet.home / "sessions" / "t" / "maps" / "m1.jsonl"
    events = [json.loads(line) for line in fleet.run("events", "--json").stdout.splitlines()]
    maps = [(e["key"], e["action"], e["ledger"]) for e in events if e["kind"] == "map"]
    assert maps == [("m1", "start", str(ledger)), ("m1", "resume", str(ledger))]
    finished = collections.Counter(
        r["row"] for r in map(json.loads, ledger.read_text().splitlines()) if r["kind"] == "row"
    )
    assert set(finished.values()) == {1}
    assert len(finished) == ROWS


def test_a_row_past_its_runtime_cap_is_stopped_retried_and_failed_with_its_handoff(
    fleet: Fleet, tmp_path
):
    out = tmp_path / "out.jsonl"
    rows = tmp_path / "rows.csv"
    rows.write_text("kind\nslow\nfast\n")
    model = fleet.script("row", "turns:\n  - steps:\n      - hang: true\n")
    result = fleet.run(
        "map",
        str(rows),
        "be {kind}",
        "--model",
        model,
        "--max-runtime",
        "2",
        "--retries",
        "1",
        "--out",
        str(out),
        "--json",
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert (data["state"], data["done"], data["failed"]) == ("done", 0, 2)
    for entry in outcomes(out):
        assert entry["status"] == "failed"
        assert entry["error"] == "stopped at its runtime cap of 2 s"
        assert entry["attempts"] == 2
        assert entry["handoff"]["state"] == "stopped"
        assert entry["handoff"]["task"].startswith("be ")
    assert fleet.json("peek")["agents"] == []


def test_a_checked_map_writes_each_rows_validated_result(fleet: Fleet, tmp_path):
    out = tmp_path / "out.jsonl"
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"f": "a"}\n{"f": "b"}\n')
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "required": ["ok"]}))
    model = fleet.script(
        "row", 'turns:\n  - steps:\n      - reply: "ok\\n```json\\n{\\"ok\\": true}\\n```"\n'
    )
    data = fleet.json(
        "map",
        str(rows),
        "check {f}",
        "--model",
        model,
        "--schema",
        str(schema),
        "--out",
        str(out),
        timeout=120,
    )
    assert (data["done"], data["failed"]) == (2, 0)
    assert [o["result"] for o in outcomes(out)] == [{"ok": True}, {"ok": True}]
