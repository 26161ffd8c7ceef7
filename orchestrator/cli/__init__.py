"""The ``fleet`` command line: verbs, human rendering, the live watch, the demo.

Owns argument parsing and dispatch (``_main``), the verbs grouped by concern (``_drive``,
``_common``, ``_coordination``, ``_review``, ``_watch``), the pure renderers (``_render``) and
``fleet demo`` (``_demo`` and its bundled ``_demo_data``).

Imports: the foundation, ``control`` (a verb is a client of the control socket) and the public
facade ``orchestrator`` (``fleet demo`` embeds a supervisor as any Python host would) — nothing
of the core, governance, workspace, coordination or launch directly.
"""
