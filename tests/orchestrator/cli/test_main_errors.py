"""The CLI's exit codes and ``--json`` errors for what argparse refuses, and ``stop``'s code."""

import json
from typing import Any

import pytest

from orchestrator.cli import _drive, _main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        _main.main(list(argv))
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out, captured.err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["wait", "a1", "--timeout", "soon", "--json"], "--timeout"),
        (["spawn", "--mode", "bogus", "--json", "task"], "--mode"),
        (["frobnicate", "--json"], "frobnicate"),
        (["--json", "frobnicate"], "frobnicate"),
    ],
    ids=["timeout", "mode", "unknown-verb", "json-first"],
)
def test_an_argument_error_with_json_prints_the_json_error_and_exits_2(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    error = json.loads(out)["error"]
    assert error["kind"] == "usage"
    assert needle in error["message"]
    [line] = err.splitlines()
    assert line.startswith("fleet ")
    assert needle in line


def test_an_argument_error_without_json_is_one_stderr_line(capsys):
    code, out, err = _run(capsys, "wait", "a1", "--timeout", "soon")
    assert (code, out) == (2, "")
    [line] = err.splitlines()
    assert line.startswith("fleet wait: ")
    assert line.endswith("(see fleet wait --help)")


def _handoff(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "key": "a1",
        "name": "worker-1",
        "state": "stopped",
        "task": "t",
        "workspace": "/w",
    }
    base.update({"changed": [], "applied": [], "remaining": [], "conflicts": [], "last": ""})
    return {**base, "error": "", **fields}


@pytest.mark.parametrize(
    ("handoff", "code"),
    [
        (_handoff(), 0),
        # A stopped read-only child whose last turn had failed: nothing to copy back.
        (_handoff(error="turn failed: model unreachable"), 0),
        (_handoff(state="failed"), 1),
        (_handoff(conflicts=[{"path": "a", "reason": "changed"}]), 1),
        # Copy-back failed: the handoff carries the error, nothing was applied, the worktree
        # is kept.
        (
            _handoff(
                changed=["src/app.py"],
                error="copy-back failed: disk full",
                remaining=["worktree kept at /w"],
            ),
            1,
        ),
    ],
    ids=["clean", "old-turn-error", "failed", "conflicts", "copy-back-failed"],
)
def test_stop_exits_1_when_a_handoff_did_not_resolve(monkeypatch, capsys, handoff, code):
    monkeypatch.setattr(_drive, "call", lambda *_: {"handoffs": [handoff]})
    got, out, _err = _run(capsys, "stop", "a1", "--json")
    assert got == code
    assert json.loads(out)["handoffs"] == [handoff]


def _note(**fields: Any) -> dict[str, Any]:
    base = {"key": "a1", "name": "scout-1", "state": "idle", "peek": "a1 scout-1 done"}
    return {**base, "report": "", "error": "", **fields}


@pytest.mark.parametrize(
    ("note", "code"),
    [
        (_note(report="## Summary"), 0),
        (_note(error="model unreachable: connection refused"), 1),
        (_note(state="failed", error="killed"), 1),
        (_note(state="waiting", question={"id": "q1", "text": "which?"}), 0),
    ],
    ids=["settled", "turn-failed", "failed", "question"],
)
@pytest.mark.parametrize(
    "argv", [["wait", "a1"], ["spawn", "--wait", "look"]], ids=["wait", "spawn"]
)
def test_wait_exits_1_when_a_returned_turn_failed(monkeypatch, capsys, note, code, argv):
    def call(args: Any, op: str, payload: Any) -> dict[str, Any]:
        if op == "spawn":
            return {"agents": [{"key": "a1"}]}
        return {"settled": [note]}

    monkeypatch.setattr(_drive, "call", call)
    assert _run(capsys, *argv, "--json")[0] == code
    got, out, _err = _run(capsys, *argv)
    assert got == code
    if note["error"]:
        assert f"error: {note['error']}" in out
