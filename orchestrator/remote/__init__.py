"""Remote: the trust anchor for children on other nodes (DESIGN §11).

Owns ``_ca``: the per-session certificate authority, held in memory by the supervisor only. It
signs a node's certificate signing request (the node's key never travels) binding the child's
owner id as the SAN URI ``fleet://SESSION/OWNER``, refuses a request naming another owner, issues
leaves valid 30-60 minutes, and builds the server-side ``ssl.SSLContext`` that demands a client
certificate from this CA. ``owner_of`` reads the bound owner back from a peer certificate.

Owns ``_door``: the TLS listener remote children dial back to (TCP + mutual TLS), open only
while remote children exist; it binds each connection's hello to its certificate's owner and
then hands the ``ipc`` channel to the run, so the wire is the Unix socket's.

Imports: the foundation, ``ipc`` (the wire the door carries) and ``cryptography``; ``core``
composes the door with the narrow callables it needs (token lookup, attach, refuse).
"""
