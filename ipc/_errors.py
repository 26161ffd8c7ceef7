"""The ``ipc`` exception tree.

::

    IpcError
    ├── FrameError          the byte stream broke framing; the connection cannot resync
    ├── SchemaError         a well-framed frame is not a valid envelope or message
    ├── HandshakeError      the first frame was not a valid, authenticated hello
    ├── RequestError        a request could not complete
    │   ├── RequestTimeout      its deadline passed
    │   └── ChannelClosed       the connection closed, was cancelled or its owner was reaped
    ├── ListenerError       the listening socket could not be set up safely
    ├── MuxError            the peer of a multiplexed link broke its protocol; the link ended
    └── LoadoutError        a loadout file failed a safety or schema check
"""

from typing import Any


class IpcError(Exception):
    """Root of every error raised by :mod:`ipc`."""


class FrameError(IpcError):
    """The byte stream broke framing (zero length, oversize, truncated).

    A stream that raised this cannot be resynchronized: close the connection.
    """


class SchemaError(IpcError):
    """A frame decoded but is not a valid envelope or message.

    ``path`` points at the offending field in cattrs' form (``$.body.owner``).
    """

    def __init__(self, message: str, *, path: str = "$", reason: str = "schema") -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


class HandshakeError(IpcError):
    """The peer's first frame was not a valid, authenticated hello (or the peer uid differs)."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class RequestError(IpcError):
    """A request did not get a successful response."""


class RequestTimeout(RequestError):
    """A request's deadline passed before its response arrived."""


class ChannelClosed(RequestError):
    """The channel closed (EOF, explicit close, cancellation or owner reaping)."""


class RemoteError(RequestError):
    """The peer answered a request with an error reply; ``data`` is the reply's data."""

    def __init__(self, message: str, *, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.data: dict[str, Any] = dict(data or {})


class ListenerError(IpcError):
    """The listening socket could not be set up safely."""


class LoadoutError(IpcError):
    """A loadout file failed a safety or schema check; the message says which."""


class MuxError(IpcError):
    """The peer of a multiplexed link broke its protocol (:mod:`ipc._mux`).

    The whole link has ended: every stream on it is broken and the connection is closed.
    """
