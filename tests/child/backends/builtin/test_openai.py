"""The builtin agent's ``openai`` model against the scripted model server (and a raw server)."""

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
import trio

import ipc
from child.backends.builtin import BuiltinBackend
from child.backends.builtin._model import ModelError, SteerInbox, StepContext
from child.backends.builtin._openai import ModelHttpError, OpenAIModel, retry_after, server_message
from tests.child.backends._backends import Host, make_loadout
from tests.fakes.model_server import ModelServer

TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def context(events=None):
    return StepContext(
        messages=[{"role": "user", "content": "go"}],
        tools=TOOLS,
        turn=1,
        side=False,
        task="go",
        steers=SteerInbox(),
        emit=(events if events is not None else []).append,
    )


def model_for(srv, child="a", **fields):
    return OpenAIModel(base_url=f"{srv.base_url(child)}/v1", name="fake-model", **fields)


async def test_a_streamed_step_reassembles_text_tool_calls_and_usage():
    events: list[ipc.Event] = []
    async with ModelServer() as srv:
        srv.script(
            "a",
            [
                {
                    "text": "Let me look.",
                    "tool_calls": [
                        {"name": "read", "arguments": {"path": "notes.txt"}},
                        {"name": "ls", "arguments": {}},
                    ],
                    "usage": {"input_tokens": 30, "output_tokens": 12},
                }
            ],
        )
        model = model_for(srv)
        try:
            with trio.fail_after(10):
                step = await model.step(context(events))
        finally:
            await model.aclose()
        [request] = srv.requests("a")
    assert step.text == "Let me look."
    assert [(c.name, c.args) for c in step.tool_calls] == [
        ("read", {"path": "notes.txt"}),
        ("ls", {}),
    ]
    assert len({c.id for c in step.tool_calls}) == 2
    assert step.usage == ipc.Usage(tokens=42, input_tokens=30, output_tokens=12, model="fake-model")
    assert events[-1] == ipc.Event(activity="message", text="Let me look.")
    assert request.stream
    assert request.body["model"] == "fake-model"
    assert request.body["tools"] == TOOLS
    assert "authorization" not in request.headers


async def test_the_key_comes_from_the_named_variable(monkeypatch):
    monkeypatch.setenv("FLEET_TEST_OPENAI_KEY", "sk-from-env")
    async with ModelServer() as srv:
        srv.script("a", [{"text": "hi"}])
        model = model_for(srv, api_key_env="FLEET_TEST_OPENAI_KEY")
        with trio.fail_after(10):
            await model.step(context())
        await model.aclose()
        [request] = srv.requests("a")
    assert request.headers["authorization"] == "Bearer sk-from-env"


@pytest.mark.slow
async def test_a_scout_with_the_openai_model_reads_and_reports(tmp_path):
    async with ModelServer() as srv:
        srv.script(
            "a",
            [
                {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]},
                {"text": "## Summary\nThe secret is 4217."},
            ],
        )
        spec = ipc.ModelSpec(kind="openai", name="fake-model", base_url=f"{srv.base_url('a')}/v1")
        host = Host()
        backend = BuiltinBackend.from_loadout(make_loadout(tmp_path, model=spec), host)
        try:
            with trio.fail_after(20):
                result = await backend.run_turn("find the secret")
        finally:
            await backend.aclose()
        second = srv.requests("a")[1]
    assert (result.ok, result.text) == (True, "## Summary\nThe secret is 4217.")
    assert second.tool_results() == ["     1\tthe secret is 4217\n"]
    assert [e.tool for e in host.activities("tool_start")] == ["read"]
    # Two steps of the fake's default 100 in / 20 out: the child's life total, not the last step.
    assert host.activities("usage")[-1].usage == ipc.Usage(
        tokens=240, input_tokens=200, output_tokens=40, model="fake-model"
    )


async def test_a_500_is_retried_then_fails_in_one_line_with_the_servers_message():
    async with ModelServer() as srv:
        srv.script("a", [{"status": 500, "body": "upstream exploded"}] * 3)
        model = model_for(srv, backoff=0.05)
        start = trio.current_time()
        with trio.fail_after(10), pytest.raises(ModelHttpError) as caught:
            await model.step(context())
        elapsed = trio.current_time() - start
        await model.aclose()
        assert len(srv.requests("a")) == 3
    error = caught.value
    assert error.status == 500
    assert str(error) == (
        f"openai: POST {model.url} → HTTP 500: upstream exploded (after 3 attempts)"
    )
    assert elapsed < 5


async def test_a_400_is_not_retried_and_shows_the_json_error_message():
    async with ModelServer() as srv:
        srv.script("a", [{"status": 400}])
        model = model_for(srv)
        with (
            trio.fail_after(10),
            pytest.raises(
                ModelHttpError,
                match=r"HTTP 400: model server: scripted fault \(a-0\)$",
            ),
        ):
            await model.step(context())
        await model.aclose()
        assert len(srv.requests("a")) == 1


