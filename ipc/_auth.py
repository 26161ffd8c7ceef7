"""Session keys, per-launch tokens and the peer-uid check.

A supervisor draws one 32-byte session key. Each launch of an owner (a child key such as
``a1``) gets ``HMAC-SHA256(session_key, owner NUL launch)`` as its token, *launch* a fresh
nonce (:func:`new_launch`), delivered only inside its 0600 loadout: a child launched again (woken
from hibernation, revived) gets a new token and its old one opens nothing. Tokens are compared
in constant time.
"""

import hashlib
import hmac
import os
import re
import secrets
import socket
import struct
from typing import Final

SESSION_KEY_BYTES: Final = 32
OWNER_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def new_session_key() -> bytes:
    """A fresh random session key."""
    return secrets.token_bytes(SESSION_KEY_BYTES)


LAUNCH_BYTES: Final = 16


def new_launch() -> str:
    """A fresh launch nonce for :func:`derive_token` (hex)."""
    return secrets.token_hex(LAUNCH_BYTES)


def derive_token(session_key: bytes, owner: str, launch: str = "") -> str:
    """The token of *owner*'s *launch* under *session_key*, as 64 hex characters.

    Without a *launch* the token is the owner's alone (a connection made once, e.g. a
    benchmark's); every child launch passes a fresh :func:`new_launch`."""
    message = owner.encode() if not launch else f"{owner}\0{launch}".encode()
    return hmac.new(session_key, message, hashlib.sha256).hexdigest()


def token_bytes(token: str) -> bytes:
    """*token* as the bytes :func:`tokens_match` compares; any string has some."""
    # surrogatepass: a hostile "token" must compare unequal, never raise.
    return token.encode("utf-8", "surrogatepass")


def tokens_match(presented: str, expected: str) -> bool:
    """Constant-time comparison of two tokens; any string is safe to present."""
    return hmac.compare_digest(token_bytes(presented), token_bytes(expected))


def valid_identifier(value: str) -> bool:
    """Whether *value* is a legal owner / session identifier."""
    return OWNER_RE.fullmatch(value) is not None


#: A node link's owner (a Ray node host's one connection to the door): ``host.`` and hex. An
#: owner id never holds a dot, so no child's certificate or hello passes for a link's, nor a
#: link's for a child's.
LINK_OWNER_RE: Final = re.compile(r"^host\.[0-9a-f]{16,64}$")


def new_link_owner() -> str:
    """A fresh node link owner."""
    return f"host.{secrets.token_hex(8)}"


def is_link_owner(value: str) -> bool:
    """Whether *value* names a node link, not a child."""
    return LINK_OWNER_RE.fullmatch(value) is not None


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket.

    Linux answers through ``SO_PEERCRED``, macOS and the BSDs through ``LOCAL_PEERCRED``
    (``getpeereid``). Raises :class:`OSError` when the platform offers neither.
    """
    so_peercred = getattr(socket, "SO_PEERCRED", None)
    if so_peercred is not None:
        creds = sock.getsockopt(socket.SOL_SOCKET, so_peercred, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return int(uid)
    local_peercred = getattr(socket, "LOCAL_PEERCRED", 0x001)
    # struct xucred: u_int cr_version; uid_t cr_uid; short cr_ngroups; gid_t cr_groups[16]
    creds = sock.getsockopt(0, local_peercred, struct.calcsize("IIh16I"))
    _version, uid = struct.unpack_from("II", creds)
    return int(uid)


def own_uid() -> int:
    """Our effective uid (the only uid a peer may have)."""
    return os.geteuid()
