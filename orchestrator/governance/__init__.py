"""Governance: the rules a fleet enforces, as pure parts the core wires in.

Owns the workflow-mode and toolset policy (``_policy``), path ownership locks with the exact
glob-overlap automaton (``_ownership``, ``_globmatch``), the watchdog budgets (``_watchdog``), and
bounded, redacted diagnostics (``_diagnostics``: run logs, failure tails, the reject log), the
loop gate's pure rules (``_loopgate``; wired in ``core._loops``), checked results
(``_checked``: a child's fenced JSON result validated against its spawn's JSON Schema with
``jsonschema``). Spend (budgets, the ledger, quota, roles, fallback) is :mod:`orchestrator.spend`.

Imports: the foundation (``orchestrator._errors``, ``_config``, ``_records``, ``_sync``) only —
nothing of the core, the launchers or the CLI.
"""
