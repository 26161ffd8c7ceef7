"""The supervisor's fallback decision: which failed turns move a child to its next model."""

import ipc
from orchestrator._records import ChildRecord
from orchestrator.spend._fallback import current_model, fallback

SPECS = ["openai/a", "openai/b", "openai/c"]


def card(specs: list[str]) -> ipc.Loadout:
    models = [ipc.ModelChoice(spec=s, model=ipc.ModelSpec(kind="openai", name=s)) for s in specs]
    return ipc.Loadout(
        session="t",
        owner="a1",
        name="n",
        agent="scout",
        token="x",  # noqa: S106 - not a secret
        socket="",
        workspace="/w",
        models=models,
    )


def record(role: str = "worker") -> ChildRecord:
    return ChildRecord(
        key="a1",
        name="n",
        agent="scout",
        mode="scout",
        task="t",
        workspace="/w",
        backend="builtin",
        role=role,
        models=[SPECS[0]] if role else ["openai:x@http://h/v1"],
    )


def failed(error: str, *, aborted: bool = False, side: bool = False) -> ipc.Settled:
    return ipc.Settled(turn=1, text="", ok=False, error=error, aborted=aborted, side=side)


def test_a_quota_failure_moves_to_each_next_candidate_until_none_is_left():
    r, c = record(), card(SPECS)
    assert current_model(r) == 0
    assert fallback(r, c, failed("HTTP 429: slow down")) == 1
    assert r.models == SPECS[:2]
    assert current_model(r) == 1
    assert fallback(r, c, failed("API Error: 529 overloaded")) == 2
    assert fallback(r, c, failed("HTTP 429")) is None  # the last candidate: nothing left
    assert r.models == SPECS


def test_other_endings_never_fall_back():
    r, c = record(), card(SPECS)
    assert fallback(r, c, ipc.Settled(turn=1, text="ok")) is None
    assert fallback(r, c, failed("HTTP 400: bad request")) is None
    assert fallback(r, c, failed("usage limit", aborted=True)) is None
    assert fallback(r, c, None) is None
    assert fallback(r, None, failed("HTTP 429")) is None
    assert r.models == SPECS[:1]


def test_a_child_without_a_role_keeps_its_model():
    r = record(role="")
    assert current_model(r) == 0
    assert fallback(r, card([]), failed("HTTP 429")) is None
    assert r.models == ["openai:x@http://h/v1"]
