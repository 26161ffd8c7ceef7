"""Checked results end to end: a real builtin child against the loopback model server.

The child's first report breaks its JSON Schema; the supervisor steers it once (the model
server sees the corrective line in the next request) and keeps the valid result, which ``wait``
and the handoff carry beside the text. A child that stays invalid is failed with the error.
"""

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from orchestrator._config import Config
from orchestrator._errors import UsageError
from orchestrator._records import SpawnRequest, State
from orchestrator.core._supervisor import open_supervisor
from orchestrator.governance import _checkproc
from tests.e2e.conftest import Fleet, make_repo, running_fleet
from tests.fakes.model_server import ModelServer

pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]

CHILD = "c1"
SCHEMA = {
    "type": "object",
    "required": ["answer"],
    "properties": {"answer": {"type": "integer"}},
    "additionalProperties": False,
}
WRONG = 'I looked.\n```json\n{"answer": "forty-two"}\n```'
RIGHT = 'The answer is 42.\n```json\n{"answer": 42}\n```'
STEER = "result invalid at /answer: 'forty-two' is not of type 'integer'"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="flk-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def texts(srv: ModelServer) -> list[str]:
    return [json.dumps(r.body) for r in srv.requests(CHILD) if r.api]


async def run_checked(repo: Path, home: Path, replies: list[str]) -> tuple[Any, Any, list[str]]:
    async with ModelServer() as srv:
        srv.script(CHILD, [{"text": text} for text in replies])
        model = f"openai:fake-model@{srv.base_url(CHILD)}/v1"
        config = Config(home=home, session="t", workspace=repo)
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="find it", model=model, schema=SCHEMA)])
            with trio.fail_after(90):
                [note] = await sup.wait([record.key])
            handoff = (await sup.stop([record.key]))[0]
        return note, handoff, texts(srv)


async def test_an_invalid_result_is_corrected_once_then_kept(repo, home):
    note, handoff, sent = await run_checked(repo, home, [WRONG, RIGHT])
    assert (note["state"], note["error"]) == ("idle", "")
    assert note["report"] == RIGHT
    assert note["result"] == {"answer": 42}
    assert handoff["result"] == {"answer": 42}
    assert len(sent) == 2
    # The task told the child to end with a json block for this schema ...
    assert "fenced ```json code block" in sent[0]
    assert '\\"required\\":[\\"answer\\"]' in sent[0]
    # ... and the one corrective steer named the error and its path.
    assert STEER not in sent[0]
    assert STEER in sent[1]


async def test_a_result_still_invalid_after_the_steer_fails_the_child(repo, home):
    note, handoff, sent = await run_checked(repo, home, [WRONG, "Sorry, no JSON this time."])
    assert note["state"] == "failed"
    assert note["error"] == "the report has no fenced ```json block"
    assert note["failure"]["kind"] == "invalid-result"
    assert note["result"] is None
    assert handoff["state"] == str(State.FAILED)
    assert len(sent) == 2  # one correction, no more
    assert STEER in sent[1]


async def test_a_bad_schema_is_refused_at_spawn(repo, home):
    config = Config(home=home, session="t", workspace=repo)
    async with open_supervisor(config) as sup:
        with pytest.raises(UsageError, match=r"^spawn: schema: not a valid JSON Schema at /type"):
            await sup.spawn(
                [SpawnRequest(task="x", model="openai:m@http://127.0.0.1:9/v1", schema={"type": 5})]
            )
        assert sup.peek([])["agents"] == []


