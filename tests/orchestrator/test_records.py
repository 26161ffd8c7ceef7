"""A child's record: what the supervisor keeps of it between journal records."""

from orchestrator._records import RECENT_ACTIVITIES, ChildRecord, State


def test_a_record_keeps_its_recent_activities_with_their_times_and_bounded():
    record = ChildRecord(
        key="a1", name="n", agent="scout", mode="read", task="t", workspace="/w", backend="builtin"
    )
    record.state = State.WORKING
    for activity in ("working", "read a.py", "read a.py", "", "grep x", "working"):
        record.touch(activity)
    assert [a["activity"] for a in record.recent_activities()] == ["read a.py", "grep x"]
    assert all(isinstance(a["at"], float) for a in record.recent_activities())
    for n in range(RECENT_ACTIVITIES + 50):
        record.touch(f"step {n}")
    kept = record.recent_activities()
    assert len(kept) == RECENT_ACTIVITIES
    assert kept[-1]["activity"] == f"step {RECENT_ACTIVITIES + 49}"
