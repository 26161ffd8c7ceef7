"""Fuzz the server side of an authenticated connection with hostile bytes.

Every example opens a real socket pair, performs a valid hello, then writes the fuzzed bytes
and EOF. ``Channel.serve`` must return on its own (no exception escapes), and the handler and
event handler see only frames that carry the owner's valid token.
"""

import contextlib
import json
import os
import socket
import struct

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ipc

KEY = ipc.new_session_key()
OWNER = "a1"
TOKEN = ipc.derive_token(KEY, OWNER)
TYPE_NAMES = {cls: name for name, cls in ipc.MESSAGE_TYPES.items()}
ENDINGS = {"peer closed", "framing error", f"{ipc.MAX_DROPS} invalid frames"}
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def frame_of(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def valid_frame(message: ipc.Message, *, kind: str = "request", corr: str = "1") -> bytes:
    envelope = ipc.Envelope(
        v=1,
        token=TOKEN,
        owner=OWNER,
        corr=corr,
        kind=kind,  # type: ignore[arg-type]
        type=TYPE_NAMES[type(message)],
        body=message,
    )
    return ipc.encode_frame(ipc.encode_envelope(envelope))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
# Lone surrogates are rare in st.text(); ask for them on purpose.
hostile_text = st.text(st.characters(categories=["Cs"]) | st.characters(), max_size=70)
# Envelope-shaped objects: the right keys, any values (a random token never matches).
envelopes = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 2, "1", None]),
        "token": hostile_text,
        "owner": st.sampled_from([OWNER, "a2", "", "../a1"]) | st.text(max_size=10),
        "corr": st.text(max_size=5) | st.integers(),
        "kind": st.sampled_from(["request", "response", "event", "notice"]),
        "type": st.sampled_from(sorted(ipc.MESSAGE_TYPES)) | st.text(max_size=10),
        "body": st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    },
    optional={"extra": json_values},
)
raw_garbage = st.binary(max_size=4096)
framed_garbage = st.lists(st.binary(min_size=1, max_size=600), max_size=24).map(
    lambda bodies: b"".join(frame_of(body) for body in bodies)
)
framed_json = st.lists(json_values | envelopes, max_size=24).map(
    lambda objs: b"".join(frame_of(json.dumps(obj).encode()) for obj in objs)
)
# JSON text json.dumps would never write: each literal once broke the decoder or a caller.
NASTY = [
    b"9" * 5000,  # past the int digit limit: ValueError, not JSONDecodeError
    b"NaN",
    b"-Infinity",
    b"1e999",
    b'"\\ud800"',  # an escaped lone surrogate
    b'"\xed\xa0\x80"',  # an encoded lone surrogate (json.loads(bytes) lets it through)
    b"[" * 50_000 + b"]" * 50_000,
    b'"\\u0000"',
]
nasty_json = st.tuples(
    envelopes, st.sampled_from(["token", "owner", "corr", "v", "body"]), st.sampled_from(NASTY)
).map(
    lambda case: frame_of(
        json.dumps({**case[0], case[1]: "@@"}, ensure_ascii=False)
        .encode("utf-8", "surrogatepass")
        .replace(b'"@@"', case[2])
    )
)
hostile = st.one_of(
    raw_garbage,
    framed_garbage,
    framed_json,
    st.lists(nasty_json, min_size=1, max_size=4).map(b"".join),
)


async def serve_against(
    payload: bytes, *, chunk: int = 65536
) -> tuple[ipc.Channel, list[ipc.Envelope]]:
    """Hello, then *payload* and EOF; return the server channel and what reached handlers."""
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server_stream = trio.SocketStream(trio.socket.from_stdlib_socket(left))
    client = trio.SocketStream(trio.socket.from_stdlib_socket(right))
    seen: list[ipc.Envelope] = []

    # Handlers' exceptions are caught by the channel, so record and judge in the test.
    async def handler(envelope: ipc.Envelope) -> ipc.Message:
        seen.append(envelope)
        return ipc.Reply(ok=True)

    async def on_event(envelope: ipc.Envelope) -> None:
        seen.append(envelope)

    async def write_then_eof() -> None:
        try:
            for start in range(0, len(payload), chunk):
                await client.send_all(payload[start : start + chunk])
            await client.send_eof()
        except trio.BrokenResourceError:
            pass  # the server closed first (framing error or 16 drops): fine

    async def drain() -> None:
        # Keep reading so replies to valid requests can never fill the socket buffer.
        try:
            while await client.receive_some():
                pass
        except trio.BrokenResourceError:
            pass

    with trio.fail_after(10):
        await client.send_all(valid_frame(ipc.Hello(pid=os.getpid()), corr="0"))
        channel, hello = await ipc.accept_hello(server_stream, {OWNER: TOKEN}.get)
        await channel.reply(hello.corr, ipc.Reply(ok=True))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_then_eof)
            nursery.start_soon(drain)
            await channel.serve(handler, on_event)  # must return: EOF, framing error or drops
    await client.aclose()
    # serve() returned by itself, for one of these reasons and no other.
    assert channel.close_reason in ENDINGS
    return channel, seen


