"""The model gateway over a real socket against the scripted model server: the child's
placeholder key never leaves, the real one arrives, every API's bill is metered, streamed and
whole, over one kept-alive connection; a refusal reaches the client as an error it shows."""

import functools
import json
import ssl

import httpx
import pytest
import trio

from orchestrator.spend._gateway import Gateway, is_model_call
from orchestrator.spend._metering import Metered
from tests.fakes._tls import TestCA
from tests.fakes.model_server import ModelServer

USAGE = {"input_tokens": 11, "output_tokens": 3, "cache_read_tokens": 2}
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


async def _serve(gateway: Gateway, nursery: trio.Nursery) -> int:
    """A loopback listener whose every connection the gateway serves (as the proxy would)."""
    serve = functools.partial(trio.serve_tcp, gateway.serve, 0, host="127.0.0.1")
    listeners = await nursery.start(serve)
    port: int = listeners[0].socket.getsockname()[1]
    return port


async def _raw_post(port: int, target: str, body: dict[str, object]) -> bytes:
    """POST *body* to *target* as written (an absolute form too); the whole answer."""
    data = json.dumps(body).encode()
    head = f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n"
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head.encode() + b"Connection: close\r\n\r\n" + data)
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
    return answer


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


async def test_an_https_provider_is_reached_over_the_gateways_own_tls(tmp_path, monkeypatch):
    # The child speaks plain HTTP to the gateway; the gateway verifies the provider's
    # certificate against the trust store (here a test CA, as a corporate one would be).
    ca = TestCA()
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.write(tmp_path / "ca.pem")))
    billed: list[Metered] = []
    async with ModelServer(tls=ca) as srv:
        srv.script("c1", [{"text": "over tls", "usage": USAGE}] * 2)
        gateway = Gateway(
            upstream=f"https://127.0.0.1:{srv.port}",
            on_usage=billed.append,
            credentials={"authorization": "Bearer sk-real"},
        )
        async with trio.open_nursery() as nursery:
            port = await _serve(gateway, nursery)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                whole = await client.post(
                    "/c/c1/v1/chat/completions",
                    json=_body("chat", stream=False),
                    headers={"authorization": "Bearer fleet-placeholder"},
                )
            # A proxy-style absolute-form target reaches the same path.
            absolute = await _raw_post(
                port,
                "http://api.example.test:443/c/c1/v1/chat/completions?x=1",
                _body("chat", stream=True),
            )
            nursery.cancel_scope.cancel()
        requests = srv.requests("c1")
    assert whole.status_code == 200
    assert "over tls" in whole.text
    assert absolute.startswith(b"HTTP/1.1 200")
    assert b"[DONE]" in absolute
    assert [r.headers.get("authorization") for r in requests] == ["Bearer sk-real"] * 2
    assert [(r.path, r.query) for r in requests] == [
        ("/v1/chat/completions", ""),
        ("/v1/chat/completions", "x=1"),
    ]
    assert len(billed) == 2


async def test_a_provider_whose_certificate_is_not_trusted_is_a_502_not_a_leak(tmp_path):
    # No SSL_CERT_FILE: the test CA is not trusted, so the real key never goes out to it.
    async with ModelServer(tls=TestCA()) as srv:
        srv.script("c1", [{"text": "never"}])
        refused: list[tuple[str, str]] = []
        gateway = Gateway(
            upstream=f"https://127.0.0.1:{srv.port}",
            on_usage=lambda _usage: pytest.fail("nothing to meter"),
            credentials={"authorization": "Bearer sk-real"},
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
    assert response.status_code == 502
    assert "CERTIFICATE_VERIFY_FAILED" in response.json()["error"]["message"]
    assert [what for what, _ in refused] == ["/c/c1/v1/chat/completions"]


async def test_a_tls_handshake_from_the_child_is_refused_and_logged(tmp_path, monkeypatch):
    # A hostile child dials the provider itself (TLS through its tunnel, to use a key it
    # found): the gateway serves plain HTTP only, so nothing reaches the provider.
    ca = TestCA()
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.write(tmp_path / "ca.pem")))
    async with ModelServer(tls=ca) as srv:
        srv.script("c1", [{"text": "never"}])
        refused: list[tuple[str, str]] = []
        gateway = Gateway(
            upstream=f"https://127.0.0.1:{srv.port}",
            on_usage=lambda _usage: pytest.fail("nothing to meter"),
            on_refused=lambda what, why: refused.append((what, why)),
        )
        async with trio.open_nursery() as nursery:
            port = await _serve(gateway, nursery)
            context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
            async with httpx.AsyncClient(
                base_url=f"https://127.0.0.1:{port}", verify=context
            ) as client:
                with pytest.raises(httpx.HTTPError):
                    await client.post("/c/c1/v1/chat/completions", json=_body("chat", stream=False))
            nursery.cancel_scope.cancel()
        assert srv.requests("c1") == []
    assert refused == [(f"https://127.0.0.1:{srv.port}", refused[0][1])]
    assert "TLS connection straight to the model endpoint" in refused[0][1]


async def test_the_real_key_goes_only_on_a_model_call():
    # A hostile child with the gateway's key injected would otherwise reach the provider's
    # other APIs (files, fine-tunes, settings) as the user.
    async with ModelServer() as srv:
        srv.script("c1", [{"text": "ok"}])
        gateway = Gateway(
            upstream=f"http://127.0.0.1:{srv.port}",
            on_usage=lambda _usage: None,
            credentials={"authorization": "Bearer sk-real"},
        )
        async with trio.open_nursery() as nursery:
            port = await _serve(gateway, nursery)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                placeholder = {"authorization": "Bearer fleet-placeholder"}
                await client.post("/c/c1/v1/files", json={}, headers=placeholder)
                await client.delete("/c/c1/v1/models/ft-1", headers=placeholder)
                await client.head("/c/c1/", headers=placeholder)
                await client.get("/c/c1/v1/models", headers=placeholder)
                model = await client.post(
                    "/c/c1/v1/chat/completions?x=1",
                    json=_body("chat", stream=False),
                    headers=placeholder,
                )
            nursery.cancel_scope.cancel()
        sent = [(r.method, r.path, r.headers.get("authorization")) for r in srv.requests("c1")]
    assert model.status_code == 200
    assert sent == [
        ("POST", "/v1/files", None),
        ("DELETE", "/v1/models/ft-1", None),
        ("HEAD", "/", None),
        ("GET", "/v1/models", "Bearer sk-real"),
        ("POST", "/v1/chat/completions", "Bearer sk-real"),
    ]


@pytest.mark.parametrize(
    ("method", "target", "keyed"),
    [
        ("POST", "/v1/chat/completions", True),
        ("POST", "/openai/v1/chat/completions?api-version=1", True),
        ("POST", "/v1/responses", True),
        ("POST", "/v1/messages?beta=true", True),
        ("POST", "/v1/messages/count_tokens", True),
        ("POST", "/v1/completions", True),
        ("GET", "/v1/models", True),
        ("GET", "/v1/models/gpt-x", True),
        ("GET", "/v1/responses/resp_1", False),
        ("DELETE", "/v1/responses/resp_1", False),
        ("POST", "/v1/files", False),
        ("POST", "/v1/fine_tuning/jobs", False),
        ("POST", "/v1/organization/admin_api_keys", False),
        ("POST", "/v1/messages/batches", False),
        ("PUT", "/v1/messages", False),
    ],
)
def test_which_requests_are_model_calls(method, target, keyed):
    assert is_model_call(method, target) is keyed
