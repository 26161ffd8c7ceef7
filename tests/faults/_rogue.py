"""A misbehaving child for the fault suite, started where ``python -I -m child ...`` would be
(``--fd N --loadout-fd M`` for a process child: it reads the sealed loadout without consuming it).

The act is the part of the child's name after ``rogue-``; any other child becomes the real one
(``exec``, same pid). Each act speaks the real protocol with the loadout's real token, then
does one wrong thing:

- ``flood``: prints its own token (split across writes) and 5 MiB to stdout and stderr, then
  becomes the real child.
- ``leak``: the same without the flood (its own token only), for a fast test.
- ``late``: answers a prompt with its ``settled`` frame twice, one for a turn that never ran and
  one for a side turn nobody asked, then idles.
- ``garbage``: after the hello, sends frames with a wrong token until the supervisor hangs up.
- ``drop``: takes ownership of ``src/rogue.txt``, then closes its connection and stays alive.
- ``vanish``: asks the parent a question (no deadline); the next request from the supervisor
  goes unanswered: it closes its connection and exits 0.
- ``meterless``: answers each prompt by calling its model itself (a chat completion through
  its egress proxy socket, as an agent CLI's HTTP client would) and reports no usage at all;
  its report is the HTTP status line it got.
- ``unspend``: reports usage with a negative cost and negative token counts (a lying model or
  child trying to unspend its budget), then idles.
"""

import contextlib
import json
import os
import socket
import sys
import time
from urllib.parse import urlsplit

import trio

import ipc


def become_real_child() -> None:
    # Same pid, same argv (and inherited descriptors) as the supervisor started: from here on
    # it is the real child.
    args = sys.argv[sys.argv.index("child") + 1 :]  # what followed ``-I -m child``
    os.execv(sys.executable, [sys.executable, "-I", "-m", "child", *args])  # noqa: S606


def inherited() -> tuple[int, int] | None:
    """The connection and loadout descriptors of an ``--fd N --loadout-fd M`` child."""
    args = sys.argv[1:]
    if "--loadout-fd" not in args:
        return None
    return int(args[args.index("--fd") + 1]), int(args[args.index("--loadout-fd") + 1])


def flood(token: str, *, kib: int = 5 * 1024 // 2) -> None:
    half = len(token) // 2
    for stream in (sys.stdout.buffer, sys.stderr.buffer):
        stream.write(f"my token is {token[:half]}".encode())
        stream.flush()
        stream.write(f"{token[half:]} (leaked)\n".encode())
        stream.flush()
        chunk = (b"x" * 1023) + b"\n"
        for _ in range(kib):
            stream.write(chunk)
        stream.write(f"and again {token}\n".encode())
        stream.flush()


async def act(name: str, loadout: ipc.Loadout) -> None:
    fds = inherited()
    hello = ipc.Hello(pid=os.getpid(), backend=loadout.backend)
    if fds is None:
        channel, _ = await ipc.open_client(
            loadout.socket,
            owner=loadout.owner,
            token=loadout.token,
            hello=hello,
            request_timeout=loadout.request_timeout,
        )
    else:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fds[0])))
        channel, _ = await ipc.hello_on(
            stream,
            owner=loadout.owner,
            token=loadout.token,
            hello=hello,
            request_timeout=loadout.request_timeout,
        )
    async with trio.open_nursery() as nursery:

        async def handle(envelope: ipc.Envelope) -> ipc.Message:
            body = envelope.body
            if isinstance(body, ipc.Prompt) and name == "late":
                nursery.start_soon(late_frames, body.turn)
            if isinstance(body, ipc.Prompt) and name == "meterless":
                nursery.start_soon(call_model, body.turn)
            if name == "vanish" and not isinstance(body, ipc.Prompt):
                await channel.aclose("vanishing mid-request")
                os._exit(0)
            if isinstance(body, ipc.Shutdown):
                channel.close("shutdown")
            return ipc.Reply(ok=True)

        async def ignore(envelope: ipc.Envelope) -> None:
            return None

        async def late_frames(turn: int) -> None:
            await trio.sleep(0.2)
            for settled in (
                ipc.Settled(turn=turn, text="first"),
                ipc.Settled(turn=turn, text="second"),
                ipc.Settled(turn=turn + 98, text="a turn that never ran"),
                ipc.Settled(turn=turn, text="a side turn nobody asked", side=True),
            ):
                await channel.send_event(settled)

        async def call_model(turn: int) -> None:
            status = await trio.to_thread.run_sync(post_chat, loadout.model.base_url)
            await channel.send_event(ipc.Settled(turn=turn, text=status))

        nursery.start_soon(channel.serve, handle, ignore)
        if name == "garbage":
            forged = ipc.Envelope(
                v=1,
                token="0" * 64,
                owner=loadout.owner,
                corr="",
                kind="event",
                type="event",
                body=ipc.Event(activity="message", text="forged"),
            )
            frame = ipc.encode_frame(ipc.encode_envelope(forged))
            for _ in range(ipc.MAX_DROPS):
                # Through the channel's own writer, so frames never interleave with replies.
                await channel._write(frame)
        elif name == "drop":
            await channel.request(ipc.Ownership(paths=[f"{loadout.workspace}/src/rogue.txt"]))
            await channel.aclose("dropping the connection on purpose")
            await trio.sleep_forever()
        elif name == "vanish":
            await channel.request(ipc.Question(text="Which way?"), timeout=None)
        elif name == "unspend":
            for usage in (
                ipc.Usage(tokens=120, input_tokens=100, output_tokens=20, model="fake-model"),
                ipc.Usage(tokens=-5000, input_tokens=-1, cost_usd=-997.0, model="fake-model"),
                ipc.Usage(tokens=110, cost_usd=-1e-9, model="fake-model"),
            ):
                await channel.send_event(ipc.Event(activity="usage", usage=usage))


def post_chat(base_url: str) -> str:
    """One chat completion at *base_url* through the egress socket; its status line."""
    parts = urlsplit(base_url)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    s.connect(os.environ["FLEET_EGRESS_SOCKET"])
    s.sendall(f"CONNECT {parts.hostname}:{parts.port} HTTP/1.1\r\n\r\n".encode())
    s.sendall(
        f"POST {parts.path}/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        "Authorization: Bearer fleet-placeholder\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    data = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            data += chunk
    s.close()
    answer = data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""
    return answer.split(b"\r\n", 1)[0].decode("latin-1")


def main() -> None:
    fds = inherited()
    if fds is None:
        with open(sys.argv[-1], "rb") as file:
            data = file.read()
    else:
        data = os.pread(fds[1], 4 << 20, 0)  # the real child must still find it whole
    name = json.loads(data)["name"]
    if not name.startswith("rogue-"):
        become_real_child()
    loadout = ipc.Loadout.from_json(data)
    act_name = name.removeprefix("rogue-")
    if act_name in ("flood", "leak"):
        flood(loadout.token, kib=5 * 1024 // 2 if act_name == "flood" else 0)
        become_real_child()
    try:
        trio.run(act, act_name, loadout)
    except (ipc.IpcError, ExceptionGroup) as exc:
        # The supervisor hanging up on a rogue is the expected end of most acts.
        print(f"rogue {act_name}: {exc!r}", file=sys.stderr)
    time.sleep(3600)  # stay alive: the supervisor's kill ladder must end us


if __name__ == "__main__":
    main()
