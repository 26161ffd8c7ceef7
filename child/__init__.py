"""What runs inside a child process: the runtime loop, backends, the builtin agent and its tools.

Layering: ``child`` may import ``ipc``; it never imports ``orchestrator`` (the supervisor
launches it as ``python -m child <loadout>``). ``tests/test_invariants.py`` checks this.
"""
