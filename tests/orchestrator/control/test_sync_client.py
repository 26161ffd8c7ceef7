"""The blocking control client against a real ipc server on a real Unix socket.

:func:`orchestrator.control._client.call` speaks the wire without trio or the ipc codec, so
its frames are compared with what an ipc channel writes, and it is driven against
:func:`ipc.accept_hello` and :meth:`ipc.Channel.serve`, which check every frame strictly.
"""

import os
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import ipc
from orchestrator._errors import NotFound, Refused, Unreachable, UsageError
from orchestrator.control._client import CONTROL_OWNER, call, control_frame, refusal_frame
from tests.ipc._strategies import json_values

KEY = b"k" * 32
TOKEN = ipc.derive_token(KEY, CONTROL_OWNER)


@given(op=st.text(max_size=8), args=st.dictionaries(st.text(max_size=6), json_values))
def test_it_writes_the_frames_an_ipc_channel_writes(op, args):
    expected = channel_frame("1", "control", ipc.Control(op=op, args=args))
    assert control_frame(TOKEN, "1", "control", {"op": op, "args": args}) == expected
    hello = ipc.Hello(pid=7, role="control")
    assert control_frame(TOKEN, "0", "hello", {"pid": 7, "role": "control", "backend": ""}) == (
        channel_frame("0", "hello", hello)
    )


def channel_frame(corr: str, type_: str, body: ipc.Message) -> bytes:
    envelope = ipc.Envelope(
        v=1, token=TOKEN, owner=CONTROL_OWNER, corr=corr, kind="request", type=type_, body=body
    )
    return ipc.encode_frame(ipc.encode_envelope(envelope))


async def serve_control(path: Path, seen: list[Any], *, answer: bool = True) -> Any:
    async def connection(stream: trio.SocketStream) -> None:
        try:
            channel, hello = await ipc.accept_hello(
                stream, lambda owner: ipc.derive_token(KEY, owner)
            )
        except ipc.HandshakeError as exc:
            seen.append(exc.reason)
            return
        await channel.reply(hello.corr, ipc.Reply(ok=True, data={"session": "s"}))

        async def handler(envelope: ipc.Envelope) -> ipc.Message:
            body = envelope.body
            assert isinstance(body, ipc.Control)
            seen.append((body.op, body.args))
            if body.op == "missing":
                return ipc.Reply(ok=False, error="no such child: a9", data={"kind": "not-found"})
            if not answer:
                await trio.sleep_forever()
            return ipc.Reply(ok=True, data={"echo": body.args})

        await channel.serve(handler, _no_events)

    listener = ipc.Listener(path=path)
    return listener, connection


async def _no_events(envelope: ipc.Envelope) -> None:
    return None


async def run_against(tmp_path: Path, client: Any, *, answer: bool = True) -> tuple[Any, list[Any]]:
    seen: list[Any] = []
    path = tmp_path / "run" / "control.sock"
    listener, connection = await serve_control(path, seen, answer=answer)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.serve, connection)
        try:
            result = await trio.to_thread.run_sync(client, path)
        except Exception as exc:
            result = exc
        nursery.cancel_scope.cancel()
    await listener.aclose()
    return result, seen


async def test_a_request_round_trips_through_the_strict_server(tmp_path):
    args = {"agents": ["a1"], "text": "caf\u00e9 \u2028 \x01", "n": 3, "x": 1.5, "ok": True}
    result, seen = await run_against(
        tmp_path, lambda path: call(path, TOKEN, "peek", args, timeout=5)
    )
    assert result == {"echo": args}
    assert seen == [("peek", args)]


async def test_an_error_reply_becomes_the_error_kind_it_names(tmp_path):
    result, _ = await run_against(
        tmp_path, lambda path: call(path, TOKEN, "missing", {}, timeout=5)
    )
    assert isinstance(result, NotFound)
    assert str(result) == "no such child: a9"


async def test_a_wrong_token_is_unreachable_and_never_served(tmp_path):
    result, seen = await run_against(
        tmp_path, lambda path: call(path, "0" * 64, "ping", {}, timeout=5)
    )
    assert isinstance(result, Unreachable)
    assert "unreachable" in str(result)
    assert seen == ["token"]


@pytest.mark.parametrize("read_first", [True, False])
async def test_a_refusal_is_refused_at_once_not_unreachable(tmp_path, read_first):
    """The supervisor answers a peer it refuses (a child, a sandboxed process) and hangs up,
    before or after the client's hello arrived: the client raises :class:`Refused` (exit 4),
    which no caller waits out, where a hang-up alone is :class:`Unreachable`."""
    path = tmp_path / "control.sock"

    async def refuse(stream: trio.SocketStream) -> None:
        if read_first:
            await stream.receive_some(65536)
        await stream.send_all(refusal_frame("the control socket serves the parent only"))
        await stream.aclose()

    listener = ipc.Listener(path=path)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.serve, refuse)
        with trio.fail_after(10):
            result = await trio.to_thread.run_sync(
                lambda: _raised(lambda: call(path, TOKEN, "spawn", {}, timeout=60))
            )
        nursery.cancel_scope.cancel()
    await listener.aclose()
    assert type(result) is Refused, result
    assert "refused this connection: the control socket serves the parent only" in str(result)


def _raised(function: Any) -> BaseException | None:
    try:
        function()
    except Exception as exc:
        return exc
    return None


async def test_no_answer_within_the_timeout_is_unreachable(tmp_path):
    result, _ = await run_against(
        tmp_path, lambda path: call(path, TOKEN, "wait", {}, timeout=0.3), answer=False
    )
    assert isinstance(result, Unreachable)
    assert "did not answer wait within 0.3 s" in str(result)


def test_no_socket_is_unreachable(tmp_path):
    with pytest.raises(Unreachable, match="unreachable"):
        call(tmp_path / "absent.sock", TOKEN, "ping", {}, timeout=1)


def test_text_that_is_not_utf8_is_a_usage_error_before_connecting(tmp_path):
    # What a command-line argument of undecodable bytes becomes (surrogateescape).
    text = os.fsdecode(b"\xff")
    with pytest.raises(UsageError, match="not representable as UTF-8 JSON"):
        call(tmp_path / "absent.sock", TOKEN, "steer", {"text": text}, timeout=1)


def test_an_oversize_request_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="frame limit"):
        call(tmp_path / "absent.sock", TOKEN, "steer", {"text": "x" * (1 << 20)}, timeout=1)
