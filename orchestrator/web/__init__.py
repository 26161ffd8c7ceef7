"""Web: ``fleet web``, a live view of the fleet in a browser on this machine.

Owns the HTTP server (``_server``: Hypercorn's trio worker on a loopback port, its state file,
starting or reusing it), the guard every request passes (``_guard``: one-time login tokens, the
HttpOnly SameSite=Strict session cookie, CSRF, ``Origin`` and ``Host`` checks), the control
client table (``_ops``: each thing the page can read or do is one control op, as a verb sends
it), the pages (``_app``: Starlette routes, Jinja2 templates with autoescape, server-sent
events) and what the pages draw (``_render``: diffs through Pygments, the usage chart as SVG).

The page can do nothing a parent could not: every action is a control request through the
same client and the same supervisor policy as the CLI.

Imports: the foundation and the ``control`` client side (``_client``, ``_daemon_client``);
never ``core``: the web view reaches the fleet only as a client.
"""
