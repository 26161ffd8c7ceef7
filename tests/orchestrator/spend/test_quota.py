"""The quota classifier: which failed turns move a child to its role's next model."""

import pytest

from orchestrator.spend._quota import retryable


@pytest.mark.parametrize(
    ("error", "status", "expected"),
    [
        ("HTTP 429 Too Many Requests", None, True),
        ("Claude AI usage limit reached|1767225600", None, True),
        ('API Error: 529 {"type":"overloaded_error"}', None, True),
        ("Overloaded", None, True),
        ("You exceeded your current quota (insufficient_quota)", None, True),
        ("Rate limit reached for gpt-5", None, True),
        ("", 429, True),
        ("", 529, True),
        ("model returned invalid JSON", 500, False),
        ("no such file 4290.txt", None, False),
        (
            "codex: stream error: exceeded retry limit, last status: 429 Too Many Requests",
            None,
            True,
        ),
        ("pi: the model request failed: 529 overloaded_error", None, True),
        ("HTTP 401: invalid api key", 401, False),
        ("the turn was aborted", None, False),
        (None, None, False),
    ],
)
def test_retryable_classification(error: object, status: int | None, expected: bool) -> None:
    assert retryable(error, status) is expected
