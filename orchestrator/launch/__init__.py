"""Launch: starting a child somewhere, watching it, and ending its whole tree.

Owns the launcher interface and the process launcher (``_launcher``), the fork server
(``_forkserver``), the kill ladder (``_kill``), sandbox placement of the child command
(``_sandboxing``), the per-child egress proxy (``_egress``), the tmux and cmux surfaces
(``_tmux``, ``_cmux``, ``_foreign``), and the Ray actor launcher (``_ray``; DESIGN §11).

Imports: the foundation (``orchestrator._errors``, ``_config``, ``_records``, ``_sync``), ``ipc``
and ``sandbox`` — nothing of the core, so a launcher never learns about the fleet.
"""
