"""Batch work over a live fleet: ``fleet map`` (one child per row of a work list) and the
integration queue (``fleet land``: held worker changes landed one at a time behind a gate).

:mod:`._worklist` reads and checks the rows and fills the task template (pure);
:mod:`._spec` is a map's options; :mod:`._spawner` coalesces a map's spawns into batches
within free capacity; :mod:`._outfile` writes and repairs the out file; :mod:`._mapper` runs
a map against the supervisor, which it reaches through the small :class:`MapFleet` protocol,
and records each row's outcome in the map's ledger
(:class:`orchestrator.durability.MapBook`). :mod:`._queue` is the integration queue; it reaches
the supervisor's worktrees through :class:`QueueWorktrees` and runs its gate under ``sandbox``.

Import rule: the foundation (``orchestrator._errors``, ``_config``, ``_records``, ``_sync``),
``orchestrator.durability`` (the ledger), ``orchestrator.governance`` (the result schema
check), ``orchestrator.workspace`` (git, worktrees, patches), ``sandbox`` (the gate), the
standard library, trio, attrs and orjson; never ``core``, which creates :class:`Maps` with
itself as the fleet, nor ``control`` or ``cli``.
"""

from orchestrator.batch._mapper import Map, MapFleet, Maps
from orchestrator.batch._queue import Entry, IntegrationQueue, QueueWorktrees
from orchestrator.batch._spec import MapSpec
from orchestrator.batch._worklist import MAX_ROWS, Row, fill, parse_rows, placeholders, select_rows

__all__ = [
    "MAX_ROWS",
    "Entry",
    "IntegrationQueue",
    "Map",
    "MapFleet",
    "MapSpec",
    "Maps",
    "QueueWorktrees",
    "Row",
    "fill",
    "parse_rows",
    "placeholders",
    "select_rows",
]
