"""The ``openai`` model: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM,
llama.cpp, Ollama, OpenRouter), streamed, with tool calling.

- ``POST {base_url}/chat/completions`` with ``stream: true`` and usage requested; text
  deltas become ``message`` activity, tool-call deltas are reassembled by index.
- Retries are bounded: HTTP 429 and 5xx and dropped connections are retried
  :attr:`OpenAIModel.retries` times with exponential backoff, honouring ``Retry-After`` up to
  :data:`MAX_RETRY_AFTER` (a longer wait fails at once and says so).
- A stall timeout: no bytes for ``stall`` seconds (before or during the stream) fails the step.
- Errors are one line: the status, the endpoint, the server's own message, what to do.
- The key is read from the environment variable the model spec *names* (never stored in the
  loadout); without one no ``Authorization`` header is sent (local servers need none).

The SSE stream is split on ``\\n`` bytes (:mod:`child.backends._jsonl`), not with
``str.splitlines``, which would also split on U+2028 inside a JSON string.
"""

import datetime as dt
import json
import os
from email.utils import parsedate_to_datetime
from typing import Any, Final

import attrs
import httpx
import trio

import ipc
from child.backends._cli_env import stall_seconds
from child.backends._egress import proxy_for
from child.backends._jsonl import LineSplitter, Oversize
from child.backends._usage import openai_usage
from child.backends.builtin._model import ModelError, ModelStep, StepContext, ToolCall

RETRIES: Final = 2
BACKOFF: Final = 0.5
MAX_BACKOFF: Final = 8.0
MAX_RETRY_AFTER: Final = 30.0
_RETRIED: Final = frozenset({408, 409, 429})
#: Our effort words as chat completions' ``reasoning_effort`` ("off": not sent).
REASONING_EFFORTS: Final = {
    "minimal": "minimal",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
}


class ModelHttpError(ModelError):
    """The endpoint answered with an error status (after any retries)."""

    def __init__(self, message: str, *, status: int, url: str) -> None:
        super().__init__(message)
        self.status = status
        self.url = url


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - dt.datetime.now(tz=dt.UTC)).total_seconds())


def server_message(body: bytes) -> str:
    """The server's own error text: ``error.message`` of a JSON body, else the body."""
    text = body.decode(errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict) and error.get("message"):
            text = str(error["message"])
        elif isinstance(error, str):
            text = error
    line = " ".join(text.split())
    return line[:300] if line else "(empty body)"


@attrs.define(eq=False)
class _Stream:
    """Reassembles one streamed completion."""

    text: str = ""
    calls: dict[int, dict[str, str]] = attrs.Factory(dict)
    usage: dict[str, Any] | None = None
    model: str = ""
    finish: str | None = None
    done: bool = False

    def feed(self, chunk: dict[str, Any], ctx: StepContext) -> None:
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.text += str(delta["content"])
                lines = self.text.strip().splitlines()
                ctx.emit(ipc.Event(activity="message", text=lines[-1][:120] if lines else ""))
            for call in delta.get("tool_calls") or []:
                slot = self.calls.setdefault(int(call.get("index", 0)), {"arguments": ""})
                function = call.get("function") or {}
                if call.get("id"):
                    slot["id"] = str(call["id"])
                if function.get("name"):
                    slot["name"] = str(function["name"])
                slot["arguments"] += str(function.get("arguments") or "")
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])

    def step(self) -> ModelStep:
        calls = []
        for index in sorted(self.calls):
            slot = self.calls[index]
            try:
                args = json.loads(slot["arguments"] or "{}")
            except ValueError:
                args = {"_invalid_arguments": slot["arguments"][:2000]}
            calls.append(
                ToolCall(
                    id=slot.get("id") or f"call_{index}",
                    name=slot.get("name", ""),
                    args=args if isinstance(args, dict) else {"value": args},
                )
            )
        usage = None if self.usage is None else openai_usage(self.usage, self.model)
        return ModelStep(text=self.text, tool_calls=tuple(calls), usage=usage)


