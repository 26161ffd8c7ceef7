"""Asking a live-only lookup for a child that has ended says so, with why, in one line."""

import pytest

from orchestrator._errors import NotFound
from orchestrator._records import ChildRecord, State
from orchestrator.core._registry import Registry


def _ended(key: str, name: str, error: str) -> ChildRecord:
    return ChildRecord(
        key=key,
        name=name,
        agent="scout",
        mode="scout",
        task="t",
        workspace="/w",
        backend="builtin",
        state=State.FAILED,
        error=error,
    )


def test_an_ended_child_is_named_with_its_state_and_first_error_line() -> None:
    registry = Registry()
    registry.retired["a1"] = _ended("a1", "mapper", "backend cannot start: bad model\ntraceback")
    for ref in ("a1", "mapper"):
        with pytest.raises(NotFound) as caught:
            registry.find(ref, include_retired=False)
        assert str(caught.value) == (
            "a1 has ended (failed: backend cannot start: bad model); see fleet peek a1"
        )
    assert registry.find("mapper").key == "a1"  # retired children are still found for peek
    with pytest.raises(NotFound, match="no child 'nobody' in this session"):
        registry.find("nobody", include_retired=False)