@pytest.mark.slow
@FUZZ
@given(payload=hostile)
async def test_hostile_bytes_never_crash_serve_nor_reach_a_handler(payload):
    _channel, seen = await serve_against(payload)
    assert seen == []


@pytest.mark.slow
@FUZZ
@given(payload=hostile, chunk=st.integers(1, 64))
async def test_hostile_bytes_in_small_chunks(payload, chunk):
    _channel, seen = await serve_against(payload[:1024], chunk=chunk)
    assert seen == []


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(data)
    for op, where, value in edits:
        if not out:
            break
        index = where % len(out)
        if op == 0:
            out[index] ^= value or 1
        elif op == 1:
            out.insert(index, value)
        else:
            del out[index]
    return bytes(out)


@pytest.mark.slow
@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 4096), st.integers(0, 255)), max_size=6
    ),
    reframe=st.booleans(),
)
async def test_mutated_valid_frames_reach_handlers_only_when_still_authentic(edits, reframe):
    event = ipc.Event(activity="status", text="hello")
    request = ipc.Ownership(paths=["src/a.py"])
    frames = [valid_frame(event, kind="event", corr=""), valid_frame(request, corr="9")]
    if reframe:  # mutate bodies but keep lengths honest, to get past framing
        payload = b"".join(frame_of(mutate(frame[4:], edits) or b"x") for frame in frames)
    else:
        payload = mutate(b"".join(frames), edits)
    _channel, seen = await serve_against(payload)
    # Whatever got through is authentic: our owner's token, a known type, a decoded body.
    for envelope in seen:
        assert (envelope.token, envelope.owner) == (TOKEN, OWNER)
        assert isinstance(envelope.body, ipc.MESSAGE_TYPES[envelope.type])
    if not edits:
        assert [envelope.body for envelope in seen] == [event, request]


# -- the multiplexed link's frame parser ---------------------------------------------------------

mux_kinds = st.sampled_from([1, 2, 3, 4]) | st.integers(0, 255)
mux_frames = st.tuples(
    st.integers(0, 8) | st.integers(0, 2**32 - 1),
    mux_kinds,
    st.binary(max_size=300),
    st.booleans(),  # whether the header tells the payload's true length
    st.integers(0, 2**32 - 1),
).map(lambda f: struct.pack(">IBI", f[0], f[1], len(f[2]) if f[3] else f[4]) + f[2])


@FUZZ
@given(
    frames=st.lists(mux_frames, max_size=12),
    tail=st.binary(max_size=40),
    opener=st.booleans(),
)
def test_a_mux_link_ends_hostile_frames_with_mux_error_or_end_of_file(
    frames: list[bytes], tail: bytes, opener: bool
) -> None:
    """Whatever bytes a peer sends, either end of a link ends with ``MuxError`` or a clean end
    of file, promptly; every stream it handed out is over by then."""
    opened = []

    async def on_open(stream: ipc.MuxStream) -> None:
        opened.append(stream)
        with contextlib.suppress(trio.BrokenResourceError):  # the link ended under it
            while await stream.receive_some():
                pass

    async def main() -> None:
        ours, theirs = socket.socketpair()
        link = ipc.MuxLink(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), opener=opener)
        if opener:
            link.open("a1")  # so a peer's frames may name a stream that exists
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def peer() -> None:
                    with theirs:
                        for chunk in [*frames, tail]:
                            try:
                                theirs.sendall(chunk)
                            except OSError:
                                return
                        theirs.shutdown(socket.SHUT_WR)
                        while True:  # read what the link says until it closes
                            await trio.lowlevel.wait_readable(theirs)
                            try:
                                if not theirs.recv(65536):
                                    return
                            except OSError:
                                return

                theirs.setblocking(False)  # noqa: FBT003 - the stdlib's positional flag
                nursery.start_soon(peer)
                with contextlib.suppress(ipc.MuxError, trio.BrokenResourceError):
                    await link.run(on_open if not opener else None)
                await link.aclose()

    trio.run(main)
