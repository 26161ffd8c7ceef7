"""Whether a lost child's backend can resume it: one line saying why not, per backend."""

from pathlib import Path

import pytest

from orchestrator.core._revive import Revival, why_not


def _revival(backend: str, resume: str, surface: str = "process") -> Revival:
    return Revival(
        key="a1",
        name="n",
        agent="scout",
        mode="scout",
        task="t",
        backend=backend,
        surface=surface,
        loadout={"resume": resume},
    )


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}\n")
    return path


@pytest.mark.parametrize(
    ("backend", "made", "resume", "reason"),
    [
        ("builtin", "transcript.json", "{scratch}/transcript.json", ""),
        (
            "builtin",
            None,
            "{scratch}/transcript.json",
            "its transcript {scratch}/transcript.json is gone",
        ),
        ("builtin", None, "", "its transcript (none) is gone"),
        ("pi", "pi-session.jsonl", "{scratch}/pi-session.jsonl", ""),
        ("pi", None, "{scratch}/pi-session.jsonl", "its Pi session file"),
        ("claude", "claude/home/.claude/projects/-repo/u-1.jsonl", "u-1", ""),
        (
            "claude",
            "claude/home/.claude/projects/-repo/u-2.jsonl",
            "u-1",
            "its Claude Code session u-1 is not in",
        ),
        ("codex", "codex/config/codex/sessions/2026/12/03/rollout-x-t-9.jsonl", "t-9", ""),
        ("codex", None, "t-9", "its Codex thread t-9 is not in"),
        ("command", None, "", "the command backend cannot be revived"),
    ],
)
def test_each_backend_says_whether_it_can_resume(tmp_path, backend, made, resume, reason):
    scratch = tmp_path / "a1"
    if made:
        _touch(scratch / made)
    found = why_not(_revival(backend, resume.format(scratch=scratch)), scratch)
    assert (found == "") == (reason == "")
    assert reason.format(scratch=scratch) in found
    assert "\n" not in found


def test_a_child_on_a_remote_node_is_not_revived(tmp_path):
    _touch(tmp_path / "transcript.json")
    revival = _revival("builtin", str(tmp_path / "transcript.json"), surface="ray")
    assert why_not(revival, tmp_path) == "a child on a ray node cannot be revived yet"
