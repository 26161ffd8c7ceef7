"""The scripted model server: each wire format over plain HTTP, then the real CLIs against it."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import threading
import time
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from tests.fakes._agent_clis import (
    claude_command,
    codex_command,
    gemini_command,
    open_cli,
    opencode_command,
    pi_command,
)
from tests.fakes._script import ScriptError, ToolCall, Turn, Usage
from tests.fakes._wire import Api, Reply, render_json, render_stream
from tests.fakes.model_server import DEFAULT_CHILD, ModelServer

TEXT_AND_TOOL = {
    "text": "Reading the notes first.",
    "tool_calls": [{"name": "read", "arguments": {"path": "notes.txt", "limit": 20}}],
    "usage": {"input_tokens": 11, "output_tokens": 3, "cache_read_tokens": 2},
}

# --- a plain HTTP client and per-API decoders of what came back ---------------------------------


def post(
    srv: ModelServer, path: str, body: object, *, child: str = "a", query: str = ""
) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        target = f"/c/{child}{path}{query}" if child else f"{path}{query}"
        payload = json.dumps(body).encode()
        connection.request("POST", target, payload, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def sse(body: bytes) -> list[tuple[str | None, Any]]:
    """(event name or None, decoded data) per server-sent event; `[DONE]` stays a string."""
    events: list[tuple[str | None, Any]] = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            else:
                assert field == "data", f"unexpected SSE line {line!r}"
                data.append(value)
        joined = "\n".join(data)
        events.append((name, joined if joined == "[DONE]" else json.loads(joined)))
    return events


def decode_chat(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    assert events[-1] == (None, "[DONE]")
    text, finish, usage = "", None, None
    calls: dict[int, dict[str, str]] = {}
    for _, chunk in events[:-1]:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk["choices"]:
            delta = choice["delta"]
            text += delta.get("content") or ""
            for piece in delta.get("tool_calls", []):
                call = calls.setdefault(piece["index"], {"name": "", "arguments": ""})
                call["name"] += piece.get("function", {}).get("name", "")
                call["arguments"] += piece.get("function", {}).get("arguments", "")
            finish = choice["finish_reason"] or finish
    return {"text": text, "calls": _calls(calls), "stop": finish, "usage": usage}


def decode_messages(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    for name, data in events:
        assert name == data["type"], "every Anthropic event needs a matching event: line"
    text, calls, stop, usage = "", {}, None, None
    for _, data in events:
        if data["type"] == "message_start":
            usage = data["message"]["usage"]
        elif data["type"] == "content_block_start" and data["content_block"]["type"] == "tool_use":
            calls[data["index"]] = {"name": data["content_block"]["name"], "arguments": ""}
        elif data["type"] == "content_block_delta":
            delta = data["delta"]
            if delta["type"] == "text_delta":
                text += delta["text"]
            else:
                calls[data["index"]]["arguments"] += delta["partial_json"]
        elif data["type"] == "message_delta":
            stop = data["delta"]["stop_reason"]
            usage = usage | data["usage"]
    assert events[-1][0] == "message_stop"
    return {"text": text, "calls": _calls(calls), "stop": stop, "usage": usage}


def decode_responses(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    done = [data["item"] for _, data in events if data["type"] == "response.output_item.done"]
    deltas = "".join(d["delta"] for _, d in events if d["type"] == "response.output_text.delta")
    text = "".join(
        part["text"] for item in done if item["type"] == "message" for part in item["content"]
    )
    assert deltas == text, "streamed text deltas must add up to the finished message"
    calls = {
        n: {"name": item["name"], "arguments": item["arguments"]}
        for n, item in enumerate(i for i in done if i["type"] == "function_call")
    }
    completed = events[-1][1]
    assert completed["type"] == "response.completed"
    return {
        "text": text,
        "calls": _calls(calls),
        "stop": None,
        "usage": completed["response"]["usage"],
    }


def _calls(calls: dict[int, dict[str, str]]) -> list[tuple[str, Any]]:
    return [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]


# --- wire formats over HTTP ---------------------------------------------------------------------


def test_chat_completions_stream_splits_text_and_arguments_and_ends_with_usage_and_done():
    with ModelServer() as srv:
        srv.script("a", [TEXT_AND_TOOL])
        status, headers, body = post(
            srv, "/v1/chat/completions", {"model": "m1", "stream": True, "messages": []}
        )
    assert status == 200
    assert headers["content-type"] == "text/event-stream"
    events = sse(body)
    decoded = decode_chat(events)
    assert decoded["text"] == "Reading the notes first."
    assert decoded["calls"] == [("read", {"path": "notes.txt", "limit": 20})]
    assert decoded["stop"] == "tool_calls"
    assert decoded["usage"]["prompt_tokens"] == 11
    assert decoded["usage"]["completion_tokens"] == 3
    assert decoded["usage"]["total_tokens"] == 14
    argument_chunks = [
        c for _, c in events[:-1] for ch in c["choices"] for t in ch["delta"].get("tool_calls", [])
    ]
    assert len(argument_chunks) == 3, "a head chunk plus arguments split over two chunks"
    assert all(c["model"] == "m1" for _, c in events[:-1])


def test_chat_completions_without_stream_answer_one_json_completion():
    with ModelServer() as srv:
        srv.script("a", [{"text": "plain answer", "usage": {"input_tokens": 5}}])
        status, headers, body = post(srv, "/v1/chat/completions", {"model": "m", "messages": []})
    assert status == 200
    assert headers["content-type"] == "application/json"
    completion = json.loads(body)
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"] == {"role": "assistant", "content": "plain answer"}
    assert completion["choices"][0]["finish_reason"] == "stop"
    assert completion["usage"]["prompt_tokens"] == 5


def test_anthropic_messages_stream_has_event_lines_and_tool_use_stop():
    with ModelServer() as srv:
        srv.script("a", [TEXT_AND_TOOL])
        status, _, body = post(
            srv, "/v1/messages", {"model": "claude-x", "stream": True}, query="?beta=true"
        )
        recorded = srv.requests("a")
    assert status == 200
    events = sse(body)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    decoded = decode_messages(events)
    assert decoded["text"] == "Reading the notes first."
    assert decoded["calls"] == [("read", {"path": "notes.txt", "limit": 20})]
    assert decoded["stop"] == "tool_use"
    assert decoded["usage"]["input_tokens"] == 11
    assert decoded["usage"]["output_tokens"] == 3
    assert decoded["usage"]["cache_read_input_tokens"] == 2
    assert [(r.path, r.query, r.api, r.turn) for r in recorded] == [
        ("/v1/messages", "beta=true", "messages", 0)
    ]


def test_anthropic_messages_without_stream_answer_a_plain_message():
    with ModelServer() as srv:
        srv.script("a", [TEXT_AND_TOOL])
        status, _, body = post(srv, "/v1/messages", {"model": "claude-x", "stream": False})
    assert status == 200
    message = json.loads(body)
    assert message["type"] == "message"
    assert message["stop_reason"] == "tool_use"
    assert message["content"][0] == {"type": "text", "text": "Reading the notes first."}
    assert message["content"][1]["name"] == "read"
    assert message["content"][1]["input"] == {"path": "notes.txt", "limit": 20}


def test_head_is_404_recorded_and_takes_no_turn():
    with ModelServer() as srv:
        srv.script("a", [{"text": "first"}])
        connection = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        connection.request("HEAD", "/")
        response = connection.getresponse()
        assert (response.status, response.read()) == (404, b"")
        connection.close()
        _, _, body = post(srv, "/v1/messages", {"model": "m", "stream": False})
        recorded = srv.requests()
    assert json.loads(body)["content"][0]["text"] == "first"
    assert [(r.method, r.child, r.api, r.turn) for r in recorded] == [
        ("HEAD", DEFAULT_CHILD, None, None),
        ("POST", "a", "messages", 0),
    ]


def test_responses_stream_emits_items_and_a_completed_response_with_usage():
    with ModelServer() as srv:
        call = {"name": "exec_command", "arguments": {"cmd": "cat notes.txt"}}
        srv.script("a", [{"text": "Let me look.", "tool_calls": [call]}])
        status, _, body = post(srv, "/v1/responses", {"model": "gpt-x", "stream": True})
    assert status == 200
    events = sse(body)
    types = [data["type"] for _, data in events]
    assert types[0] == "response.created"
    assert types.count("response.output_item.done") == 2
    decoded = decode_responses(events)
    assert decoded["text"] == "Let me look."
    assert decoded["calls"] == [("exec_command", {"cmd": "cat notes.txt"})]
    assert decoded["usage"]["input_tokens"] == 100
    assert decoded["usage"]["total_tokens"] == 120
    call_item = next(
        d["item"] for _, d in events if d.get("item", {}).get("type") == "function_call"
    )
    assert call_item["call_id"].startswith("call_")


@pytest.mark.parametrize(
    ("decode", "path"),
    [
        (decode_chat, "/v1/chat/completions"),
        (decode_messages, "/v1/messages"),
        (decode_responses, "/v1/responses"),
    ],
)
@given(
    text=st.text(max_size=40),
    arguments=st.dictionaries(
        st.text(max_size=8),
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        max_size=4,
    ),
)
def test_streamed_turns_reassemble_exactly_in_every_format(decode, path, text, arguments):
    api: dict[str, Api] = {
        "/v1/chat/completions": "chat",
        "/v1/messages": "messages",
        "/v1/responses": "responses",
    }
    turn = Turn(text=text, tool_calls=(ToolCall(name="t", arguments=arguments),), usage=Usage())
    reply = Reply(turn=turn, model="m", reply_id="x-0")
    rendered = render_stream(api[path], reply)
    decoded = decode(sse(b"".join(rendered.frames)))
    assert decoded["text"] == text
    assert decoded["calls"] == [("t", arguments)]
    assert json.dumps(render_json(api[path], reply))  # the JSON form renders the same turn


def test_children_have_own_scripts_and_cursors_and_unscripted_ones_walk_the_default():
    with ModelServer() as srv:
        srv.script("a", [{"text": "a0"}, {"text": "a1"}])
        srv.script("b", [{"text": "b0"}])
        srv.default_script([{"text": "d0"}, {"text": "d1"}])

        def answer(child: str) -> str:
            _, _, body = post(srv, "/v1/messages", {"model": "m"}, child=child)
            return str(json.loads(body)["content"][0]["text"])

        answers = [answer("a"), answer("b"), answer("c"), answer("a"), answer("c"), answer("")]
        children = [r.child for r in srv.requests()]
    assert answers == ["a0", "b0", "d0", "a1", "d1", "d0"]
    assert children == ["a", "b", "c", "a", "c", DEFAULT_CHILD]


def test_base_url_embeds_the_child_and_rejects_ids_that_do_not_fit_a_path_segment():
    with ModelServer() as srv:
        assert srv.base_url("child-1") == f"http://127.0.0.1:{srv.port}/c/child-1"
        with pytest.raises(ValueError, match="child id 'a/b'"):
            srv.base_url("a/b")


def test_exhausted_script_answers_500_naming_the_child():
    with ModelServer() as srv:
        srv.script("a", [{"text": "only"}])
        post(srv, "/v1/chat/completions", {"model": "m"})
        status, _, body = post(srv, "/v1/chat/completions", {"model": "m"})
        turns = [r.turn for r in srv.requests("a")]
    assert status == 500
    assert "script for child 'a' is exhausted after 1 turns" in json.loads(body)["error"]["message"]
    assert turns == [0, None]


def test_status_fault_sends_the_scripted_body_or_an_error_in_the_api_shape():
    with ModelServer() as srv:
        srv.script("a", [{"status": 503, "body": "overloaded, try later"}, {"status": 529}])
        first = post(srv, "/v1/messages", {"model": "m", "stream": True})
        second = post(srv, "/v1/messages", {"model": "m", "stream": True})
    assert (first[0], first[2]) == (503, b"overloaded, try later")
    assert second[0] == 529
    assert json.loads(second[2])["error"]["type"] == "api_error"


def test_delay_holds_the_answer_but_records_the_request_at_once():
    with ModelServer() as srv:
        srv.script("a", [{"delay": 0.4, "text": "late"}])
        started = time.monotonic()
        _, _, body = post(srv, "/v1/chat/completions", {"model": "m"})
        elapsed = time.monotonic() - started
    assert json.loads(body)["choices"][0]["message"]["content"] == "late"
    assert 0.4 <= elapsed < 5


def test_a_held_turn_answers_only_once_released_and_its_request_is_recorded_at_once():
    with ModelServer() as srv:
        srv.script("a", [{"hold": True, "text": "let go"}, {"hold": True, "text": "again"}])
        answers: list[bytes] = []
        asking = threading.Thread(
            target=lambda: answers.append(post(srv, "/v1/chat/completions", {"model": "m"})[2])
        )
        asking.start()
        deadline = time.monotonic() + 10
        while not srv.requests("a"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        asking.join(0.5)
        assert asking.is_alive(), "a held turn answered before its release"
        srv.release()
        asking.join(10)
        _, _, later = post(srv, "/v1/chat/completions", {"model": "m"})  # released: no wait
    assert [json.loads(a)["choices"][0]["message"]["content"] for a in answers] == ["let go"]
    assert json.loads(later)["choices"][0]["message"]["content"] == "again"


def test_a_non_json_body_to_a_model_api_is_a_400_and_takes_no_turn():
    with ModelServer() as srv:
        srv.script("a", [{"text": "kept"}])
        connection = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        connection.request("POST", "/c/a/v1/responses", b"not json")
        response = connection.getresponse()
        assert response.status == 400
        assert b"not a JSON object" in response.read()
        connection.close()
        _, _, body = post(srv, "/v1/chat/completions", {"model": "m"})
        recorded = srv.requests("a")
    assert json.loads(body)["choices"][0]["message"]["content"] == "kept"
    assert [(r.body, r.raw, r.turn) for r in recorded[:1]] == [(None, b"not json", None)]
    assert recorded[1].turn == 0


def _raw_exchange(srv: ModelServer, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_an_oversized_body_is_refused_413_before_it_is_read():
    with ModelServer() as srv:
        head = b"POST /c/a/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000\r\n\r\n"
        answer = _raw_exchange(srv, head)
        assert srv.requests() == []
    assert answer.startswith(b"HTTP/1.1 413 ")


def test_an_oversized_or_malformed_head_is_refused():
    with ModelServer() as srv:
        huge = b"GET / HTTP/1.1\r\nX-Big: " + b"x" * 70_000 + b"\r\n\r\n"
        assert _raw_exchange(srv, huge).startswith(b"HTTP/1.1 431 ")
        assert _raw_exchange(srv, b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400 ")


async def test_async_server_keeps_a_connection_alive_across_requests():
    async with ModelServer() as srv:
        srv.script("a", [{"text": "one"}, {"text": "two"}])
        body = json.dumps({"model": "m"}).encode()
        request = b"POST /c/a/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (
            len(body),
            body,
        )
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", srv.port)
            async with stream:
                await stream.send_all(request + request)  # pipelined on one connection
                received = b""
                while received.count(b'"type": "message"') < 2:
                    chunk = await stream.receive_some(65536)
                    assert chunk, "server closed a keep-alive connection"
                    received += chunk
    assert received.count(b"HTTP/1.1 200 OK") == 2
    assert received.index(b'"one"') < received.index(b'"two"')


async def test_stall_sends_headers_and_first_text_then_nothing_until_close():
    srv = ModelServer()
    await trio.to_thread.run_sync(srv.start)
    try:
        srv.script("a", [{"stall": True, "text": "partial answer"}])
        body = json.dumps({"model": "m", "stream": True}).encode()
        request = b"POST /c/a/v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%b" % (
            len(body),
            body,
        )
        with trio.fail_after(15):
            stream = await trio.open_tcp_stream("127.0.0.1", srv.port)
            await stream.send_all(request)
            received = b""
            while b'"content":"partial"' not in received:
                received += await stream.receive_some(65536)
            with trio.move_on_after(0.5) as quiet:
                received += await stream.receive_some(65536)
            assert quiet.cancelled_caught, "a stalled stream must go silent after its first chunk"
            await trio.to_thread.run_sync(srv.close)
            rest = await stream.receive_some(65536)
            await stream.aclose()
    finally:
        await trio.to_thread.run_sync(srv.close)
    assert received.startswith(b"HTTP/1.1 200 OK")
    assert b" answer" not in received
    assert rest == b"", "closing the server must end the stalled stream"


def test_request_records_headers_body_and_tool_results_of_each_api():
    chat = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "tool", "tool_call_id": "c1", "content": "out-1"},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "out-2"}]},
        ]
    }
    messages = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "tool_result", "content": "r-1"}]},
            {"role": "user", "content": [{"type": "tool_result", "content": [{"text": "r-2"}]}]},
        ]
    }
    responses = {"input": [{"type": "function_call_output", "call_id": "c", "output": "o-1"}]}
    with ModelServer() as srv:
        srv.script("a", [{"text": ""}] * 3)
        post(srv, "/v1/chat/completions", chat)
        post(srv, "/v1/messages", messages)
        post(srv, "/v1/responses", responses)
        recorded = srv.requests("a")
    assert [r.tool_results() for r in recorded] == [["out-1", "out-2"], ["r-1", "r-2"], ["o-1"]]
    assert recorded[0].headers["content-type"] == "application/json"
    assert recorded[2].body == responses
    assert json.loads(recorded[2].raw) == responses


@pytest.mark.parametrize(
    ("turn", "message"),
    [
        ({"txt": "x"}, "turn 0: unknown key 'txt'"),
        ({"status": 200}, "status must be an HTTP error code 400-599"),
        ({"body": "x"}, "body is only sent with a status"),
        ({"status": 500, "text": "x"}, "cannot also carry text"),
        ({"delay": -1}, "delay must be a finite number"),
        ({"hold": 1}, "hold must be"),
        ({"tool_calls": [{"name": ""}]}, "tool_calls[0]: name must be a non-empty string"),
        ({"usage": {"input_tokens": -1}}, "input_tokens must be an int >= 0"),
    ],
)
def test_malformed_script_turns_are_rejected_with_the_turn_named(turn, message):
    srv = ModelServer()
    with pytest.raises(ScriptError) as caught:
        srv.script("a", [turn])
    assert message in str(caught.value)


def test_a_string_is_not_a_script():
    with pytest.raises(ScriptError, match="turn 0: expected a dict, got str"):
        ModelServer().script("a", "hello")  # type: ignore[arg-type]


# --- the real CLIs, fully offline ---------------------------------------------------------------

NOTES = "the secret is 4217\n"
FINAL = "The secret is 4217."
# Distinct usage per turn so the CLIs' usage sums are observable.
TOOL_TURN_USAGE = {"input_tokens": 11, "output_tokens": 3}
FINAL_TURN = {"text": FINAL, "usage": {"input_tokens": 17, "output_tokens": 5}}


@pytest.fixture
def workspace(tmp_path):
    path = tmp_path / "ws"
    path.mkdir()
    (path / "notes.txt").write_text(NOTES)
    return path


def assert_served_two_turns(srv: ModelServer, child: str, api: str) -> None:
    model_calls = [r for r in srv.requests() if r.api is not None]
    assert [(r.child, r.api, r.turn, r.stream) for r in model_calls] == [
        (child, api, 0, True),
        (child, api, 1, True),
    ]
    assert model_calls[0].tool_results() == []
    assert any(NOTES.strip() in result for result in model_calls[1].tool_results())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("binary", "settled"),
    [
        pytest.param("pi", "agent_end", marks=pytest.mark.needs("pi")),
        pytest.param("pi-next", "agent_settled", marks=pytest.mark.needs("pi-next")),
    ],
)
async def test_pi_rpc_reads_a_file_with_its_read_tool_then_answers(
    tmp_path, workspace, binary, settled
):
    async with ModelServer() as srv:
        read = {"name": "read", "arguments": {"path": "notes.txt"}}
        srv.script("pi", [{"tool_calls": [read], "usage": TOOL_TURN_USAGE}, FINAL_TURN])
        command = pi_command(
            base_url=srv.base_url("pi"), workspace=workspace, state_dir=tmp_path, binary=binary
        )
        with trio.fail_after(60):
            async with open_cli(command, tmp_path / "pi.stderr") as pi:
                await pi.send({"id": "state", "type": "get_state"})
                state = await pi.until(lambda e: e.get("id") == "state")
                await pi.send({"id": "p1", "type": "prompt", "message": "What is the secret?"})
                await pi.until(lambda e: e["type"] == settled)
                returncode = await pi.finish()
    assert state["success"] is True
    assert state["data"]["model"]["id"] == "fake-model"
    prompt = next(e for e in pi.events if e.get("id") == "p1")
    assert prompt["success"] is True
    tool_end = next(e for e in pi.events if e["type"] == "tool_execution_end")
    assert (tool_end["toolName"], tool_end["isError"]) == ("read", False)
    assistant = [
        e["message"]
        for e in pi.events
        if e["type"] == "message_end" and e["message"]["role"] == "assistant"
    ]
    assert [m["stopReason"] for m in assistant] == ["toolUse", "stop"]
    assert assistant[-1]["content"] == [{"type": "text", "text": FINAL}]
    assert (assistant[0]["usage"]["input"], assistant[-1]["usage"]["output"]) == (11, 5)
    assert assistant[-1]["usage"]["cost"]["input"] == pytest.approx(17 / 1e6)
    assert returncode == 0
    assert_served_two_turns(srv, "pi", "chat")


@pytest.mark.slow
@pytest.mark.needs("claude")
@pytest.mark.parametrize("bare", [False, True], ids=["full", "bare"])
async def test_claude_stream_json_reads_a_file_with_read_then_answers(tmp_path, workspace, bare):
    async with ModelServer() as srv:
        read = {"name": "Read", "arguments": {"file_path": str(workspace / "notes.txt")}}
        srv.script("claude", [{"tool_calls": [read], "usage": TOOL_TURN_USAGE}, FINAL_TURN])
        command = claude_command(
            base_url=srv.base_url("claude"), workspace=workspace, state_dir=tmp_path, bare=bare
        )
        with trio.fail_after(60):
            async with open_cli(command, tmp_path / "claude.stderr") as claude:
                question = {"role": "user", "content": "What is the secret?"}
                await claude.send({"type": "user", "message": question})
                result = await claude.until(lambda e: e["type"] == "result")
                returncode = await claude.finish()
    init = claude.events[0]
    assert (init["type"], init["subtype"]) == ("system", "init")
    assert "Read" in init["tools"]
    assert result["is_error"] is False
    assert result["result"] == FINAL
    assert result["num_turns"] == 2
    assert result["usage"]["input_tokens"] == 11 + 17
    assert returncode == 0
    assert_served_two_turns(srv, "claude", "messages")
    head, *model_calls = srv.requests("claude")
    assert (head.method, head.path) == ("HEAD", "/"), "the startup probe of the base URL"
    assert [r.query for r in model_calls] == ["beta=true", "beta=true"]
    assert {r.headers["x-claude-code-session-id"] for r in model_calls} == {init["session_id"]}


@pytest.mark.slow
@pytest.mark.needs("codex")
async def test_codex_exec_runs_exec_command_then_answers(tmp_path, workspace):
    async with ModelServer() as srv:
        call = {"name": "exec_command", "arguments": {"cmd": "cat notes.txt"}}
        srv.script("codex", [{"tool_calls": [call], "usage": TOOL_TURN_USAGE}, FINAL_TURN])
        command = codex_command(
            base_url=srv.base_url("codex"),
            workspace=workspace,
            state_dir=tmp_path,
            prompt="What is the secret?",
        )
        with trio.fail_after(60):
            done = await trio.run_process(
                list(command.argv),
                cwd=command.cwd,
                env=dict(command.env),
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    events = [json.loads(line) for line in done.stdout.split(b"\n") if line.strip()]
    types = [e["type"] for e in events]
    assert types[0] == "thread.started"
    assert types[-1] == "turn.completed"
    items = [e["item"] for e in events if e["type"] == "item.completed"]
    command_item = next(i for i in items if i["type"] == "command_execution")
    assert (command_item["exit_code"], command_item["aggregated_output"]) == (0, NOTES)
    assert [i["text"] for i in items if i["type"] == "agent_message"] == [FINAL]
    usage = events[-1]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (11 + 17, 3 + 5)
    assert_served_two_turns(srv, "codex", "responses")


def test_gemini_generate_content_streams_whole_responses_and_records_function_results():
    with ModelServer() as srv:
        call = {"name": "read_file", "arguments": {"file_path": "notes.txt"}}
        srv.script("a", [{"text": "looking", "tool_calls": [call]}, {"text": FINAL}])
        path = "/v1beta/models/fake-model:streamGenerateContent"
        tools = [{"functionDeclarations": [{"name": "read_file", "parametersJsonSchema": {}}]}]
        status, headers, body = post(srv, path, {"contents": [], "tools": tools}, query="?alt=sse")
        assert status == 200
        assert headers["content-type"].startswith("text/event-stream")
        frames = [data for _, data in sse(body)]
        text = "".join(
            p.get("text", "") for f in frames for p in f["candidates"][0]["content"]["parts"]
        )
        assert text == "looking"
        [called] = [
            p["functionCall"]
            for f in frames
            for p in f["candidates"][0]["content"]["parts"]
            if "functionCall" in p
        ]
        assert called == {"name": "read_file", "args": {"file_path": "notes.txt"}}
        assert frames[-1]["candidates"][0]["finishReason"] == "STOP"
        result = {"functionResponse": {"name": "read_file", "response": {"output": NOTES}}}
        contents = [{"role": "user", "parts": [result]}]
        status, _, body = post(srv, path.replace("streamG", "g"), {"contents": contents})
        assert status == 200
        assert json.loads(body)["candidates"][0]["content"]["parts"] == [{"text": FINAL}]
        first, second = srv.requests("a")
        assert (first.api, first.stream, first.tool_names()) == ("gemini", True, ["read_file"])
        assert (second.stream, second.tool_results()) == (False, [NOTES])


def test_a_played_child_is_answered_by_its_player_from_the_request():
    seen = []

    def player(request):
        seen.append((request.tool_names(), request.tool_results()))
        if request.tool_results():
            return {"text": "done"}
        return {"tool_calls": [{"name": "mcp__fleet/spawn", "arguments": {"task": "x"}}]}

    with ModelServer() as srv:
        srv.play("p", player)
        tools = [{"type": "namespace", "name": "mcp__fleet", "tools": [{"name": "spawn"}]}]
        status, _, body = post(srv, "/v1/responses", {"input": [], "tools": tools}, child="p")
        [item] = json.loads(body)["output"]
        assert (item["namespace"], item["name"]) == ("mcp__fleet", "spawn")
        answer = {"type": "function_call_output", "call_id": item["call_id"], "output": "ok"}
        status, _, body = post(srv, "/v1/responses", {"input": [answer]}, child="p")
        assert status == 200
        assert json.loads(body)["output"][0]["content"][0]["text"] == "done"
    assert seen == [(["mcp__fleet/spawn"], []), ([], ["ok"])]
    assert [r.turn for r in srv.requests("p")] == [0, 1]


@pytest.mark.slow
@pytest.mark.needs("gemini")
async def test_gemini_cli_reads_a_file_with_read_file_then_answers(tmp_path, workspace):
    async with ModelServer() as srv:
        call = {"name": "read_file", "arguments": {"file_path": str(workspace / "notes.txt")}}
        srv.script("gemini", [{"tool_calls": [call], "usage": TOOL_TURN_USAGE}, FINAL_TURN])
        command = gemini_command(
            base_url=srv.base_url("gemini"),
            workspace=workspace,
            state_dir=tmp_path,
            prompt="What is the secret?",
        )
        with trio.fail_after(120):
            done = await trio.run_process(
                list(command.argv),
                cwd=command.cwd,
                env=dict(command.env),
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert json.loads(done.stdout)["response"] == FINAL
    requests = [r for r in srv.requests("gemini") if r.api is not None]
    assert [(r.api, r.turn, r.stream) for r in requests] == [
        ("gemini", 0, True),
        ("gemini", 1, True),
    ]
    assert requests[1].tool_results() == [NOTES]


@pytest.mark.slow
@pytest.mark.needs("opencode")
async def test_opencode_run_reads_a_file_with_read_then_answers(tmp_path, workspace):
    async with ModelServer() as srv:
        read = {"name": "read", "arguments": {"filePath": str(workspace / "notes.txt")}}

        def player(request):  # opencode also asks for a title, with no tools offered
            if not request.tool_names():
                return {"text": "a title"}
            return FINAL_TURN if request.tool_results() else {"tool_calls": [read]}

        srv.play("opencode", player)
        command = opencode_command(
            base_url=srv.base_url("opencode"),
            workspace=workspace,
            state_dir=tmp_path,
            prompt="What is the secret?",
        )
        with trio.fail_after(120):
            done = await trio.run_process(
                list(command.argv),
                cwd=command.cwd,
                env=dict(command.env),
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert FINAL in done.stdout.decode()
    with_tools = [r for r in srv.requests("opencode") if r.api == "chat" and r.tool_names()]
    assert "the secret is 4217" in with_tools[-1].tool_results()[-1]
    assert not (workspace / "opencode.json").exists()