def test_the_cli_carries_the_schema_and_wait_json_returns_the_result(tmp_path):
    with ModelServer() as srv, running_fleet(tmp_path) as fleet:
        srv.script(CHILD, [{"text": WRONG}, {"text": RIGHT}])
        schema = fleet.scripts / "answer.json"
        schema.write_text(json.dumps(SCHEMA))
        model = f"openai:fake-model@{srv.base_url(CHILD)}/v1"
        fleet.json("spawn", "find it", "--model", model, "--schema", str(schema))
        [note] = fleet.json("wait", "a1", "--timeout", "60")["settled"]
        assert (note["state"], note["result"]) == ("idle", {"answer": 42})
        assert STEER in texts(srv)[1]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file or directory"),
        ("{oops", "not JSON: "),
        ('{"type": "nope"}', "spawn: schema: not a valid JSON Schema at /type: 'nope'"),
        ("[1]", "a JSON Schema must be a JSON object, not an array"),
    ],
)
def test_a_bad_schema_file_is_exit_2_and_one_line(tmp_path, content, message):
    with running_fleet(tmp_path) as fleet:
        path = fleet.scripts / "s.json"
        if content is not None:
            path.write_text(content)
        result = fleet.run(
            "spawn", "x", "--model", "openai:m@http://127.0.0.1:9/v1", "--schema", str(path)
        )
        assert result.returncode == 2, (result.stdout, result.stderr)
        [line] = result.stderr.splitlines()
        assert line.startswith("fleet spawn: ")
        assert message in line


ANSWER = """
turns:
  - steps:
      - reply: "Found it.\\n```json\\n{\\"answer\\": 42}\\n```"
"""


def test_the_mcp_spawn_tool_takes_a_schema_and_wait_returns_the_result(tmp_path):
    async def session(fleet: Fleet) -> tuple[Any, Any]:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "orchestrator", "mcp"],
            env=fleet.env,
            cwd=str(fleet.repo),
        )
        async with Client(params, mode="legacy") as client:
            model = fleet.script("answer", ANSWER)
            spawned = await client.call_tool(
                "spawn", {"task": "find it", "model": model, "schema": SCHEMA}
            )
            assert not spawned.is_error, spawned.content
            waited = await client.call_tool("wait", {"agents": ["a1"], "timeout": 60})
            assert not waited.is_error, waited.content
            bad = await client.call_tool(
                "spawn", {"task": "x", "model": model, "schema": {"type": "nope"}}
            )
            return waited.structured_content, bad

    with running_fleet(tmp_path) as fleet:
        waited, bad = anyio.run(session, fleet)
    [note] = waited["settled"]
    assert (note["state"], note["result"]) == ("idle", {"answer": 42})
    assert bad.is_error
    assert "not a valid JSON Schema at /type" in str(bad.content)


async def test_an_agent_definitions_schema_file_checks_its_children(
    repo, home, tmp_path, monkeypatch
):
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "answer.schema.json").write_text(json.dumps(SCHEMA))
    (agents / "answerer.md").write_text(
        "---\ndescription: answers\nschema: answer.schema.json\n---\nAnswer.\n"
    )
    monkeypatch.setenv("FLEET_AGENTS_DIR", str(agents))
    async with ModelServer() as srv:
        srv.script(CHILD, [{"text": RIGHT}])
        model = f"openai:fake-model@{srv.base_url(CHILD)}/v1"
        config = Config(home=home, session="t", workspace=repo)
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="x", agent="answerer", model=model)])
            with trio.fail_after(90):
                [note] = await sup.wait([record.key])
            await sup.stop([record.key])
        [sent] = texts(srv)
    assert note["result"] == {"answer": 42}
    assert '\\"required\\":[\\"answer\\"]' in sent


async def test_a_result_that_makes_a_pattern_backtrack_fails_the_child_not_the_loop(
    repo, home, monkeypatch
):
    monkeypatch.setattr(_checkproc, "TIMEOUT", 1.5)
    schema = {"type": "array", "items": {"type": "string", "pattern": "^(a+)+$"}}
    crafted = '```json\n["' + "a" * 60 + 'b"]\n```'
    async with ModelServer() as srv:
        srv.script(CHILD, [{"text": crafted}])
        model = f"openai:fake-model@{srv.base_url(CHILD)}/v1"
        config = Config(home=home, session="t", workspace=repo)
        async with open_supervisor(config) as sup:
            [record] = await sup.spawn([SpawnRequest(task="x", model=model, schema=schema)])
            with trio.fail_after(60):
                [note] = await sup.wait([record.key])
            await sup.stop([record.key])
        sent = texts(srv)
    assert note["state"] == "failed"
    assert note["failure"]["kind"] == "invalid-result"
    assert note["error"].startswith("validation ran past 1.5 s")
    assert len(sent) == 1  # no correction can help
