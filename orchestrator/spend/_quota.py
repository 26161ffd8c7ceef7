"""Is a failed turn worth the next model? Quota, rate-limit and overload failures are.

Classified from the HTTP status when the caller has it (429 Too Many Requests, 529 Anthropic's
"overloaded") and from the words the backends themselves use in a turn's one-line error: the
builtin agent's ``HTTP 429``, Claude Code's ``API Error: 529`` / "usage limit reached", OpenAI's
``insufficient_quota`` / "exceeded your current quota", Pi's and Codex's "rate limit". Pure.
"""

import re
from typing import Final

#: What backends surface for a quota, rate-limit or overload failure (HTTP status or words).
_RETRYABLE: Final = re.compile(
    r"\b(429|529)\b|rate[ _-]?limit|usage limit|overloaded|too many requests"
    r"|insufficient_quota|quota (?:exceeded|reached)|exceeded your (?:current )?quota",
    re.IGNORECASE,
)


def retryable(error: object, status: int | None = None) -> bool:
    """A turn's failure is a quota/rate-limit/overload one (worth the next candidate)."""
    if status in {429, 529}:
        return True
    return isinstance(error, str) and _RETRYABLE.search(error) is not None
