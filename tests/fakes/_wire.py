"""Render one scripted `Turn` in each provider's wire format.

Four APIs, each streamed (SSE) and plain JSON:

- ``chat``: OpenAI chat completions (`data:` chunks with ``choices[0].delta``, ``[DONE]``);
- ``messages``: Anthropic Messages (SSE *with* ``event:`` lines — Claude Code silently retries
  without streaming when they are missing);
- ``responses``: OpenAI Responses (`data:` frames dispatched on their JSON ``type``);
- ``gemini``: Gemini ``generateContent`` / ``streamGenerateContent?alt=sse`` (Gemini CLI):
  each SSE frame a whole ``GenerateContentResponse`` whose parts are ``text`` or
  ``functionCall {name, args}`` (arguments are never split: the API sends them whole).

A tool call named ``namespace/name`` is sent in Responses as ``name`` in ``namespace`` (how Codex
offers an MCP server's tools: the namespace ``mcp__fleet``); the other APIs send the name as is.

Text and tool arguments are deliberately split over two deltas so clients' reassembly is
exercised. `Rendered.stall_at` is how many frames a stalled turn sends before going silent: the
opening frames up to and including the first text delta.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

import attrs

if TYPE_CHECKING:
    from tests.fakes._script import Turn

Api = Literal["chat", "messages", "responses", "gemini"]


@attrs.frozen(kw_only=True)
class Rendered:
    frames: tuple[bytes, ...]
    stall_at: int


@attrs.frozen(kw_only=True)
class Reply:
    """What the server needs to answer one model request, independent of the API."""

    turn: Turn
    model: str
    reply_id: str  # unique per served turn: "<child>-<index>"


def render_stream(api: Api, reply: Reply) -> Rendered:
    return {
        "chat": _chat_stream,
        "messages": _messages_stream,
        "responses": _responses_stream,
        "gemini": _gemini_stream,
    }[api](reply)


def render_json(api: Api, reply: Reply) -> dict[str, Any]:
    return {
        "chat": _chat_json,
        "messages": _messages_json,
        "responses": _responses_json,
        "gemini": _gemini_json,
    }[api](reply)


def error_json(api: Api, status: int, message: str) -> dict[str, Any]:
    """An error body in the provider's own shape, for faults scripted without a body."""
    if api == "messages":
        return {"type": "error", "error": {"type": "api_error", "message": message}}
    return {"error": {"message": message, "type": "server_error", "code": str(status)}}


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [part for part in (text[:middle], text[middle:]) if part]


def _data(payload: object) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _event(name: str, payload: object) -> bytes:
    return f"event: {name}\n".encode() + _data(payload)


def _call_id(reply: Reply, index: int, prefix: str) -> str:
    return f"{prefix}_{reply.reply_id}_{index}"


def _arguments(arguments: object) -> str:
    return json.dumps(arguments, separators=(",", ":"))


# --- OpenAI chat completions -------------------------------------------------------------------


def _chat_chunk(reply: Reply, delta: dict[str, Any], finish: str | None) -> bytes:
    return _data(
        {
            "id": f"chatcmpl-{reply.reply_id}",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": reply.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def _chat_usage(reply: Reply) -> dict[str, Any]:
    usage = reply.turn.usage
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
    }


def _chat_finish(turn: Turn) -> str:
    return "tool_calls" if turn.tool_calls else "stop"


def _chat_stream(reply: Reply) -> Rendered:
    turn = reply.turn
    frames = [_chat_chunk(reply, {"role": "assistant", "content": ""}, None)]
    frames += [_chat_chunk(reply, {"content": part}, None) for part in _halves(turn.text)]
    stall_at = 2 if turn.text else 1
    for index, call in enumerate(turn.tool_calls):
        head = {"index": index, "id": _call_id(reply, index, "call"), "type": "function"}
        head["function"] = {"name": call.name, "arguments": ""}
        frames.append(_chat_chunk(reply, {"tool_calls": [head]}, None))
        for part in _halves(_arguments(call.arguments)):
            piece = {"index": index, "function": {"arguments": part}}
            frames.append(_chat_chunk(reply, {"tool_calls": [piece]}, None))
    frames.append(_chat_chunk(reply, {}, _chat_finish(turn)))
    frames.append(
        _data(
            {
                "id": f"chatcmpl-{reply.reply_id}",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": reply.model,
                "choices": [],
                "usage": _chat_usage(reply),
            }
        )
    )
    frames.append(b"data: [DONE]\n\n")
    return Rendered(frames=tuple(frames), stall_at=stall_at)


def _chat_json(reply: Reply) -> dict[str, Any]:
    turn = reply.turn
    message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": _call_id(reply, index, "call"),
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for index, call in enumerate(turn.tool_calls)
        ]
    return {
        "id": f"chatcmpl-{reply.reply_id}",
        "object": "chat.completion",
        "created": 0,
        "model": reply.model,
        "choices": [{"index": 0, "message": message, "finish_reason": _chat_finish(turn)}],
        "usage": _chat_usage(reply),
    }


