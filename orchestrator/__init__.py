"""The fleet supervisor and everything parent-side: registry, policy, launchers, CLI.

Layering: ``orchestrator`` may import ``ipc`` and ``sandbox``; it never imports ``child`` (a
child is launched as its own process, ``python -m child <loadout>``).

The embeddable API::

    async with open_supervisor(load_config()) as sup:
        [child] = await sup.spawn([SpawnRequest(task="...", model="scripted:s.yaml")])
        notes = await sup.wait([child.key])
"""

from orchestrator._config import Config, load_config
from orchestrator._errors import (
    CapacityError,
    FleetError,
    NotFound,
    OperationFailed,
    PolicyError,
    Refused,
    TimedOut,
    Unreachable,
    UsageError,
)
from orchestrator._records import ChildRecord, State
from orchestrator.core._plan import SpawnRequest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from orchestrator.core._supervisor import Supervisor, open_supervisor

__all__ = [
    "CapacityError",
    "ChildRecord",
    "Config",
    "FleetError",
    "NotFound",
    "OperationFailed",
    "PolicyError",
    "Refused",
    "SpawnRequest",
    "State",
    "Supervisor",
    "TimedOut",
    "Unreachable",
    "UsageError",
    "load_config",
    "open_supervisor",
]


def __getattr__(name: str) -> object:
    # The supervisor (and with it psutil, libtmux, the launchers) is imported on first use:
    # a ``fleet`` verb, which only talks to a running supervisor, starts without it.
    if name in {"Supervisor", "open_supervisor"}:
        from orchestrator.core import _supervisor  # noqa: PLC0415

        return getattr(_supervisor, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
