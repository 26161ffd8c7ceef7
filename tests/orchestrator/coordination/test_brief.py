"""The moderator brief: its layout, its 2000-character bound, and what it reads from a fleet."""

import re
import shutil
import tempfile
from pathlib import Path

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._config import Config
from orchestrator._records import ChildRecord, State
from orchestrator.coordination._brief import LIMIT, MODERATOR, Facts, render
from orchestrator.core._supervisor import SpawnRequest, open_supervisor


def _record(n: int, *, state=State.IDLE, activity="idle", workspace="/repo", question=None):
    record = ChildRecord(
        key=f"a{n}",
        name=f"scout-{n}",
        agent="scout",
        mode="scout",
        task="look",
        workspace=workspace,
        backend="builtin",
    )
    record.state = state
    record.activity = activity
    record.question = question
    return record


def _facts(children=(), **overrides) -> Facts:
    fields = {
        "mode": "build",
        "used": len(children),
        "cap": 4,
        "working": 0,
        "lane": 3,
        "queued": 0,
        "workspace": "/repo",
        "children": tuple(children),
        "questions": (),
        "unread": (),
        "unresolved": (),
        "paper": "",
    }
    return Facts(**{**fields, **overrides})


def test_without_a_fleet_the_brief_is_the_session_line_and_the_moderator_paragraph():
    text = render(_facts())
    assert text.split("\n") == [
        (
            "You moderate a fleet: mode build, 0/4 children, 0/3 working, 0 queued; workspace "
            "/repo unless a child line says otherwise."
        ),
        MODERATOR,
    ]
    for duty in ("decompose", "route", "fleet peek", "fleet steer", "Never redo", "Do not poll"):
        assert duty in MODERATOR
    assert "fleet wait" in MODERATOR
    assert "Synthesize" in MODERATOR


def test_each_child_shows_key_name_state_progress_and_a_workspace_of_its_own():
    worker = _record(2, state=State.WORKING, workspace="/state/worktrees/a2")
    worker.progress = {"done": 2, "total": 5, "current": "write the parser", "next": []}
    asking = _record(3, state=State.WAITING, activity="asks: which db?", question="q1")
    text = render(
        _facts(
            [_record(1, activity="idle"), worker, asking],
            questions=(("q1", "a3", "Which database?"),),
            unread=("a1",),
            paper="paper (latest d4): unanswered questions to you or everyone: d3 (...)",
        )
    )
    lines = text.split("\n")
    assert lines[1:5] == [
        "Children:",
        "- a3 scout-3 (scout, scout) waiting on q1 — asks: which db?",
        "- a1 scout-1 (scout, scout) idle — idle",
        "- a2 scout-2 (scout, scout) working 2/5 in /state/worktrees/a2 — write the parser",
    ]
    assert lines[5:9] == [
        "Needs you:",
        "- q1 from a3: Which database? (fleet answer q1 TEXT)",
        "- reports ready from a1 (fleet wait)",
        "- paper (latest d4): unanswered questions to you or everyone: d3 (...)",
    ]
    assert lines[-1] == MODERATOR


def test_a_large_fleet_is_cut_and_counted_keeping_the_children_that_wait_on_the_parent():
    children = [
        _record(n, state=State.WORKING if n % 2 else State.IDLE, activity="x" * 300)
        for n in range(1, 60)
    ]
    children.append(_record(60, state=State.WAITING, question="q9"))
    text = render(_facts(children, used=60, cap=16))
    assert len(text) <= LIMIT
    lines = text.split("\n")
    assert lines[2].startswith("- a60 scout-60 (scout, scout) waiting on q9")
    shown = [line for line in lines if re.match(r"- a\d+ ", line)]
    [more] = [line for line in lines if line.startswith("- +")]
    count, idle, working = map(int, re.findall(r"\d+", more)[:3])
    assert more == f"- +{count} more ({idle} idle, {working} working): fleet peek"
    assert len(shown) + count == 60
    assert idle + working == count


names = st.text(max_size=400)


@settings(max_examples=150, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "children": st.integers(0, 300),
            "activity": names,
            "questions": st.lists(st.tuples(names, names), max_size=60),
            "unread": st.integers(0, 300),
            "paper": names,
            "voting": names,
            "workspace": names,
        }
    )
)
def test_the_brief_never_exceeds_its_bound_and_always_ends_with_how_to_moderate(case):
    children = case["children"]
    fleet = [
        _record(
            n, activity=case["activity"], workspace="/elsewhere" if n % 2 else case["workspace"]
        )
        for n in range(1, children + 1)
    ]
    text = render(
        _facts(
            fleet,
            workspace=case["workspace"],
            questions=tuple(
                (f"q{i}", key, text) for i, (key, text) in enumerate(case["questions"])
            ),
            unread=tuple(f"a{n}" for n in range(1, case["unread"] + 1)),
            paper=case["paper"],
            voting=case["voting"],
        )
    )
    assert len(text) <= LIMIT
    assert text.startswith("You moderate a fleet: mode build, ")
    assert text.endswith(MODERATOR)
    shown = len(re.findall(r"^- a\d+ scout-\d+ ", text, flags=re.MULTILINE))
    more = re.search(r"^- \+(\d+) more \(", text, flags=re.MULTILINE)
    assert shown + (int(more.group(1)) if more else 0) == children


async def test_gather_reads_the_live_fleet_its_questions_and_the_papers_open_questions(tmp_path):
    home = Path(tempfile.mkdtemp(prefix="flb-", dir="/tmp"))
    script = tmp_path / "ask.yaml"
    script.write_text(
        "turns:\n  - steps:\n      - {tool: ask_parent, args: {question: 'Which database?'}}\n"
        "      - {reply: 'using {{last}}'}\n"
    )
    config = Config(home=home, session="t", workspace=tmp_path, max_subagents=4)
    try:
        with trio.fail_after(30):
            async with open_supervisor(config) as sup:
                await sup.spawn([SpawnRequest(task="pick", model=f"scripted:{script}")])
                await sup.wait(["a1"])
                question = await sup.paper.ask("a1", "Is the cache shared?", to="parent")
                await sup.paper.ask("a1", "Anyone on docs/?")
                answered = await sup.paper.ask("a1", "Old question?")
                await sup.paper.answer("parent", answered, "yes")
                text = await sup.brief()
                sup.answer("q1", "postgres")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert "1/4 children" in text
    assert f"workspace {tmp_path} unless" in text
    # The activity after the dash is whatever the child streamed last.
    assert "\n- a1 scout-1 (scout, scout) waiting on q1 — " in text
    assert "- q1 from a1: Which database? (fleet answer q1 TEXT)" in text
    assert f"unanswered questions to you or everyone: {question}, d2 (" in text
    assert len(text) <= LIMIT
