"""The wire between the fleet supervisor and its children.

Layering: ``ipc`` depends on the standard library, trio, attrs and cattrs only. It never
imports ``orchestrator``, ``child`` or ``sandbox``; ``tests/test_invariants.py`` checks this.
"""
