"""The fleet supervisor and everything parent-side: registry, policy, launchers, CLI.

Layering: ``orchestrator`` may import ``ipc`` and ``sandbox``; it never imports ``child`` (a
child is launched as its own process, ``python -m child <loadout>``).
"""
