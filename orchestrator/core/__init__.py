"""The fleet core: the supervisor as composition root, and what it composes of its own.

Owns the :class:`~orchestrator.core._supervisor.Supervisor` (it wires every part and holds no
low-level logic), one child's run (``_run``: launch, hello, turns, one terminal state) and its
requests (``_requests``) with their loop gate (``_loops``), spawning (``_spawning``), the
services offered to running children (``_services``), the registry, the coalesced settle notes,
capacity and the lane, the spawn plan (from an agent definition), the binding of runs to
their worktrees (``_isolation``), what the supervisor observed of a turn (``_evidence``), and
each ended child's full report and transcript, kept until it is discarded (``_kept``).

Imports: the foundation (``orchestrator._errors``, ``_config``, ``_records``, ``_sync``),
``definitions`` (the agent definitions), ``governance``, ``workspace``, ``coordination``,
``launch``, ``ipc`` and ``sandbox``. Nothing here but the facade and ``control`` above it
imports ``_supervisor``: a part receives the narrow collaborator it uses (``_host``'s
protocols, ``coordination._democracy.Electorate``), never the supervisor.
"""
