"""The fleet supervisor and everything parent-side: registry, policy, launchers, CLI.

Layering: ``orchestrator`` may import ``ipc`` and ``sandbox``; it never imports ``child`` (a
child is launched as its own process, ``python -m child <loadout>``). Inside, imports point one
way (``tests/test_invariants.py`` checks every import statement)::

    cli ─► parents ─► control ─► core ─► governance · workspace · coordination · launch
                                                                               ─► foundation

- foundation (``_errors``, ``_config``, ``_records``, ``_sync``): errors, configuration, the
  record/spawn-request value types, small trio helpers; imported by every room.
- ``core``: the supervisor (composition root), runs, spawning, registry, notes, capacity, plan.
- ``governance``: policy, ownership locks and glob automaton, watchdog, diagnostics.
- ``workspace``: snapshot, worktrees, changes, path guard, copy-back, review, git.
- ``launch``: launcher interface, process launcher and fork server, kill ladder, sandbox
  placement, tmux, cmux (``ipc``, ``sandbox`` and the foundation only).
- ``coordination``: the paper, democracy rounds, ballots, outcome, the moderator brief.
- ``control``: the control server and client, the daemon, doctor.
- ``parents``: ``fleet mcp`` (the MCP server a parent agent talks to) and ``fleet install``
  (registering it in a parent's configuration); the ``control`` client side only, never ``core``.
- ``cli``: the ``fleet`` verbs, rendering, watch, demo (through ``control``, ``parents`` and this
  facade).

This module is the public facade; it imports the supervisor only on first use.

A program attaches to the session's supervisor (started on demand, as every ``fleet`` verb
does, so it works whether or not ``fleet serve`` is up)::

    async with connect() as fleet:
        [child] = await fleet.spawn([SpawnRequest(task="...", model="scripted:s.yaml")])
        notes = await fleet.wait([child["key"]])

or embeds one of its own (refused in one line while the session already has one)::

    async with open_supervisor(load_config()) as sup:
        [child] = await sup.spawn([SpawnRequest(task="...", model="scripted:s.yaml")])
        notes = await sup.wait([child.key])
"""

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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from orchestrator._config import Config, load_config
    from orchestrator._records import ChildRecord, SpawnRequest, State
    from orchestrator.control._connect import FleetClient, connect
    from orchestrator.core._supervisor import Supervisor, open_supervisor

__all__ = [
    "CapacityError",
    "ChildRecord",
    "Config",
    "FleetClient",
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
    "connect",
    "load_config",
    "open_supervisor",
]


def __getattr__(name: str) -> object:
    # The supervisor (and with it psutil, libtmux, the launchers) is imported on first use:
    # a ``fleet`` verb, which only talks to a running supervisor, starts without it.
    if name in {"Supervisor", "open_supervisor"}:
        from orchestrator.core import _supervisor  # noqa: PLC0415

        return getattr(_supervisor, name)
    if name in {"FleetClient", "connect"}:
        from orchestrator.control import _connect  # noqa: PLC0415

        return getattr(_connect, name)
    if name in {"Config", "load_config"}:
        # And the configuration (attrs): a warm verb (``cli._fast``) reads what it needs itself.
        from orchestrator import _config  # noqa: PLC0415

        return getattr(_config, name)
    if name in {"ChildRecord", "SpawnRequest", "State"}:
        # The record classes too: a one-shot verb needs none of them.
        from orchestrator import _records  # noqa: PLC0415

        return getattr(_records, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
