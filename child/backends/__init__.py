"""The backends a child runs its turns with, and the plumbing the agent-CLI backends share.

Every backend implements one small interface, :class:`Backend` (start a turn, steer, abort,
close), and reaches the parent only through the :class:`Host` the runtime lends it
(:mod:`child.backends._base`). Here:

- ``builtin/``: fleet's own agent loop and its models (:mod:`child.backends.builtin`);
- ``_command``: any argv, the task on stdin, the final text on stdout;
- ``_pi``, ``_claude``, ``_codex``: the agent CLIs, over ``_cli_backend`` (one CLI process and
  its turns), ``_cli_env`` (binaries, versions, private directories, environment) and
  ``_jsonl`` (their line-delimited JSON);
- ``_host_tools``: the tools that reach the parent (``ask_parent``, ``subagent``, ``discuss``),
  for the builtin loop and, relayed by ``_mcp`` (an MCP server, and the Pi extension in
  ``child/pi_extension/``), for the agent CLIs.

Only the interface is exported here: the runtime imports a backend's module when a loadout
names it, so a child imports the backend it runs and not the others.

Layering: ``child.backends`` imports ``child.tools``, ``ipc`` and itself; of its own modules only
``builtin/`` imports ``child.backends.builtin``. It never imports the runtime
(:mod:`child._runtime`, which imports it), nor ``orchestrator``.
"""

from child.backends._base import Backend, Host, TurnAborted, TurnResult

__all__ = ["Backend", "Host", "TurnAborted", "TurnResult"]