@attrs.define(eq=False)
class OpenAIModel:
    """Model ``openai``: ``base_url`` (with ``/v1``), ``name``, the key's variable name."""

    base_url: str
    name: str
    api_key_env: str = ""
    stall: float = attrs.Factory(stall_seconds)
    retries: int = RETRIES
    backoff: float = BACKOFF
    #: ``reasoning_effort`` sent with every request ("": none, the endpoint's default).
    effort: str = ""
    _client: httpx.AsyncClient | None = None

    @classmethod
    def from_spec(cls, spec: ipc.ModelSpec, *, effort: str = "") -> "OpenAIModel":
        if not spec.base_url or not spec.name:
            raise ModelError("openai model: needs a base URL and a model name (openai:MODEL@URL)")
        return cls(
            base_url=spec.base_url.rstrip("/"),
            name=spec.name,
            api_key_env=spec.api_key_env,
            effort=REASONING_EFFORTS.get(effort, ""),
        )

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _body(self, ctx: StepContext) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.name,
            "messages": ctx.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if ctx.tools:
            body["tools"] = list(ctx.tools)
        if self.effort:
            body["reasoning_effort"] = self.effort
        return body

    async def step(self, ctx: StepContext) -> ModelStep:
        if self._client is None:
            timeout = httpx.Timeout(
                connect=min(30.0, self.stall), read=self.stall, write=60.0, pool=30.0
            )
            # trust_env=False: proxies from the environment are never used (DESIGN: stripped);
            # only the sandbox's own egress relay, for an endpoint off this machine.
            self._client = httpx.AsyncClient(
                timeout=timeout, trust_env=False, proxy=proxy_for(self.base_url)
            )
        body = self._body(ctx)
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._attempt(body, ctx)
            except _Retryable as exc:
                backoff = min(MAX_BACKOFF, self.backoff * 2 ** (attempt - 1))
                wait = exc.wait if exc.wait is not None else backoff
                if attempt > self.retries or wait > MAX_RETRY_AFTER:
                    note = f"after {attempt} attempts" if attempt > 1 else "not retried"
                    if wait > MAX_RETRY_AFTER:
                        note = f"the server asks to retry after {wait:g} s"
                    exc.error.args = (f"{exc.error} ({note})",)
                    raise exc.error from None
                await trio.sleep(wait)

    async def _attempt(self, body: dict[str, Any], ctx: StepContext) -> ModelStep:
        assert self._client is not None  # noqa: S101 - created by step()
        stream = _Stream()
        try:
            async with self._client.stream(
                "POST", self.url, json=body, headers=self._headers()
            ) as response:
                if response.status_code >= 400:
                    raw = await response.aread()
                    raise self._status_error(response, raw)
                if "json" in response.headers.get("content-type", ""):
                    # A server that ignored stream: true answered with one completion.
                    return _from_completion(json.loads(await response.aread()))
                splitter = LineSplitter()
                # Read to the end even past [DONE]: leaving httpx's byte iterator unfinished
                # leaks it to the garbage collector (and a compliant server ends right there).
                async for data in response.aiter_bytes():
                    for line in splitter.feed(data):
                        self._sse_line(line, stream, ctx)
                for line in splitter.close():
                    self._sse_line(line, stream, ctx)
        except httpx.TimeoutException:
            raise ModelError(
                f"openai: POST {self.url}: no data for {self.stall:g} s (stalled; check the "
                "endpoint, or raise FLEET_STALL_TIMEOUT)"
            ) from None
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            error = ModelError(
                f"openai: POST {self.url}: {type(exc).__name__}: {exc} (is the server up?)"
            )
            raise _Retryable(error, None) from None
        if stream.finish is None and not stream.text and not stream.calls:
            raise ModelError(f"openai: POST {self.url}: the stream ended without a completion")
        return stream.step()

    def _status_error(self, response: httpx.Response, raw: bytes) -> Exception:
        status = response.status_code
        message = server_message(raw)
        hint = ""
        if status == 401 and self.api_key_env and not os.environ.get(self.api_key_env):
            hint = f" (set {self.api_key_env})"
        error = ModelHttpError(
            f"openai: POST {self.url} → HTTP {status}: {message}{hint}", status=status, url=self.url
        )
        if status in _RETRIED or status >= 500:
            return _Retryable(error, retry_after(response.headers.get("retry-after")))
        return error

    def _sse_line(self, line: bytes | Oversize, stream: _Stream, ctx: StepContext) -> None:
        """Feed one SSE line (``event:``, ``id:``, comments and ``[DONE]`` carry nothing)."""
        if isinstance(line, Oversize) or not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            stream.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            return
        if isinstance(chunk, dict) and not stream.done:
            if isinstance(chunk.get("error"), dict):
                message = server_message(data)
                raise ModelError(
                    f"openai: POST {self.url}: the stream reported an error: {message}"
                )
            stream.feed(chunk, ctx)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


class _Retryable(Exception):
    def __init__(self, error: ModelError, wait: float | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.wait = wait


def _from_completion(data: Any) -> ModelStep:
    """A non-streamed ``chat.completion`` as one step."""
    stream = _Stream()
    choice = (data.get("choices") or [{}])[0] if isinstance(data, dict) else {}
    message = choice.get("message") or {}
    stream.text = str(message.get("content") or "")
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        stream.calls[index] = {
            "id": str(call.get("id") or f"call_{index}"),
            "name": str(function.get("name") or ""),
            "arguments": str(function.get("arguments") or ""),
        }
    stream.usage = data.get("usage") if isinstance(data, dict) else None
    if isinstance(data, dict) and isinstance(data.get("model"), str):
        stream.model = data["model"]
    return stream.step()