# --- Anthropic Messages ------------------------------------------------------------------------


def _messages_usage(reply: Reply) -> dict[str, Any]:
    usage = reply.turn.usage
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cache_read_tokens,
    }


def _messages_stop(turn: Turn) -> str:
    return "tool_use" if turn.tool_calls else "end_turn"


def _messages_stream(reply: Reply) -> Rendered:
    turn = reply.turn
    start = _messages_json(reply) | {"content": [], "stop_reason": None}
    start["usage"] = _messages_usage(reply) | {"output_tokens": 1}
    frames = [_event("message_start", {"type": "message_start", "message": start})]
    stall_at = 1
    index = 0
    if turn.text:
        block = {"type": "text", "text": ""}
        frames.append(_block_start(index, block))
        frames += [
            _block_delta(index, {"type": "text_delta", "text": p}) for p in _halves(turn.text)
        ]
        stall_at = 3
        frames.append(_block_stop(index))
        index += 1
    for number, call in enumerate(turn.tool_calls):
        block = {"type": "tool_use", "id": _call_id(reply, number, "toolu"), "name": call.name}
        frames.append(_block_start(index, block | {"input": {}}))
        frames += [
            _block_delta(index, {"type": "input_json_delta", "partial_json": part})
            for part in _halves(_arguments(call.arguments))
        ]
        frames.append(_block_stop(index))
        index += 1
    delta = {"stop_reason": _messages_stop(turn), "stop_sequence": None}
    usage = {"output_tokens": turn.usage.output_tokens}
    frames.append(
        _event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
    )
    frames.append(_event("message_stop", {"type": "message_stop"}))
    return Rendered(frames=tuple(frames), stall_at=stall_at)


def _block_start(index: int, block: dict[str, Any]) -> bytes:
    payload = {"type": "content_block_start", "index": index, "content_block": block}
    return _event("content_block_start", payload)


def _block_delta(index: int, delta: dict[str, Any]) -> bytes:
    payload = {"type": "content_block_delta", "index": index, "delta": delta}
    return _event("content_block_delta", payload)


def _block_stop(index: int) -> bytes:
    return _event("content_block_stop", {"type": "content_block_stop", "index": index})


def _messages_json(reply: Reply) -> dict[str, Any]:
    turn = reply.turn
    content: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text else []
    content += [
        {
            "type": "tool_use",
            "id": _call_id(reply, index, "toolu"),
            "name": call.name,
            "input": dict(call.arguments),
        }
        for index, call in enumerate(turn.tool_calls)
    ]
    return {
        "id": f"msg_{reply.reply_id}",
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": content,
        "stop_reason": _messages_stop(turn),
        "stop_sequence": None,
        "usage": _messages_usage(reply),
    }


# --- OpenAI Responses --------------------------------------------------------------------------


