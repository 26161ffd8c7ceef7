"""Mid-run model fallback: a turn that failed on a quota, rate-limit or overload error is
retried once on its model role's next candidate.

The supervisor decides (the classifier is :func:`orchestrator.spend._quota.retryable`);
the child obeys: the retried ``prompt`` names the candidate's index in the loadout's
``models``, and the child runs it on that model (:meth:`child._runtime.Runtime._use_model`).
The record's ``models`` lists every model the child ran on, so its last entry is the current
one; ``peek`` and the handoff show it. A child without a role never falls back.
"""

import ipc
from orchestrator._records import ChildRecord
from orchestrator.spend._quota import retryable


def current_model(record: ChildRecord) -> int:
    """The index, in the loadout's ``models``, of the candidate the child runs on now."""
    return max(0, len(record.models) - 1) if record.role else 0


def fallback(
    record: ChildRecord, card: ipc.Loadout | None, result: ipc.Settled | None
) -> int | None:
    """The candidate to retry *result*'s failed turn on (recorded in ``record.models``), or
    ``None``: the turn did not fail on quota, or the role has no candidate left."""
    if card is None or not record.role or result is None or result.ok or result.aborted:
        return None
    if not retryable(result.error):
        return None
    following = current_model(record) + 1
    if following >= len(card.models):
        return None
    record.models.append(card.models[following].spec)
    return following
