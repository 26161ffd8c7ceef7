"""Control ops for reviewing applied changes: ``diff``, ``accept``, ``revert``.

The review store's work is blocking file I/O; it runs in a worker thread.
"""

from collections.abc import Mapping
from typing import Any

import trio

from orchestrator._errors import FleetError, UsageError
from orchestrator.control._args import strs_arg
from orchestrator.core._supervisor import Supervisor


def _review_selector(sup: Supervisor, refs: list[str]) -> list[str]:
    """Agents (key or name) become their keys; anything else is a path."""
    selector = []
    for ref in refs:
        try:
            selector.append(sup.registry.find(ref).key)
        except FleetError:
            selector.append(ref)
    return selector


async def review_diff(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    context = args.get("context", 3)
    if not isinstance(context, int) or context < 0:
        raise UsageError("diff: --context must be a whole number >= 0")
    diffs = await trio.to_thread.run_sync(
        lambda: sup.review.diff(_review_selector(sup, strs_arg(args, "targets")), context)
    )
    return {
        "files": [
            {"path": d.path, "owner": d.owner, "status": d.status, "diff": d.diff} for d in diffs
        ]
    }


async def review_accept(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    selector = _review_selector(sup, strs_arg(args, "targets"))
    accepted = await trio.to_thread.run_sync(lambda: sup.review.accept(selector))
    return {"files": [{"path": path, "status": "accepted"} for path in accepted]}


async def review_revert(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    selector = _review_selector(sup, strs_arg(args, "targets"))
    result = await trio.to_thread.run_sync(lambda: sup.review.revert(selector))
    files = [{"path": path, "status": "reverted"} for path in result.reverted]
    files += [{"path": c.path, "status": "failed", "error": c.reason} for c in result.failed]
    return {"files": files}