def _responses_items(reply: Reply) -> list[dict[str, Any]]:
    turn = reply.turn
    items: list[dict[str, Any]] = []
    if turn.text:
        part = {"type": "output_text", "text": turn.text, "annotations": []}
        items.append(
            {
                "type": "message",
                "id": f"msg_{reply.reply_id}",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for index, call in enumerate(reply.turn.tool_calls):
        namespace, _, name = call.name.rpartition("/")
        item = {
            "type": "function_call",
            "id": f"fc_{reply.reply_id}_{index}",
            "call_id": _call_id(reply, index, "call"),
            "name": name,
            "arguments": _arguments(call.arguments),
            "status": "completed",
        }
        if namespace:
            item["namespace"] = namespace
        items.append(item)
    return items


def _responses_json(reply: Reply) -> dict[str, Any]:
    usage = reply.turn.usage
    return {
        "id": f"resp_{reply.reply_id}",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": reply.model,
        "output": _responses_items(reply),
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cache_read_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total_tokens,
        },
    }


def _responses_stream(reply: Reply) -> Rendered:
    done = _responses_json(reply)
    created = done | {"status": "in_progress", "output": [], "usage": None}
    frames = [_data({"type": "response.created", "response": created})]
    stall_at = 1
    for position, item in enumerate(done["output"]):
        frames += _responses_item_frames(position, item)
        if item["type"] == "message":
            stall_at = 4  # created, item added, part added, first text delta
    frames.append(_data({"type": "response.completed", "response": done}))
    return Rendered(frames=tuple(frames), stall_at=stall_at)


def _responses_item_frames(position: int, item: dict[str, Any]) -> list[bytes]:
    where = {"output_index": position, "item_id": item["id"]}
    if item["type"] == "function_call":
        added = item | {"arguments": "", "status": "in_progress"}
        frames = [
            _data(
                {"type": "response.output_item.added", "output_index": position} | {"item": added}
            )
        ]
        frames += [
            _data({"type": "response.function_call_arguments.delta", "delta": part} | where)
            for part in _halves(item["arguments"])
        ]
        frames.append(
            _data(
                {"type": "response.function_call_arguments.done", "arguments": item["arguments"]}
                | where
            )
        )
    else:
        text = item["content"][0]["text"]
        empty = {"type": "output_text", "text": "", "annotations": []}
        added = item | {"status": "in_progress", "content": []}
        part = where | {"content_index": 0}
        frames = [
            _data({"type": "response.output_item.added", "output_index": position, "item": added}),
            _data({"type": "response.content_part.added", "part": empty} | part),
        ]
        frames += [
            _data({"type": "response.output_text.delta", "delta": piece} | part)
            for piece in _halves(text)
        ]
        frames.append(_data({"type": "response.output_text.done", "text": text} | part))
        frames.append(
            _data({"type": "response.content_part.done", "part": item["content"][0]} | part)
        )
    frames.append(
        _data({"type": "response.output_item.done", "output_index": position, "item": item})
    )
    return frames


# --- Gemini generateContent ---------------------------------------------------------------------


def _gemini_json(reply: Reply) -> dict[str, Any]:
    turn = reply.turn
    parts: list[dict[str, Any]] = [{"text": turn.text}] if turn.text else []
    parts += [
        {"functionCall": {"name": call.name, "args": dict(call.arguments)}}
        for call in turn.tool_calls
    ]
    usage = turn.usage
    return {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": {
            "promptTokenCount": usage.input_tokens,
            "candidatesTokenCount": usage.output_tokens,
            "cachedContentTokenCount": usage.cache_read_tokens,
            "totalTokenCount": usage.total_tokens,
        },
        "modelVersion": reply.model,
        "responseId": f"gen_{reply.reply_id}",
    }


def _gemini_stream(reply: Reply) -> Rendered:
    whole = _gemini_json(reply)
    frames: list[bytes] = []
    text = reply.turn.text
    if text:
        for part in _halves(text):
            piece = whole | {
                "candidates": [
                    {"content": {"role": "model", "parts": [{"text": part}]}, "index": 0}
                ]
            }
            frames.append(_data(piece))
    calls = [p for p in whole["candidates"][0]["content"]["parts"] if "functionCall" in p]
    last = whole | {
        "candidates": [whole["candidates"][0] | {"content": {"role": "model", "parts": calls}}]
    }
    frames.append(_data(last))
    return Rendered(frames=tuple(frames), stall_at=1)
