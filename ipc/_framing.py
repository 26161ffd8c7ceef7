"""Sans-IO framing: a 4-byte big-endian unsigned length, then a UTF-8 JSON body.

Bytes go in, whole frame bodies come out; nothing here touches a socket. A zero length or a
length above the limit is a :class:`FrameError`, after which the stream is unusable.
"""

import struct

from ipc._errors import FrameError

MAX_FRAME = 1 << 20
"""Default largest frame body, in bytes (1 MiB)."""

_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size


def encode_frame(body: bytes, *, max_frame: int = MAX_FRAME) -> bytes:
    """Prefix *body* with its length; refuse what the peer would refuse."""
    size = len(body)
    if size == 0:
        raise FrameError("encode frame: empty body (a frame carries one JSON document)")
    if size > max_frame:
        raise FrameError(f"encode frame: {size} bytes exceeds the {max_frame}-byte limit")
    return _HEADER.pack(size) + body


class FrameDecoder:
    """Reassemble frames from arbitrary chunks (one byte at a time is fine)."""

    __slots__ = ("_broken", "_buffer", "_max_frame")

    def __init__(self, *, max_frame: int = MAX_FRAME) -> None:
        self._max_frame = max_frame
        # A partial frame, its header included; empty between frames.
        self._buffer = bytearray()
        self._broken = False

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a whole frame (a read header not counted)."""
        size = len(self._buffer)
        return size - HEADER_SIZE if size >= HEADER_SIZE else size

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add *data*; return every frame body it completes, in order."""
        if self._broken:
            raise FrameError("decode frame: stream already broke framing")
        buffer = self._buffer
        if buffer:
            buffer += data
            data = buffer
        elif (
            HEADER_SIZE < len(data) <= self._max_frame + HEADER_SIZE
            and _HEADER.unpack_from(data)[0] == len(data) - HEADER_SIZE
        ):
            return [bytes(data[HEADER_SIZE:])]  # the commonest chunk of all: exactly one frame
        # The usual chunk holds whole frames only: they are sliced out of it directly.
        frames: list[bytes] = []
        start = 0
        end = len(data)
        while end - start >= HEADER_SIZE:
            (size,) = _HEADER.unpack_from(data, start)
            if size == 0 or size > self._max_frame:
                self._broken = True
                what = "zero-length frame" if size == 0 else f"{size}-byte frame"
                raise FrameError(
                    f"decode frame: {what} (limit {self._max_frame}); stream cannot resync"
                )
            stop = start + HEADER_SIZE + size
            if stop > end:
                break
            frames.append(bytes(data[start + HEADER_SIZE : stop]))
            start = stop
        if data is buffer:
            del buffer[:start]
        elif start < end:
            buffer += data[start:]
        return frames
