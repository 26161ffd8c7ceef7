"""``fleet bench`` runs end to end on this machine and prints the shape it promises."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

NAMES = {
    "peek --json",
    "wait --timeout 0",
    "spawn→settled, forked",
    "spawn→settled, sandboxed",
    "idle child RSS, forked",
    "idle child RSS, sandboxed",
    "ipc round trips",
}


def fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_bench_json_has_every_figure_beside_its_floor(tmp_path):
    result = fleet("bench", "--json", "--runs", "1", "--spawns", "1")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.splitlines()[-1])
    assert data["benchmark"] == "fleet_bench"
    assert (data["runs"], data["spawns"]) == (1, 1)
    assert len(data["load"]) == 3
    assert {f["name"] for f in data["figures"]} == NAMES
    for f in data["figures"]:
        assert f["value"] > 0, f
        assert f["floor"] > 0, f
        assert f["ratio"] == pytest.approx(f["value"] / f["floor"], rel=0.02)
        low, high = f["spread"]
        assert low <= f["value"] <= high
        assert f["unit"] in {"ms", "MB", "/s"}
        assert f["floor_name"]


def test_bench_human_table_names_the_load():
    result = fleet("bench", "--runs", "1", "--spawns", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split()[:2] == ["figure", "p50"]
    assert "load average" in result.stdout.splitlines()[-1]


@pytest.mark.parametrize("args", [["--runs", "0"], ["--spawns", "5"]])
def test_bench_refuses_bad_counts_in_one_line(args):
    result = fleet("bench", *args)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "bench:" in result.stderr
