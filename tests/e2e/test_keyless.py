"""Keyless children (issue 37, item 1): a sandboxed child holds a placeholder, never the key.

A loopback HTTPS model server with a certificate from a test CA stands in for the provider;
the supervisor trusts that CA through ``SSL_CERT_FILE`` (as it would a corporate one) and holds
the real keys in its environment. Each real child — the builtin agent and the Pi, Claude Code
and Codex CLIs, sandboxed — completes a turn through the model gateway: the server checks it
received the real key; what the child sent was the placeholder. A hostile worker then searches
every process it can see, environment and memory, for the real key, and finds none.
"""

import json
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.core._supervisor import open_supervisor
from orchestrator.spend._keyless import PLACEHOLDER
from tests.e2e.conftest import make_repo
from tests.e2e.test_backends import CLIS, MODEL_BACKENDS, read_call, spawn_request
from tests.fakes._agent_clis import NPM_BIN
from tests.fakes._tls import TestCA
from tests.fakes.model_server import ModelServer

pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]

CHILD = "c1"
#: Real-looking keys, fresh per run; a probe finds them by shape, never by their text.
OPENAI_KEY = f"sk-fleetreal-{secrets.token_hex(16)}"
ANTHROPIC_KEY = f"sk-fleetreal-{secrets.token_hex(16)}"
AWS_SECRET = f"sk-fleetreal-{secrets.token_hex(16)}"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="flk-", dir="/tmp"))  # short: sun_path
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TestCA:
    """The provider's CA, trusted by the supervisor; the real keys in its environment."""
    authority = TestCA()
    monkeypatch.setenv("SSL_CERT_FILE", str(authority.write(tmp_path / "provider-ca.pem")))
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.delenv("FLEET_STALL_TIMEOUT", raising=False)
    for _, variable, _ in CLIS.values():
        monkeypatch.delenv(variable, raising=False)
    return authority


def _sent_key(kind: str, request: Any) -> str:
    if kind == "claude":
        return str(request.headers.get("x-api-key", ""))
    return str(request.headers.get("authorization", "")).removeprefix("Bearer ")


@pytest.mark.parametrize("kind", MODEL_BACKENDS)
async def test_a_sandboxed_child_reaches_an_https_provider_with_a_placeholder(
    kind, repo, home, ca, monkeypatch
):
    if kind in CLIS:
        _, variable, binary = CLIS[kind]
        monkeypatch.setenv(variable, str(NPM_BIN / binary))
    async with ModelServer(tls=ca) as srv:
        srv.script(CHILD, [read_call(kind, repo), {"text": "## Summary\nkeyless"}])
        assert srv.base_url(CHILD).startswith("https://")
        async with open_supervisor(Config(home=home, session="t", workspace=repo)) as sup:
            [record] = await sup.spawn([spawn_request(kind, srv.base_url(CHILD), "find it")])
            with trio.fail_after(120):
                [note] = await sup.wait([record.key])
            peek = sup.peek([record.key])["agents"][0]
            spend = sup.spend.report([record.key])
            await sup.stop([record.key])
        log = (sup.paths.logs / f"{record.key}.log").read_text()
        calls = [r for r in srv.requests(CHILD) if r.api is not None]
    assert note["error"] == "", log[-3000:]
    assert note["report"] == "## Summary\nkeyless"
    assert peek["sandboxed"] is True
    real = ANTHROPIC_KEY if kind == "claude" else OPENAI_KEY
    assert len(calls) == 2
    assert [_sent_key(kind, r) for r in calls] == [real, real]  # set by the gateway
    assert all(PLACEHOLDER not in json.dumps(dict(r.headers)) for r in calls)
    assert "model key held by the gateway (the child has a placeholder)" in log
    [account] = spend["agents"]
    assert account["metered_tokens"] >= 240, account  # two bills of 100 in / 20 out


#: Run by the hostile worker's shell: every process it can see, environment and memory,
#: searched for a key of the real keys' shape and for the placeholder (which must be found:
#: the search works). The patterns are written so that this text matches neither.
PROBE = r"""
import json, os, re
real = re.compile(rb"sk-fleetreal-[0-9a-f]{32}")
held = re.compile(rb"fleet-gateway-placeholde[r]")
found = {"env_real": 0, "env_held": 0, "mem_real": 0, "mem_held": 0, "pids": 0, "regions": 0}
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    found["pids"] += 1
    try:
        data = open(f"/proc/{pid}/environ", "rb").read()
        found["env_real"] += len(real.findall(data))
        found["env_held"] += len(held.findall(data))
    except OSError:
        pass
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except OSError:
        continue
    for line in maps:
        span, perms = line.split()[:2]
        if "r" not in perms:
            continue
        start, end = (int(x, 16) for x in span.split("-"))
        if end - start > 256 << 20:
            continue
        try:
            mem.seek(start)
            chunk = mem.read(end - start)
        except (OSError, ValueError, OverflowError):
            continue
        found["regions"] += 1
        found["mem_real"] += len(real.findall(chunk))
        found["mem_held"] += len(held.findall(chunk))
# Then the provider itself, with TLS, the way a child holding a found key would dial it.
import socket, ssl, sys
context = ssl.create_default_context()
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
try:
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10) as raw:
        with context.wrap_socket(raw) as tls:
            found["direct"] = "connected " + tls.version()
except (OSError, ssl.SSLError) as exc:
    found["direct"] = "refused " + type(exc).__name__
print("PROBE " + json.dumps(found))
"""


async def test_a_hostile_worker_finds_no_real_key_in_any_environment_or_memory(
    repo, home, ca, tmp_path
):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    (repo / "probe.py").write_text(PROBE)  # where the sandboxed worker can read it
    async with ModelServer(tls=ca) as srv:
        command = f"python3 probe.py {srv.port}"
        srv.script(
            CHILD,
            [
                {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
                {"text": "looked"},
            ],
        )
        model = f"openai:fake-model@{srv.base_url(CHILD)}/v1"
        async with open_supervisor(Config(home=home, session="t", workspace=repo)) as sup:
            [record] = await sup.spawn(
                [SpawnRequest(task="look around", agent="worker", backend="builtin", model=model)]
            )
            with trio.fail_after(120):
                [note] = await sup.wait([record.key])
            await sup.stop([record.key])
        log = (sup.paths.logs / f"{record.key}.log").read_text()
        calls = [r for r in srv.requests(CHILD) if r.api is not None]
    assert note["report"] == "looked", note
    output = "".join(calls[1].tool_results())
    line = next(x for x in output.splitlines() if x.startswith("PROBE "))
    found = json.loads(line.removeprefix("PROBE "))
    # The search works: it read memory and found the placeholder the child holds.
    assert found["regions"] > 0, found
    assert found["env_held"] + found["mem_held"] > 0, found
    # And the real keys (the model's, the other provider's, an AWS secret) are nowhere.
    assert (found["env_real"], found["mem_real"]) == (0, 0), found
    assert OPENAI_KEY not in output
    # Its own TLS to the provider ends at the gateway, which logs it.
    assert found["direct"].startswith("refused"), found
    assert "a TLS connection straight to the model endpoint" in log
    assert [_sent_key("openai", r) for r in calls] == [OPENAI_KEY, OPENAI_KEY]
