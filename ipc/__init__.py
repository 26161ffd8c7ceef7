"""The wire between the fleet supervisor and its children.

Layering: ``ipc`` depends on the standard library, trio, attrs and cattrs only. It never
imports ``orchestrator``, ``child`` or ``sandbox``; ``tests/test_invariants.py`` checks this.

Frames are a 4-byte big-endian length plus a UTF-8 JSON envelope (:mod:`ipc._framing`,
:mod:`ipc._messages`); connections are authenticated by a per-owner HMAC token and the peer
uid (:mod:`ipc._auth`, :mod:`ipc._handshake`), then carried by one :class:`Channel`.
"""

from ipc._auth import (
    derive_token,
    new_launch,
    new_session_key,
    peer_uid,
    tokens_match,
    valid_identifier,
)
from ipc._channel import MAX_DROPS, Channel
from ipc._errors import (
    ChannelClosed,
    FrameError,
    HandshakeError,
    IpcError,
    ListenerError,
    LoadoutError,
    RemoteError,
    RequestError,
    RequestTimeout,
    SchemaError,
)
from ipc._framing import MAX_FRAME, FrameDecoder, encode_frame
from ipc._handshake import (
    HELLO_TIMEOUT,
    TLS_SCHEME,
    accept_hello,
    hello_on,
    open_client,
    open_tls_client,
    tls_address,
)
from ipc._listener import Listener, ensure_private_dir
from ipc._loadout import (
    Loadout,
    ModelChoice,
    ModelSpec,
    sealed_loadout,
    write_loadout,
    write_private,
)
from ipc._messages import decode_envelope, encode_envelope
from ipc._prepare import prepare_codecs
from ipc._requests import DEFAULT_TIMEOUT, check_timeout
from ipc._tlsstream import SocketTLSStream, tls_over
from ipc._types import (
    MESSAGE_TYPES,
    NO_DEADLINE_TYPES,
    Abort,
    Answer,
    Ask,
    Control,
    Discuss,
    Envelope,
    Event,
    Hello,
    Message,
    Ownership,
    Progress,
    Prompt,
    Proxy,
    Question,
    Renew,
    Reply,
    Settled,
    Shutdown,
    Spawn,
    Steer,
    Usage,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "HELLO_TIMEOUT",
    "MAX_DROPS",
    "MAX_FRAME",
    "MESSAGE_TYPES",
    "NO_DEADLINE_TYPES",
    "TLS_SCHEME",
    "Abort",
    "Answer",
    "Ask",
    "Channel",
    "ChannelClosed",
    "Control",
    "Discuss",
    "Envelope",
    "Event",
    "FrameDecoder",
    "FrameError",
    "HandshakeError",
    "Hello",
    "IpcError",
    "Listener",
    "ListenerError",
    "Loadout",
    "LoadoutError",
    "Message",
    "ModelChoice",
    "ModelSpec",
    "Ownership",
    "Progress",
    "Prompt",
    "Proxy",
    "Question",
    "RemoteError",
    "Renew",
    "Reply",
    "RequestError",
    "RequestTimeout",
    "SchemaError",
    "Settled",
    "Shutdown",
    "SocketTLSStream",
    "Spawn",
    "Steer",
    "Usage",
    "accept_hello",
    "check_timeout",
    "decode_envelope",
    "derive_token",
    "encode_envelope",
    "encode_frame",
    "ensure_private_dir",
    "hello_on",
    "new_launch",
    "new_session_key",
    "open_client",
    "open_tls_client",
    "peer_uid",
    "prepare_codecs",
    "sealed_loadout",
    "tls_address",
    "tls_over",
    "tokens_match",
    "valid_identifier",
    "write_loadout",
    "write_private",
]
