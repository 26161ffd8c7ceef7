"""What runs inside a child process: the runtime loop, backends, the builtin agent and its tools.

Layering, bottom up:

- ``child.tools``: the builtin agent's tools; imports ``ipc`` and itself only.
- ``child.backends`` (with ``child.backends.builtin``): the backends and their shared plumbing;
  imports ``child.tools``, ``ipc`` and itself.
- the runtime at the top (``_runtime``, ``_view``, ``_forkserver``, ``__main__``): imports
  everything of ``child``; nothing below it imports it.

``tests/child/test_layering.py`` checks these layers. ``child`` may import ``ipc``; it never
imports ``orchestrator`` (the supervisor launches it as ``python -m child <loadout>``).
``tests/test_invariants.py`` checks this.
"""
