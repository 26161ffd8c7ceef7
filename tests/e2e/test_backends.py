"""Every backend end to end through the real supervisor: real child processes, real agent CLIs
(Pi 0.73.1 and 1.6.0, Claude Code, Codex), the builtin agent's openai model and the command
backend, all against the loopback scripted model server.

Only the final report reaches the parent; steer, pause/resume, HTTP errors, stalls and a
missing CLI behave as ``docs/backends.md`` says. One run happens inside a network namespace
that has nothing but loopback, so nothing may need a request that leaves this machine.
"""

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator._config import Config
from orchestrator._records import SpawnRequest
from orchestrator.core._supervisor import Supervisor, open_supervisor
from tests.child.backends._cli import ESCAPES, offered
from tests.e2e.conftest import make_repo
from tests.fakes._agent_clis import NPM_BIN
from tests.fakes.model_server import ModelServer

# Every child runs sandboxed (the default), the CLIs from .npm-prefix/bin.
pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]

CHILD = "c1"
#: backend id → (fleet backend, binary variable, the binary)
CLIS = {
    "pi": ("pi", "FLEET_PI_BIN", "pi"),
    "pi-next": ("pi", "FLEET_PI_BIN", "pi-next"),
    "claude": ("claude", "FLEET_CLAUDE_BIN", "claude"),
    "codex": ("codex", "FLEET_CODEX_BIN", "codex"),
}
#: each backend as a parameter that needs its CLI
MODEL_BACKENDS = [
    *(pytest.param(kind, marks=pytest.mark.needs(binary)) for kind, (*_, binary) in CLIS.items()),
    "openai",
]


