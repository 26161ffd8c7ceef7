"""Parents: fleet inside a parent agent — the MCP server and the installers that register it.

Owns ``fleet mcp`` (``_mcp``: the stdio server, one per parent session; ``_tools``: the tool
table, each schema holding its rules, each call one control request; ``_present`` and
``_framing``: a reply as the parent's model reads it, a child's words framed as data;
``_wire``: the stdin lines guarded before the SDK parses them; ``_watch``: the notifications
a change in the fleet sends) and ``fleet install``/``uninstall`` (``_install``: the
``Installer`` protocol and the ``INSTALLERS`` table; ``_install_json``, ``_install_toml``: the
parents' configuration files, edited so that uninstall removes exactly what install added).

Imports: the foundation, the ``control`` client side (``_client``, ``_daemon_client``),
``coordination`` and ``ipc``; never ``core``: a parent reaches the fleet only as a client.
"""
