"""Model roles end to end: a turn that fails on a quota error moves a real child to its role's
fallback model — a scripted HTTP 429 for the builtin agent, Pi and Codex, a Claude-style "usage
limit" for the real Claude Code CLI — and ``peek`` and the handoff name both models."""

import json

import pytest

from orchestrator._records import SpawnRequest
from tests.e2e.test_backends import CHILD, fleet, home, repo, settle, use_cli  # noqa: F401
from tests.fakes.model_server import ModelServer

pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]

USAGE_LIMIT = json.dumps(
    {"type": "error", "error": {"type": "rate_limit_error", "message": "usage limit reached"}}
)
#: kind → (backend, provider, base URL suffix and effort, the failing turns)
CASES = {
    # The builtin agent retries a 429 twice on the same model before its turn fails.
    "openai": ("builtin", "openai", "/v1", [{"status": 429, "body": "rate limited"}] * 3),
    # The role's effort reaches Claude Code as --effort (the CLI must accept it).
    "claude": ("claude", "anthropic", ":high", [{"status": 429, "body": USAGE_LIMIT}]),
    "pi": ("pi", "openai", "/v1", [{"status": 429, "body": "rate limited"}]),
    "codex": ("codex", "openai", "/v1", [{"status": 429, "body": "rate limited"}]),
}


@pytest.fixture(autouse=True)
def cli_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-scripted")
    monkeypatch.delenv("FLEET_STALL_TIMEOUT", raising=False)
    for variable in ("FLEET_CLAUDE_BIN", "FLEET_PI_BIN", "FLEET_CODEX_BIN"):
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.parametrize(
    "kind",
    ["openai", *(pytest.param(k, marks=pytest.mark.needs(k)) for k in ("claude", "pi", "codex"))],
)
async def test_a_quota_error_moves_the_child_to_its_fallback(kind, repo, home, monkeypatch):  # noqa: F811
    use_cli(monkeypatch, kind)
    backend, provider, suffix, failing = CASES[kind]
    async with ModelServer() as srv:
        base = srv.base_url(CHILD) + suffix.removesuffix(":high")
        effort = ":high" if suffix.endswith(":high") else ""
        (home / "roles.yaml").write_text(
            "roles:\n"
            f"  worker:\n    model: {provider}/primary@{base}{effort}\n"
            f"    fallbacks: [{provider}/spare@{base}{effort}]\n"
        )
        srv.script(CHILD, [*failing, {"text": "done on the spare"}])
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([SpawnRequest(task="go", backend=backend, role="worker")])
            note = await settle(sup, record.key)
            peek = sup.peek([record.key])["agents"][0]
            handoff = (await sup.stop([record.key]))[0]
        calls = [r for r in srv.requests(CHILD) if r.api is not None]
    assert note["error"] == ""
    assert note["report"] == "done on the spare"
    assert [c.body["model"] for c in calls] == ["primary"] * len(failing) + ["spare"]
    models = [f"{provider}/primary@{base}{effort}", f"{provider}/spare@{base}{effort}"]
    assert peek["role"] == handoff["role"] == "worker"
    assert peek["models"] == handoff["models"] == models


async def test_a_failure_that_is_not_quota_does_not_fall_back(repo, home):  # noqa: F811
    async with ModelServer() as srv:
        base = srv.base_url(CHILD) + "/v1"
        (home / "roles.yaml").write_text(
            f"roles:\n  worker:\n    model: openai/primary@{base}\n"
            f"    fallbacks: [openai/spare@{base}]\n"
        )
        srv.script(CHILD, [{"status": 400, "body": "bad request"}])
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([SpawnRequest(task="go", role="worker")])
            note = await settle(sup, record.key)
            peek = sup.peek([record.key])["agents"][0]
            await sup.stop([record.key])
        calls = [r for r in srv.requests(CHILD) if r.api is not None]
    assert "bad request" in note["error"]
    assert [c.body["model"] for c in calls] == ["primary"]
    assert peek["models"] == [f"openai/primary@{base}"]
