"""Control: how a parent reaches a running fleet, and how the fleet's daemon runs.

Owns the control server (``_server``, its argument checks ``_args`` and review verbs
``_review``), the control client every verb uses (``_client``), the ``fleet serve`` daemon and
the client that finds or starts it (``_daemon``, ``_daemon_client``), and ``fleet doctor``'s checks
(``_doctor``). The MCP server a parent agent talks to is a client of it (``orchestrator.parents``).

Imports: the foundation, ``core`` (the server and daemon sit above the supervisor they serve),
``coordination``, ``launch``, ``workspace``, ``ipc`` and ``sandbox``. ``_client`` and
``_daemon_client`` import only the foundation and ``ipc``: a verb starts without the supervisor.
"""
