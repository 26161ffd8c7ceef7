"""Remote: the trust anchor for children on other nodes (DESIGN §11).

Owns ``_ca``: the per-session certificate authority, held in memory by the supervisor only. It
signs a node's certificate signing request (the node's key never travels) binding the child's
owner id as the SAN URI ``fleet://SESSION/OWNER``, refuses a request naming another owner, issues
leaves valid 30-60 minutes, and builds the server-side ``ssl.SSLContext`` that demands a client
certificate from this CA. ``owner_of`` reads the bound owner back from a peer certificate.

Imports: the foundation only (and ``cryptography``); the listener that uses the context lives in
``ipc``/``core``, which receive the context as a value.
"""
