"""The model gateway over a real socket against the scripted model server: the child's
placeholder key never leaves, the real one arrives, every API's bill is metered, streamed and
whole, over one kept-alive connection; a refusal reaches the client as an error it shows."""

import functools
import json

import httpx
import pytest
import trio

from orchestrator.spend._gateway import Gateway
from orchestrator.spend._metering import Metered
from tests.fakes.model_server import ModelServer

USAGE = {"input_tokens": 11, "output_tokens": 3, "cache_read_tokens": 2}
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


async def _serve(gateway: Gateway, nursery: trio.Nursery) -> int:
    """A loopback listener whose every connection the gateway serves (as the proxy would)."""
    serve = functools.partial(trio.serve_tcp, gateway.serve, 0, host="127.0.0.1")
    listeners = await nursery.start(serve)
    port: int = listeners[0].socket.getsockname()[1]
    return port


def _body(api: str, *, stream: bool) -> dict[str, object]:
    if api == "chat":
        return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    if api == "messages":
        return {
            "model": "m",
            "stream": stream,
            "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}],
        }
    return {"model": "m", "stream": stream, "input": "hi"}


async def test_the_gateway_keys_and_meters_every_api_streamed_and_whole() -> None:
    billed: list[Metered] = []
    async with ModelServer() as srv:
        srv.script("c1", [{"text": "ok", "usage": USAGE}] * 6)
        gateway = Gateway(
            upstream=f"http://127.0.0.1:{srv.port}",
            on_usage=billed.append,
            credentials={"authorization": "Bearer sk-real", "x-api-key": "sk-real"},
        )
        async with trio.open_nursery() as nursery:
            port = await _serve(gateway, nursery)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for api, path in PATHS.items():
                    for stream in (False, True):
                        response = await client.post(
                            f"/c/c1{path}",
                            json=_body(api, stream=stream),
                            headers={"authorization": "Bearer fleet-placeholder"},
                        )
                        assert response.status_code == 200, response.text
                        assert "ok" in response.text
            nursery.cancel_scope.cancel()
        requests = srv.requests("c1")
    assert [r.headers.get("authorization") for r in requests] == ["Bearer sk-real"] * 6
    assert all(r.headers.get("x-api-key") == "sk-real" for r in requests)
    assert all("fleet-placeholder" not in json.dumps(dict(r.headers)) for r in requests)
    openai = Metered(input_tokens=9, output_tokens=3, cache_read_tokens=2, model="m")
    anthropic = Metered(input_tokens=11, output_tokens=3, cache_read_tokens=2, model="m")
    assert billed == [openai, openai, anthropic, anthropic, openai, openai]


async def test_a_refused_request_never_leaves_and_the_client_sees_why() -> None:
    async with ModelServer() as srv:
        srv.script("c1", [{"text": "never"}])
        refused: list[tuple[str, str]] = []
        gateway = Gateway(
            upstream=f"http://127.0.0.1:{srv.port}",
            on_usage=lambda _usage: pytest.fail("nothing to meter"),
            refusal=lambda: "budget spent: 120 of 100 tokens",
            on_refused=lambda what, why: refused.append((what, why)),
        )
        async with trio.open_nursery() as nursery:
            port = await _serve(gateway, nursery)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                response = await client.post(
                    "/c/c1/v1/chat/completions", json=_body("chat", stream=False)
                )
            nursery.cancel_scope.cancel()
        assert srv.requests("c1") == []
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "budget spent: 120 of 100 tokens"
    assert refused == [("/c/c1/v1/chat/completions", "budget spent: 120 of 100 tokens")]
