"""Democracy rounds on a real supervisor: real scout processes playing scripted ballots.

Only the tests that wait out a deadline are marked slow; the others take about a second.

Fresh voters all play one script (the round's model); nominated scouts each play their own, so
a round can mix opinions. Scripts take the round's nonce from the voter prompt (``{{nonce}}``).
"""

import contextlib
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import trio

from orchestrator._config import Config
from orchestrator._errors import CapacityError, NotFound, UsageError
from orchestrator._records import State
from orchestrator.cli._render import render_outcome
from orchestrator.coordination._ballots import Ballot, RoundError
from orchestrator.coordination._democracy import Leading, Outcome
from orchestrator.core._supervisor import SpawnRequest, open_supervisor

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}
REQUEST = {
    "complexity": "super-complex",
    "justification": "The lock, the replay cache and reconnects interact; each fix broke another.",
    "issue": "Replayed requests run twice after a reconnect.",
    "failed_approaches": [
        {"approach": "A bigger replay cache", "evidence": "Duplicate in run 41, log line 88."},
        {"approach": "Per-owner locks", "evidence": "test_reconnect deadlocks at 30 s."},
    ],
    "options": [
        {"id": "A", "title": "Persist the cache", "tradeoffs": "A disk write per request."},
        {"id": "B", "title": "Idempotency keys", "tradeoffs": "A protocol change."},
    ],
}


def _ballot(option: str, why: str) -> str:
    """A fresh voter's script: some prose, then the ballot line."""
    return (
        "turns:\n  - steps:\n      - reply: |\n          I read the evidence.\n"
        f"          BALLOT {{{{nonce}}}} {option} {why}\n"
    )


def _nominee(second_turn: str) -> str:
    """A scout that warms up on its spawn task, then plays *second_turn* (YAML steps)."""
    return "turns:\n  - steps: [{reply: warmed up}]\n  - steps:\n" + textwrap.indent(
        second_turn, "      "
    )


@pytest.fixture
def scripts(tmp_path):
    folder = tmp_path / "scripts"
    folder.mkdir()

    def write(name: str, text: str) -> str:
        path = folder / f"{name}.yaml"
        path.write_text(text)
        return f"scripted:{path}"

    return write


