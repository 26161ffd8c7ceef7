"""How a democracy round ended: :class:`Outcome`, and its text for the CLI.

The round itself runs in :mod:`._democracy`; this is only its result, as data,
as the ``fleet vote --json`` shape, and as the human text rendered from that shape.
"""

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from orchestrator.coordination._ballots import Ballot

__all__ = ["Leading", "Outcome"]


@attrs.frozen(kw_only=True)
class Leading:
    """An option tied at the top count, with what the user needs to decide on it."""

    id: str
    title: str
    tradeoffs: str
    votes: int
    rationales: tuple[str, ...]


@attrs.frozen(kw_only=True)
class Outcome:
    """How a round ended. An aborted round shows no ballots: its partial tally is void."""

    round: str
    status: Literal["winner", "needs-user", "failed"]
    invited: int
    ballots: tuple[Ballot, ...] = ()
    winner: str | None = None
    counts: Mapping[str, int] = attrs.Factory(dict)
    leading: tuple[Leading, ...] = ()
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """The ``fleet vote --json`` shape."""
        data: dict[str, Any] = {
            "round": self.round,
            "status": self.status,
            "invited": self.invited,
            "counts": dict(self.counts),
            "ballots": [attrs.asdict(ballot) for ballot in self.ballots],
        }
        if self.winner is not None:
            data["winner"] = self.winner
        if self.status == "needs-user":
            data["leading"] = [attrs.asdict(option) for option in self.leading]
        if self.reason:
            data["reason"] = self.reason
        return data
