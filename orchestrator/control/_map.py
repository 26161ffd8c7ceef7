"""The ``map`` control op: start, resume, wait for, or cancel a ``fleet map`` (docs/map.md).

``{"action": "start", "spec": {template, agent, model, role, schema, dedupe_key, max_items,
max_runtime, retries, out}, "rows": [{...}, ...]}`` and ``{"action": "resume", "map": "m1"}``
answer the map's status at once; ``{"action": "wait", "map", "timeout"}`` answers it when the
map ends or after one slice; ``{"action": "cancel", "map"}`` stops it (it stays resumable).
"""

from collections.abc import Mapping
from typing import Any

from orchestrator._errors import UsageError
from orchestrator.batch import MapSpec
from orchestrator.control._args import str_arg
from orchestrator.control._client import WAIT_SLICE
from orchestrator.core._supervisor import Supervisor

__all__ = ["map_op"]


async def map_op(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    action = str_arg(args, "action")
    if action == "start":
        spec, rows = args.get("spec"), args.get("rows")
        if not isinstance(spec, dict):
            raise UsageError("map: spec must be an object")
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise UsageError("map: rows must be a list of objects")
        return (await sup.maps.start(MapSpec.from_mapping(spec), rows)).status()
    if action == "resume":
        return (await sup.maps.resume(str_arg(args, "map"))).status()
    if action == "wait":
        timeout = args.get("timeout", WAIT_SLICE)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise UsageError("map: timeout must be a number of seconds")
        return await sup.maps.wait(str_arg(args, "map"), min(max(timeout, 0.0), WAIT_SLICE))
    if action == "status":
        return sup.maps.find(str_arg(args, "map")).status()
    if action == "cancel":
        return await sup.maps.cancel(str_arg(args, "map"))
    raise UsageError(f"map: action {action!r} is not start, resume, wait, status or cancel")
