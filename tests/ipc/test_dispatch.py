"""Where a channel's reader sends each request: the immediate handler, the worker, a task."""

import pytest
import trio
import trio.testing

import ipc
from ipc import ChannelClosed, RemoteError, Reply


async def serve_immediate(nursery, channel, immediate, handler=None):
    served = []

    async def handle(envelope):
        served.append(envelope.type)
        return Reply(ok=True, data={"by": "handler"})

    async def on_event(envelope):
        return None

    async def run(*, task_status=trio.TASK_STATUS_IGNORED):
        await channel.serve(
            handler or handle, on_event, immediate=immediate, task_status=task_status
        )

    await nursery.start(run)
    return served


async def test_an_immediate_handler_answers_and_none_passes_to_the_handler(
    connect, serve_channel, nursery
):
    def immediate(body):
        if isinstance(body, ipc.Ownership):
            return Reply(ok=True, data={"by": "immediate"})
        return None

    pair = await connect()
    served = await serve_immediate(nursery, pair.server, immediate)
    await serve_channel(nursery, pair.client)
    with trio.fail_after(10):
        assert await pair.client.request(ipc.Ownership(paths=["a"])) == Reply(
            ok=True, data={"by": "immediate"}
        )
        assert await pair.client.request(ipc.Steer(text="x")) == Reply(
            ok=True, data={"by": "handler"}
        )
    assert served == ["steer"]


async def test_a_failing_immediate_handler_answers_with_an_error_and_keeps_serving(
    connect, serve_channel, nursery
):
    def immediate(body):
        if body == ipc.Ownership(paths=["a"]):
            raise RuntimeError("lock table broke")
        return Reply(ok=True)

    pair = await connect()
    await serve_immediate(nursery, pair.server, immediate)
    await serve_channel(nursery, pair.client)
    with trio.fail_after(10):
        with pytest.raises(RemoteError, match="ownership failed: lock table broke"):
            await pair.client.request(ipc.Ownership(paths=["a"]))
        assert await pair.client.request(ipc.Abort()) == Reply(ok=True)


async def test_an_immediate_answer_is_recorded_for_replays(wire, nursery):
    calls = []

    def immediate(body):
        calls.append(body)
        return Reply(ok=True, data={"n": len(calls)})

    left, right = trio.testing.memory_stream_pair()
    server = ipc.Channel(stream=left, owner="a1", token=wire.token())
    await serve_immediate(nursery, server, immediate)
    request = wire.frame(ipc.Ownership(paths=["a"]), corr="7")
    decoder = ipc.FrameDecoder()

    async def exchange():
        await right.send_all(request)
        frames: list[bytes] = []
        while not frames:
            frames = decoder.feed(await right.receive_some())
        return frames

    with trio.fail_after(10):
        first = await exchange()
        second = await exchange()
    assert first == second
    assert ipc.decode_envelope(first[0]).body == Reply(ok=True, data={"n": 1})
    assert calls == [ipc.Ownership(paths=["a"])]


async def test_a_slow_handler_does_not_delay_the_next_request(connect, serve_channel, nursery):
    release = trio.Event()

    async def handler(envelope):
        if isinstance(envelope.body, ipc.Prompt):
            await release.wait()
        return Reply(ok=True, data={"type": envelope.type})

    pair = await connect()
    await serve_channel(nursery, pair.server, handler)
    await serve_channel(nursery, pair.client)
    answers = []

    async def slow():
        answers.append(await pair.client.request(ipc.Prompt(text="x", turn=1), timeout=60))

    with trio.fail_after(10):
        async with trio.open_nursery() as waiting:
            waiting.start_soon(slow)
            await trio.testing.wait_all_tasks_blocked()
            # The worker task is stuck in the prompt: each of these gets a task of its own.
            answers.extend([await pair.client.request(ipc.Steer(text="y")) for _ in range(3)])
            release.set()
    assert [answer.data["type"] for answer in answers] == ["steer"] * 3 + ["prompt"]


async def test_a_writer_queued_behind_a_torn_frame_never_writes():
    left, right = trio.socket.socketpair()
    channel = ipc.Channel(stream=trio.SocketStream(left), owner="a1", token="t" * 64)
    peer = trio.SocketStream(right)
    outcome = []

    async def second_writer():
        try:
            await channel.send_event(ipc.Event(activity="status", text="queued"))
        except ChannelClosed as exc:
            outcome.append(str(exc))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            with trio.move_on_after(0.2):
                nursery.start_soon(second_writer)  # parks behind the big frame below
                await channel.send_event(ipc.Event(activity="status", text="x" * 900_000))
    assert channel.close_reason == "send cancelled mid-frame"
    assert outcome == ["channel to a1 is closed (send cancelled mid-frame)"]
    await channel.aclose()
    await peer.aclose()