async def test_a_401_without_the_key_says_which_variable_to_set(monkeypatch):
    monkeypatch.delenv("FLEET_TEST_MISSING_KEY", raising=False)
    async with ModelServer() as srv:
        srv.script("a", [{"status": 401, "body": '{"error": {"message": "no key"}}'}])
        model = model_for(srv, api_key_env="FLEET_TEST_MISSING_KEY")
        with (
            trio.fail_after(10),
            pytest.raises(ModelHttpError, match=r"no key \(set FLEET_TEST_MISSING_KEY\)"),
        ):
            await model.step(context())
        await model.aclose()


async def test_a_stalled_stream_fails_after_the_stall_timeout():
    async with ModelServer() as srv:
        srv.script("a", [{"stall": True, "text": "partial words"}])
        model = model_for(srv, stall=1.0)
        start = trio.current_time()
        with trio.fail_after(10), pytest.raises(ModelError, match=r"no data for 1 s \(stalled"):
            await model.step(context())
        waited = trio.current_time() - start
        assert waited >= 1.0
        assert waited < 5
        await model.aclose()


async def test_a_refused_connection_is_retried_then_names_the_endpoint():
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()  # nothing listens there now
    model = OpenAIModel(base_url=f"http://127.0.0.1:{port}/v1", name="m", backoff=0.01)
    with trio.fail_after(10), pytest.raises(ModelError) as caught:
        await model.step(context())
    await model.aclose()
    message = str(caught.value)
    assert message.startswith(
        f"openai: POST http://127.0.0.1:{port}/v1/chat/completions: ConnectError"
    )
    assert message.endswith("(is the server up?) (after 3 attempts)")


async def _raw_server(responses, task_status=trio.TASK_STATUS_IGNORED):
    """Answer each connection with the next raw HTTP response, recording arrival times."""
    arrivals: list[float] = []

    async def handle(stream):
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(
                next(
                    line.split(b":")[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
            )
            while len(body) < length:
                body += await stream.receive_some(65536)
            arrivals.append(trio.current_time())
            await stream.send_all(responses[len(arrivals) - 1])

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started((listeners[0].socket.getsockname()[1], arrivals))
    await trio.serve_listeners(handle, listeners)


def _http(status, body, **headers):
    lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    lines += ["Content-Type: application/json"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def test_retry_after_is_honoured(nursery):
    completion = b'{"choices": [{"message": {"content": "done"}}], "usage": {"total_tokens": 5}}'
    port, arrivals = await nursery.start(
        _raw_server,
        [
            _http(429, b'{"error": {"message": "slow down"}}', retry_after="1"),
            _http(200, completion),
        ],
    )
    model = OpenAIModel(base_url=f"http://127.0.0.1:{port}/v1", name="m", backoff=0.01)
    with trio.fail_after(10):
        step = await model.step(context())
    await model.aclose()
    assert (step.text, step.usage) == ("done", ipc.Usage(tokens=5))
    assert len(arrivals) == 2
    assert arrivals[1] - arrivals[0] >= 1.0


async def test_a_retry_after_beyond_the_cap_fails_at_once(nursery):
    port, arrivals = await nursery.start(_raw_server, [_http(503, b"busy", retry_after="3600")])
    model = OpenAIModel(base_url=f"http://127.0.0.1:{port}/v1", name="m")
    with (
        trio.fail_after(10),
        pytest.raises(
            ModelHttpError, match=r"HTTP 503: busy \(the server asks to retry after 3600 s\)$"
        ),
    ):
        await model.step(context())
    await model.aclose()
    assert len(arrivals) == 1


def test_retry_after_parses_seconds_and_dates():
    assert retry_after("2.5") == 2.5
    assert retry_after(None) is None
    assert retry_after("soon") is None
    later = format_datetime(datetime.now(tz=UTC) + timedelta(seconds=60), usegmt=True)
    assert 50 < (retry_after(later) or 0) <= 60


def test_server_message_prefers_the_json_error_and_stays_one_line():
    assert server_message(b'{"error": {"message": "bad\\nthing"}}') == "bad thing"
    assert server_message(b"plain\ntext") == "plain text"
    assert server_message(b"") == "(empty body)"


@pytest.mark.parametrize(("effort", "sent"), [("", None), ("off", None), ("xhigh", "high")])
async def test_the_loadout_effort_is_sent_as_reasoning_effort(effort, sent):
    async with ModelServer() as srv:
        srv.script("a", [{"text": "ok"}])
        spec = ipc.ModelSpec(kind="openai", name="m", base_url=f"{srv.base_url('a')}/v1")
        model = OpenAIModel.from_spec(spec, effort=effort)
        try:
            with trio.fail_after(10):
                await model.step(context())
        finally:
            await model.aclose()
        [request] = srv.requests("a")
    assert request.body.get("reasoning_effort") == sent