@pytest.fixture
def home():
    # A short path: the sockets live under it (sun_path is ~104 bytes).
    path = Path(tempfile.mkdtemp(prefix="fld-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def workspace(tmp_path):
    # A real repository: a worker (one of the nominees refused below) runs in a worktree of it.
    path = tmp_path / "repo"
    path.mkdir()
    (path / "README.md").write_text("# sample\n")
    env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=path, env=env, check=True, capture_output=True)
    return path


@pytest.fixture
def supervisor(home, workspace):
    @contextlib.asynccontextmanager
    async def open_one(cap: int = 4):
        config = Config(home=home, session="t", workspace=workspace, max_subagents=cap)
        async with open_supervisor(config) as sup:
            yield sup

    return open_one


async def _scouts(sup, *models: str) -> list[str]:
    """Spawn one scout per model and wait until each has settled its warm-up turn."""
    records = await sup.spawn([SpawnRequest(task="warm up", model=m) for m in models])
    keys = [r.key for r in records]
    await sup.wait(keys, every=True)
    assert {sup.registry.find(k).state for k in keys} == {State.IDLE}
    return keys


def _statuses(outcome) -> dict[str, tuple[str, str | None]]:
    return {b.voter: (b.status, b.option) for b in outcome.ballots}


async def test_a_clear_majority_wins_and_only_the_nominated_scout_remains(supervisor, scripts):
    with trio.fail_after(60):
        async with supervisor() as sup:
            [nominee] = await _scouts(sup, scripts("b", _nominee("- reply: BALLOT {{nonce}} B x")))
            outcome = await sup.democracy.vote(
                REQUEST,
                agents=[nominee],
                model=scripts("a", _ballot("A", "the evidence")),
                deadline=30,
            )
            assert outcome.status == "winner"
            assert outcome.winner == "A"
            assert outcome.invited == 4
            assert dict(outcome.counts) == {"A": 3, "B": 1}
            assert _statuses(outcome) == {
                "a1": ("valid", "B"),
                "a2": ("valid", "A"),
                "a3": ("valid", "A"),
                "a4": ("valid", "A"),
            }
            assert outcome.ballots[1].rationale == "the evidence"
            assert outcome.to_json()["winner"] == "A"
            assert "leading" not in outcome.to_json()
            # Round-only scouts are gone (not even retained); the nominee stays, idle.
            assert [r.key for r in sup.registry.live()] == [nominee]
            assert sup.registry.find(nominee).state is State.IDLE
            assert sup.capacity.used == 1
            assert set(sup.registry.retired) == set()
            # No ballot reached the parent's notifications.
            assert sup.notes.pending == []
            assert sup.democracy.current is None


async def test_a_tie_needs_the_user_with_the_leading_options_and_their_evidence(
    supervisor, scripts
):
    b = scripts("b", _nominee("- reply: BALLOT {{nonce}} B keys survive reconnects"))
    with trio.fail_after(60):
        async with supervisor() as sup:
            nominees = await _scouts(sup, b, b)
            outcome = await sup.democracy.vote(
                REQUEST, agents=nominees, model=scripts("a", _ballot("A", "disk is cheap"))
            )
    assert outcome.status == "needs-user"
    assert outcome.winner is None
    assert dict(outcome.counts) == {"A": 2, "B": 2}
    leading = {option.id: option for option in outcome.leading}
    assert set(leading) == {"A", "B"}
    assert leading["B"].title == "Idempotency keys"
    assert leading["B"].tradeoffs == "A protocol change."
    assert leading["B"].rationales == ("keys survive reconnects", "keys survive reconnects")
    assert leading["A"].rationales == ("disk is cheap", "disk is cheap")
    assert outcome.to_json()["leading"][0]["votes"] == 2


@pytest.mark.slow
async def test_a_hung_voter_is_cancelled_at_the_deadline_recorded_failed_and_retired(
    supervisor, scripts
):
    hang = scripts("hang", _nominee("- hang: true"))
    with trio.fail_after(60):
        async with supervisor() as sup:
            [hung] = await _scouts(sup, hang)
            started = time.monotonic()
            outcome = await sup.democracy.vote(
                REQUEST, agents=[hung], model=scripts("a", _ballot("A", "ok")), deadline=3
            )
            elapsed = time.monotonic() - started
            assert elapsed >= 3
            ballot = outcome.ballots[0]
            assert (ballot.voter, ballot.status, ballot.option) == ("a1", "failed", None)
            assert "3 s deadline" in ballot.reason
            # Three valid A of four invited is still a strict majority.
            assert (outcome.status, outcome.winner) == ("winner", "A")
            assert sup.registry.find("a1").state is State.STOPPED
            assert list(sup.registry.live()) == []


async def test_stale_malformed_and_crashed_ballots_are_recorded_never_counted(supervisor, scripts):
    stale = scripts("stale", _nominee("- reply: BALLOT 0123456789abcdef A copied from r0"))
    prose = scripts("prose", _nominee("- reply: I would pick A, clearly."))
    crash = scripts("crash", _nominee("- crash: 3"))
    with trio.fail_after(60):
        async with supervisor() as sup:
            nominees = await _scouts(sup, stale, prose, crash)
            outcome = await sup.democracy.vote(
                REQUEST, agents=nominees, model=scripts("a", _ballot("A", "ok"))
            )
    assert _statuses(outcome) == {
        "a1": ("stale", None),
        "a2": ("malformed", None),
        "a3": ("failed", None),
        "a4": ("valid", "A"),
    }
    reasons = {b.voter: b.reason for b in outcome.ballots}
    assert "'0123456789abcdef' is not this round's" in reasons["a1"]
    assert reasons["a2"] == "0 BALLOT lines; exactly one is required"
    assert "code 3" in reasons["a3"]
    # One valid ballot never decides: the user does.
    assert (outcome.status, outcome.leading[0].id, outcome.invited) == ("needs-user", "A", 4)


async def test_busy_forked_and_duplicate_nominees_are_refused_before_any_launch(
    supervisor, scripts
):
    hang = scripts("hang", "turns:\n  - steps: [{hang: true}]\n")
    with trio.fail_after(60):
        async with supervisor() as sup:
            worker, busy = await sup.spawn(
                [
                    SpawnRequest(task="edit", agent="worker", model=hang),
                    SpawnRequest(task="look", model=hang),
                ]
            )
            idle_model = scripts("idle", "turns: []\n")
            [idle] = await _scouts(sup, idle_model)
            [fork] = await sup.spawn([SpawnRequest(task="review", mode="fork", model=idle_model)])
            await sup.wait([fork.key])
            assert fork.state is State.IDLE
            assert busy.state in {State.STARTING, State.WORKING}
            cases = [
                ([worker.key], f"{worker.key} ({worker.name}) is a worker, not a scout"),
                ([fork.key], f"{fork.key} ({fork.name}) is a fork, not a scout"),
                # Busy: still starting, or working on its hanging task.
                ([busy.key], f"{busy.key} ({busy.name}) is {busy.state}, not idle or paused"),
                ([idle, idle], f"{idle} ({sup.registry.find(idle).name}) is nominated twice"),
                (["nobody"], "nominee 'nobody': no child 'nobody' in this session"),
            ]
            for agents, message in cases:
                with pytest.raises(RoundError, match=None) as info:
                    await sup.democracy.start(REQUEST, agents=agents, voters=3)
                assert message in str(info.value)
                assert info.value.field == "agents"
                assert str(info.value).startswith("democracy round refused: ")
                assert "\n" not in str(info.value)
            assert len(list(sup.registry.live())) == 4
            assert sup.democracy.current is None


async def test_a_full_fleet_fails_the_round_without_stopping_anyone(supervisor, scripts):
    hang = scripts("hang", "turns:\n  - steps: [{hang: true}]\n")
    with trio.fail_after(60):
        async with supervisor(cap=4) as sup:
            await sup.spawn(
                [SpawnRequest(task="edit", agent="worker", model=hang)]
                + [SpawnRequest(task=f"look {n}", model=hang) for n in range(2)]
            )
            before = {r.key: r.state for r in sup.registry.live()}
            with pytest.raises(CapacityError) as info:
                await sup.democracy.vote(REQUEST, model=hang)
            message = str(info.value)
            assert message.startswith("vote: 4 fresh voter(s) need free slots")
            assert "has 1 free (3 live)" in message
            assert "a round never stops one" in message
            assert {r.key: r.state for r in sup.registry.live()} == before
            assert sup.capacity.used == 3
            assert sup.democracy.current is None


async def test_the_gates_voters_and_deadline_are_checked_at_run_time(supervisor):
    with trio.fail_after(30):
        async with supervisor(cap=4) as sup:
            with pytest.raises(RoundError) as info:
                await sup.democracy.start({**REQUEST, "complexity": "hard"})
            assert info.value.field == "complexity"
            for voters in (1, 5, True):
                with pytest.raises(RoundError) as info:
                    await sup.democracy.start(REQUEST, voters=voters)
                assert info.value.field == "voters"
                assert "is not 2-4" in str(info.value)
            with pytest.raises(UsageError, match="must be a positive number of seconds"):
                await sup.democracy.start(REQUEST, deadline=0)
            assert list(sup.registry.live()) == []
            with pytest.raises(NotFound, match="no round is running"):
                await sup.democracy.abort()


async def test_at_cap_two_a_round_seats_two_voters(supervisor, scripts):
    with trio.fail_after(60):
        async with supervisor(cap=2) as sup:
            outcome = await sup.democracy.vote(REQUEST, model=scripts("a", _ballot("A", "ok")))
    assert outcome.invited == 2
    assert (outcome.status, outcome.winner) == ("winner", "A")


async def test_one_round_at_a_time_and_an_abort_voids_it(supervisor, scripts):
    hang = scripts("hang", "turns:\n  - steps: [{hang: true}]\n")
    with trio.fail_after(60):
        async with supervisor() as sup:
            [nominee] = await _scouts(sup, scripts("late", _nominee("- hang: true")))
            running = await sup.democracy.start(REQUEST, agents=[nominee], model=hang)
            assert running.id == "r1"
            assert len(running.voters) == 4
            with pytest.raises(RoundError) as info:
                await sup.democracy.start(REQUEST, model=hang)
            assert info.value.field == "round"
            assert "round r1 is still running" in str(info.value)
            assert await sup.democracy.wait("r1", 0.5) is None
            outcome = await sup.democracy.abort("r1")
            assert outcome.status == "failed"
            assert outcome.ballots == ()
            assert "aborted" in outcome.reason
            assert await sup.democracy.wait("r1", 0) is outcome
            # Fresh voters are discarded; the nominee is paused, not retired.
            assert [r.key for r in sup.registry.live()] == [nominee]
            assert sup.registry.find(nominee).state is State.PAUSED


@pytest.mark.slow
async def test_cancelling_a_vote_call_aborts_its_round(supervisor, scripts):
    hang = scripts("hang", "turns:\n  - steps: [{hang: true}]\n")
    with trio.fail_after(60):
        async with supervisor() as sup:
            caller = trio.CancelScope()

            async def vote() -> None:
                with caller:
                    await sup.democracy.vote(REQUEST, model=hang, voters=2)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(vote)
                # Cancelled once the round runs (its voters launched), however long that took:
                # a cancel during the launch is a round that never started.
                while sup.democracy.current is None or sup.democracy.current.scope is None:  # noqa: ASYNC110
                    await trio.sleep(0.02)
                caller.cancel()
            assert caller.cancelled_caught
            outcome = await sup.democracy.wait("r1", 0)
            assert outcome is not None
            assert outcome.status == "failed"
            assert "aborted" in outcome.reason
            assert list(sup.registry.live()) == []
            assert sup.democracy.current is None


def test_the_human_outcome_lists_every_ballot_and_what_is_left_to_the_user():
    def ballot(voter, status, option=None, rationale="", reason=""):
        return Ballot(voter=voter, status=status, option=option, rationale=rationale, reason=reason)

    outcome = Outcome(
        round="r3",
        status="needs-user",
        invited=3,
        ballots=(
            ballot("a1", "valid", "A", "disk is cheap"),
            ballot("a2", "valid", "B", "keys survive"),
            ballot("a3", "stale", reason="nonce 'x' is not this round's"),
        ),
        counts={"A": 1, "B": 1},
        leading=(
            Leading(id="A", title="Persist", tradeoffs="disk", votes=1, rationales=("d",)),
            Leading(id="B", title="Keys", tradeoffs="protocol", votes=1, rationales=("k",)),
        ),
    )
    assert render_outcome(outcome.to_json()).split("\n") == [
        "round r3: needs-user (A 1, B 1; 3 invited)",
        "  a1 valid A: disk is cheap",
        "  a2 valid B: keys survive",
        "  a3 stale nonce 'x' is not this round's",
        "No strict majority. Leading options, for the user to decide:",
        "  A (1): Persist. Tradeoffs: disk",
        "  B (1): Keys. Tradeoffs: protocol",
    ]
    void = Outcome(round="r4", status="failed", invited=2, reason="round r4 was aborted")
    assert void.to_json() == {
        "round": "r4",
        "status": "failed",
        "invited": 2,
        "counts": {},
        "ballots": [],
        "reason": "round r4 was aborted",
    }
    assert render_outcome(void.to_json()) == (
        "round r4: failed (no valid ballots; 2 invited)\nround r4 was aborted"
    )