def read_call(kind: str, repo: Path) -> dict[str, Any]:
    """One scripted tool call that reads README.md, in the backend's own tool vocabulary."""
    if kind in {"pi", "pi-next", "openai"}:
        return {"tool_calls": [{"name": "read", "arguments": {"path": "README.md"}}]}
    if kind == "claude":
        path = str(repo / "README.md")
        return {"tool_calls": [{"name": "Read", "arguments": {"file_path": path}}]}
    return {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": "cat README.md"}}]}


def spawn_request(kind: str, base_url: str, task: str) -> SpawnRequest:
    if kind == "claude":
        return SpawnRequest(task=task, backend="claude", model=f"anthropic:claude-fake@{base_url}")
    backend = "builtin" if kind == "openai" else CLIS[kind][0]
    return SpawnRequest(task=task, backend=backend, model=f"openai:fake-model@{base_url}/v1")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def home() -> Iterator[Path]:
    # Short: the session's socket path must fit in sun_path.
    path = Path(tempfile.mkdtemp(prefix="flb-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def cli_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The supervisor hands its environment to each child; the child picks the CLI from it.
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-scripted")
    monkeypatch.delenv("FLEET_STALL_TIMEOUT", raising=False)
    for _, variable, _ in CLIS.values():
        monkeypatch.delenv(variable, raising=False)


def use_cli(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    if kind in CLIS:
        _, variable, binary = CLIS[kind]
        monkeypatch.setenv(variable, str(NPM_BIN / binary))


@contextlib.asynccontextmanager
async def fleet(repo: Path, home: Path) -> AsyncIterator[Supervisor]:
    # Sandboxed (the default): every model is reached through the child's egress proxy.
    config = Config(home=home, session="t", workspace=repo)
    async with open_supervisor(config) as sup:
        yield sup


async def settle(sup: Supervisor, key: str, seconds: float = 90) -> dict[str, Any]:
    with trio.fail_after(seconds):
        [note] = await sup.wait([key])
    return note


@pytest.mark.parametrize("kind", MODEL_BACKENDS)
async def test_a_scout_reads_and_only_its_report_reaches_the_parent(kind, repo, home, monkeypatch):
    use_cli(monkeypatch, kind)
    async with ModelServer() as srv:
        srv.script(CHILD, [read_call(kind, repo), {"text": "## Summary\nThe answer is 42."}])
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([spawn_request(kind, srv.base_url(CHILD), "find it")])
            note = await settle(sup, record.key)
            peek = sup.peek([record.key])["agents"][0]
            handoff = (await sup.stop([record.key]))[0]
        requests = srv.requests()
    assert note["error"] == ""
    assert note["report"] == "## Summary\nThe answer is 42."
    assert peek["state"] == "idle"
    assert handoff["state"] == "stopped"
    assert handoff["last"] == "## Summary\nThe answer is 42."
    model_calls = [r for r in requests if r.api is not None]
    assert [r.child for r in requests] == [CHILD] * len(requests)  # every request was ours
    assert len(model_calls) == 2
    # The real output (Codex's is a shell command's): no nested sandbox failed inside ours.
    assert "The answer is 42." in "".join(model_calls[1].tool_results())
    assert "bwrap" not in "".join(model_calls[1].tool_results())
    assert peek["sandboxed"] is True
    assert not ESCAPES & set(offered(model_calls[0])), offered(model_calls[0])
    # Its usage reached the supervisor's ledger in the backend's own fields: two model calls
    # of the model server's default 100 in / 20 out (Claude Code adds its own token count).
    assert peek["usage"]["output_tokens"] >= 40, peek["usage"]
    assert peek["usage"]["input_tokens"] >= 200, peek["usage"]


async def test_a_command_child_reports_its_stdout(repo, home):
    code = (
        "import sys; task = sys.stdin.read(); "
        "print('## Summary\\n' + task + ': ' + open('README.md').read().split()[-1])"
    )
    async with fleet(repo, home) as sup:
        [record] = await sup.spawn(
            [
                SpawnRequest(
                    task="last word", backend="command", command=(sys.executable, "-c", code)
                )
            ]
        )
        note = await settle(sup, record.key)
        await sup.stop([record.key])
    assert (note["error"], note["report"]) == ("", "## Summary\nlast word: 42.\n")


async def test_a_steered_command_child_says_so_in_peek(repo, home):
    code = "import time; time.sleep(30)"
    async with fleet(repo, home) as sup:
        [record] = await sup.spawn(
            [SpawnRequest(task="wait", backend="command", command=(sys.executable, "-c", code))]
        )
        with trio.fail_after(20):
            while sup.peek([record.key])["agents"][0]["state"] != "working":  # noqa: ASYNC110
                await trio.sleep(0.05)
            with pytest.raises(Exception, match="cannot be steered"):
                await sup.steer(record.key, "go east")
            while "steer" not in sup.peek([record.key])["agents"][0]["activity"]:  # noqa: ASYNC110
                await trio.sleep(0.05)
        activity = sup.peek([record.key])["agents"][0]["activity"]
        await sup.stop([record.key])
    assert activity == "steer ignored: a command cannot be steered"


@pytest.mark.parametrize("kind", MODEL_BACKENDS)
async def test_steer_reaches_the_working_child(kind, repo, home, monkeypatch):
    use_cli(monkeypatch, kind)
    async with ModelServer() as srv:
        srv.script(CHILD, [{"hold": True, **read_call(kind, repo)}, {"text": "went east"}])
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([spawn_request(kind, srv.base_url(CHILD), "go west")])
            with trio.fail_after(60):
                while not [r for r in srv.requests(CHILD) if r.api]:  # noqa: ASYNC110
                    await trio.sleep(0.05)
                await trio.sleep(0.3)  # the turn is known to the backend (turn ids, echoes)
            await sup.steer(record.key, "go east instead")
            srv.release()  # the read answers once the steer is in
            note = await settle(sup, record.key)
            await sup.stop([record.key])
        calls = [r for r in srv.requests(CHILD) if r.api]
    assert (note["error"], note["report"]) == ("", "went east")
    assert "go east instead" in str(calls[1].body)


@pytest.mark.parametrize("kind", MODEL_BACKENDS)
async def test_pause_interrupts_and_resume_continues_the_same_context(
    kind, repo, home, monkeypatch
):
    use_cli(monkeypatch, kind)
    async with ModelServer() as srv:
        srv.script(CHILD, [{"delay": 60, "text": "too late"}, {"text": "resumed"}])
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([spawn_request(kind, srv.base_url(CHILD), "first task")])
            with trio.fail_after(60):
                while not [r for r in srv.requests(CHILD) if r.api]:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            _, settled = await sup.pause(record.key)
            paused = sup.peek([record.key])["agents"][0]["state"]
            await sup.prompt(record.key, "second task")
            note = await settle(sup, record.key)
            await sup.stop([record.key])
        calls = [r for r in srv.requests(CHILD) if r.api]
    assert settled
    assert paused == "paused"
    assert (note["error"], note["report"]) == ("", "resumed")
    assert "first task" in str(calls[-1].body)
    assert "second task" in str(calls[-1].body)


@pytest.mark.parametrize("kind", MODEL_BACKENDS)
async def test_an_http_500_fails_the_turn_in_seconds(kind, repo, home, monkeypatch):
    use_cli(monkeypatch, kind)
    async with ModelServer() as srv:
        srv.script(CHILD, [{"status": 500, "body": "upstream exploded"}] * 3)
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([spawn_request(kind, srv.base_url(CHILD), "go")])
            # Timed from the first model request: the CLI's own start-up is not the failure's.
            with trio.fail_after(60):
                while not any(r.api for r in srv.requests(CHILD)):  # noqa: ASYNC110
                    await trio.sleep(0.02)
            start = trio.current_time()
            note = await settle(sup, record.key, seconds=30)
            elapsed = trio.current_time() - start
            await sup.stop([record.key])
    assert note["report"] == ""
    assert note["error"]
    assert "\n" not in note["error"]
    # Codex hides 5xx bodies; the others pass the server's own message on.
    assert "upstream exploded" in note["error"] or "internalServerError" in note["error"]
    assert elapsed < 20


@pytest.mark.parametrize("kind", MODEL_BACKENDS)
async def test_a_stalled_stream_is_cut_by_our_watchdog(kind, repo, home, monkeypatch):
    use_cli(monkeypatch, kind)
    monkeypatch.setenv("FLEET_STALL_TIMEOUT", "3")
    async with ModelServer() as srv:
        srv.script(CHILD, [{"stall": True, "text": "partial words"}])
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([spawn_request(kind, srv.base_url(CHILD), "go")])
            note = await settle(sup, record.key, seconds=40)
            await sup.stop([record.key])
    assert "no output for 3 s" in note["error"] or "no data for 3 s" in note["error"]


@pytest.mark.parametrize("kind", list(CLIS))
async def test_a_missing_cli_fails_with_one_line(kind, repo, home, monkeypatch):
    backend, variable, _ = CLIS[kind]
    monkeypatch.setenv(variable, f"/nonexistent/{kind}")
    async with ModelServer() as srv:
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([spawn_request(kind, srv.base_url(CHILD), "go")])
            note = await settle(sup, record.key, seconds=30)
            await sup.stop([record.key])
        assert srv.requests() == []
    assert note["error"].startswith(f"backend {backend}: /nonexistent/{kind} is not on PATH (")
    assert "\n" not in note["error"]


@pytest.mark.needs("netns", "pi-next")
def test_a_pi_scout_works_with_nothing_but_loopback(tmp_path):
    """The scout test, run again in a network namespace where only loopback exists."""
    test = f"{Path(__file__)}::test_a_scout_reads_and_only_its_report_reaches_the_parent[pi-next]"
    inner = f"ip link set lo up && exec {sys.executable} -m pytest -q -p no:cacheprovider {test}"
    result = subprocess.run(
        ["unshare", "-n", "--", "sh", "-c", inner],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout


@pytest.mark.parametrize("kind", MODEL_BACKENDS)
async def test_a_side_question_to_an_idle_child_is_answered_in_its_context(
    kind, repo, home, monkeypatch
):
    use_cli(monkeypatch, kind)
    async with ModelServer() as srv:
        srv.script(CHILD, [{"text": "the answer is 42"}, {"text": "I said 42."}])
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([spawn_request(kind, srv.base_url(CHILD), "find it")])
            await settle(sup, record.key)
            with trio.fail_after(60):
                answer = await sup.ask(record.key, "what did you find?")
            state = sup.peek([record.key])["agents"][0]["state"]
            await sup.stop([record.key])
        calls = [r for r in srv.requests(CHILD) if r.api]
    assert answer == "I said 42."
    assert state == "idle"
    assert "By the way" in str(calls[-1].body)
    assert "find it" in str(calls[-1].body)


@pytest.mark.parametrize(
    "kind", ["openai", pytest.param("pi-next", marks=pytest.mark.needs("pi-next"))]
)
async def test_a_sandboxed_scout_still_reaches_its_model(kind, repo, home, monkeypatch):
    # The sandbox keeps the filesystem read-only but must not cut a child off from its model.
    use_cli(monkeypatch, kind)
    async with ModelServer() as srv:
        srv.script(CHILD, [read_call(kind, repo), {"text": "## Summary\nsandboxed"}])
        config = Config(home=home, session="t", workspace=repo)
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([spawn_request(kind, srv.base_url(CHILD), "find it")])
            note = await settle(sup, record.key)
            sandboxed = sup.peek([record.key])["agents"][0]["sandboxed"]
    assert note["error"] == ""
    assert note["report"] == "## Summary\nsandboxed"
    assert sandboxed is True


async def test_an_unwrapped_codex_child_keeps_its_own_sandbox(repo, home, monkeypatch):
    # --allow-unsandboxed with a stray FLEET_SANDBOXED=1 in the supervisor's environment: the
    # launch says "0", so Codex's own read-only sandbox still refuses a scout's write.
    use_cli(monkeypatch, "codex")
    monkeypatch.setenv("FLEET_SANDBOXED", "1")
    write = {"name": "exec_command", "arguments": {"cmd": "echo owned > owned.txt"}}
    async with ModelServer() as srv:
        srv.script(CHILD, [{"tool_calls": [write]}, {"text": "## Summary\ntried"}])
        config = Config(
            home=home, session="t", workspace=repo, sandbox="off", allow_unsandboxed=True
        )
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([spawn_request("codex", srv.base_url(CHILD), "write")])
            note = await settle(sup, record.key)
            peek = sup.peek([record.key])["agents"][0]
            await sup.stop([record.key])
    assert peek["sandboxed"] is False
    assert note["report"] == "## Summary\ntried"
    assert not (repo / "owned.txt").exists()
