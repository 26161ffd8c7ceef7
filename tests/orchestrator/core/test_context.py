"""What the supervisor does with what a remote child's node sends at a turn end: keeps it in
the child's own place, or, over the cap or not a context, keeps nothing and says why once."""

from pathlib import Path
from typing import Any, cast

import pytest

from orchestrator.core._context import fetch_context, keep_sent, kept_context, refusal
from orchestrator.core._revive import Revival, why_not
from orchestrator.governance._diagnostics import RunLog
from orchestrator.launch._context import over


class _Node:
    """What a child's node answers (``LaunchedRay.context``): files, a refusal, or a failure."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def context(self, backend: str, resume: str) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def _fetch(place: Path, answer: Any, log: RunLog, backend: str = "builtin") -> None:
    node = cast("Any", _Node(answer))
    await fetch_context(place, node, backend, "", log=log, ended=lambda: False)


def _revival(place: Path) -> Revival:
    return Revival(
        key="a1",
        name="n",
        agent="scout",
        mode="scout",
        task="t",
        backend="builtin",
        surface="ray",
        loadout={"resume": str(place / "transcript.json")},
    )


@pytest.fixture
def log(tmp_path: Path) -> RunLog:
    (tmp_path / "logs").mkdir()
    return RunLog(tmp_path / "logs" / "a1.log", secrets=[], transport="ray")


async def test_a_turn_ends_context_is_kept_replaced_and_refused_in_one_line(
    tmp_path: Path, log: RunLog
) -> None:
    place = tmp_path / "scratch" / "a1"
    await _fetch(place, {"transcript.json": b"[1]"}, log)
    assert (place / "transcript.json").read_bytes() == b"[1]"
    assert why_not(_revival(place), place) == ""
    # A node that cannot answer (lost, slow) leaves the last copy as it was.
    await _fetch(place, RuntimeError("the actor died"), log)
    assert (place / "transcript.json").read_bytes() == b"[1]"
    # Names no backend makes: nothing of them is written, and the child is not revivable.
    await _fetch(place, {"transcript.json": b"[2]", "../../planted": b"x"}, log)
    assert not (tmp_path / "planted").exists()
    assert not (place / "transcript.json").exists()
    assert "is not a context file" in refusal(place)
    # Over the cap on its node: one line, in the run log and in revive's refusal.
    await _fetch(place, over(64), log)
    line = f"{over(64)}; it cannot be revived"
    assert why_not(_revival(place), place) == line
    log.flush()
    text = (tmp_path / "logs" / "a1.log").read_text()
    assert f"context not kept: {line}" in text
    assert "context not fetched from its node: RuntimeError: the actor died" in text
    # A later turn end within the cap makes it revivable again.
    await _fetch(place, {"transcript.json": b"[3]"}, log)
    assert why_not(_revival(place), place) == ""
    assert not (place / "context-refused").exists()


async def test_a_context_sent_with_the_settled_is_kept_as_a_fetched_one_and_checked_alike(
    tmp_path: Path, log: RunLog
) -> None:
    """What a child sends with its ``Settled`` is its own scratch's, as a fetch reads it: kept
    the same way, and held to the same names and caps; what is not text is refused in one
    line (the child can cost only itself its revive)."""
    place = tmp_path / "scratch" / "a1"

    async def sent(files: dict[str, Any], backend: str = "builtin") -> None:
        await keep_sent(place, files, backend, "", log=log, ended=lambda: False)

    await sent({"transcript.json": '{"version": 1}'})
    assert (place / "transcript.json").read_bytes() == b'{"version": 1}'
    assert why_not(_revival(place), place) == ""
    await sent({"transcript.json": "[2]", "../../planted": "x"})
    assert not (tmp_path / "planted").exists()
    assert "is not a context file" in refusal(place)
    await sent({"transcript.json": "[3]"})
    assert why_not(_revival(place), place) == ""
    for hostile in ({"transcript.json": 3}, {"transcript.json": "\ud800"}):
        await sent(hostile)
        assert refusal(place) == "its context's 'transcript.json' is not text; it cannot be revived"
        assert not (place / "transcript.json").exists()
    await sent({"transcript.json": "[4]"}, backend="codex")  # no thread id: nothing it resumes
    assert not (place / "transcript.json").exists()
    await keep_sent(place, {"transcript.json": "[5]"}, "builtin", "", log=log, ended=lambda: True)
    assert not (place / "transcript.json").exists()  # the child is ending: its place goes


async def test_a_revived_pi_or_claude_session_is_filed_for_its_new_checkout(
    tmp_path: Path, log: RunLog
) -> None:
    place = tmp_path / "a1"
    header = b'{"type":"session","id":"s","cwd":"/tmp/old/checkout"}\n{"type":"message"}\n'
    await _fetch(place, {"pi-session.jsonl": header}, log, backend="pi")
    [(name, data)] = kept_context(place, "pi", "", "/tmp/new/checkout").items()
    assert name == "pi-session.jsonl"
    assert data == b'{"type":"session","id":"s","cwd":"/tmp/new/checkout"}\n{"type":"message"}\n'
    claude = tmp_path / "c1"
    session = "claude/home/.claude/projects/-tmp-old-checkout/u-1.jsonl"
    node = cast("Any", _Node({session: b"{}\n"}))
    await fetch_context(claude, node, "claude", "u-1", log=log, ended=lambda: False)
    assert kept_context(claude, "claude", "u-1", "/tmp/new/checkout") == {
        session: b"{}\n",
        "claude/home/.claude/projects/-tmp-new-checkout/u-1.jsonl": b"{}\n",
    }
    # Revived before: the session is under two projects, the newer (longer) one goes on.
    newer = "claude/home/.claude/projects/-tmp-new-checkout/u-1.jsonl"
    node = cast("Any", _Node({session: b"{}\n", newer: b"{}\n{}\n"}))
    await fetch_context(claude, node, "claude", "u-1", log=log, ended=lambda: False)
    moved = kept_context(claude, "claude", "u-1", "/tmp/third")
    assert moved["claude/home/.claude/projects/-tmp-third/u-1.jsonl"] == b"{}\n{}\n"
