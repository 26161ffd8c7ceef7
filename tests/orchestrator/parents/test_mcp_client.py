"""``fleet mcp`` over the MCP SDK's own client: every tool, errors, notifications, resources."""

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import TextContent, TextResourceContents

from orchestrator.parents._tools import TOOLS
from tests.e2e.conftest import Fleet, running_fleet

pytestmark = pytest.mark.slow

REPORT = """
turns:
  - steps:
      - tool: read
        args: {path: README.md}
      - reply: "## Summary\\n{{task}} -> {{last}}"
"""

QUESTION = """
turns:
  - steps:
      - tool: ask_parent
        args: {question: "Which database?"}
      - reply: "Using {{last}}"
"""

HANG = """
turns:
  - steps:
      - hang: true
side:
  - steps:
      - reply: "BTW: still reading"
"""


def _params(fleet: Fleet) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator", "mcp"],
        env=fleet.env,
        cwd=str(fleet.repo),
    )


class Heard:
    def __init__(self) -> None:
        self.logs: list[Any] = []
        self.updates: list[str] = []

    async def log(self, params: Any) -> None:
        self.logs.append(params.data)

    async def message(self, message: Any) -> None:
        root = getattr(message, "root", message)
        method = getattr(root, "method", None)
        if method == "notifications/resources/updated":
            self.updates.append(str(root.params.uri))


async def _until(predicate: Any, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110 - the callbacks fill plain lists
            await anyio.sleep(0.05)


def _text(item: Any) -> str:
    assert isinstance(item, (TextContent, TextResourceContents)), item
    return item.text


async def _call(client: Client, name: str, args: dict[str, Any]) -> Any:
    result = await client.call_tool(name, args)
    assert not result.is_error, result.content
    assert json.loads(_text(result.content[0])) == result.structured_content
    return result.structured_content


async def _session(fleet: Fleet) -> None:
    heard = Heard()
    report = fleet.script("report", REPORT)
    question = fleet.script("question", QUESTION)
    async with Client(
        _params(fleet),
        mode="legacy",
        logging_callback=heard.log,
        message_handler=heard.message,
    ) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {t.name for t in TOOLS}
        for tool in tools.values():
            assert tool.input_schema["type"] == "object"
            assert tool.description
            assert len(tool.description) < 300
            assert tool.output_schema is None
        with warnings.catch_warnings():  # the handshake era's subscribe, as parents use it
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.subscribe_resource("fleet://fleet")

        spawned = await _call(
            client,
            "spawn",
            {"task": "alpha", "model": report, "budget": {"hard_tokens": 9000}},
        )
        [row] = spawned["agents"]
        assert (row["key"], row["agent"]) == ("a1", "scout")
        settled = await _call(client, "wait", {"agents": ["a1"], "timeout": 60})
        [note] = settled["settled"]
        assert "\n│ ## Summary\n│ alpha -> " in note["report"]
        assert "42" in note["report"]
        assert note["observed"]["commands"][0]["tool"] == "read"
        assert note["observed"]["clipped"] is False
        await _until(lambda: any(e["event"] == "settled" and e["key"] == "a1" for e in heard.logs))
        await _until(lambda: "fleet://fleet" in heard.updates)

        peek = await _call(client, "peek", {})
        assert [a["key"] for a in peek["agents"]] == ["a1"]
        usage = await _call(client, "info", {"topic": "usage"})
        [child] = usage["agents"]
        assert (child["key"], child["budget"]) == ("a1", {"hard_tokens": 9000})
        assert usage["session"]["tokens"] == child["tokens"] > 0
        resource = await client.read_resource("fleet://fleet")
        assert json.loads(_text(resource.contents[0]))["agents"][0]["key"] == "a1"
        brief = await client.read_resource("fleet://brief")
        assert _text(brief.contents[0]) == (await _call(client, "info", {"topic": "brief"}))["text"]

        resumed = await _call(
            client, "control", {"action": "resume", "agent": "a1", "text": "beta"}
        )
        assert resumed["key"] == "a1"
        await _call(client, "wait", {"agents": ["a1"], "timeout": 60})
        assert (await _call(client, "info", {"topic": "mode"}))["mode"]
        agents = await _call(client, "info", {"topic": "agents"})
        assert "scout" in {a["name"] for a in agents["agents"]}
        for action in ("diff", "accept", "revert"):
            assert (await _call(client, "review", {"action": action}))["files"] == []
        posted = await _call(client, "paper", {"text": "who reads src?"})
        assert posted["id"].startswith("d")
        listed = await _call(client, "info", {"topic": "paper", "since": "d0"})
        assert "who reads src?" in listed["text"]

        # A child that asks: needs-input reaches the parent, answer unblocks it.
        await _call(client, "spawn", {"task": "pick a db", "model": question, "name": "db"})
        await _until(lambda: any(e["event"] == "needs-input" for e in heard.logs))
        [asked] = [e for e in heard.logs if e["event"] == "needs-input"]
        assert asked["key"] == "a2"
        assert "Which database?" in asked["line"]
        await _call(
            client, "control", {"action": "answer", "agent": asked["question"], "text": "sqlite"}
        )
        reports: list[str] = []
        with anyio.fail_after(60):
            while not any("Using sqlite" in r for r in reports):
                notes = (await _call(client, "wait", {"agents": ["db"], "timeout": 60}))["settled"]
                reports += [n.get("report") or "" for n in notes if n["key"] == "a2"]

        # Errors: the one-line message and kind of --json, as text only.
        missing = await _error(
            client, "control", {"action": "steer", "agent": "nobody", "text": "x"}
        )
        assert missing["kind"] == "not-found"
        assert missing["message"].startswith("control: ")
        assert (await _error(client, "stop", {}))["kind"] == "usage"
        assert (await _error(client, "stop", {"agents": []}))["kind"] == "usage"

        # ask / pause / steer on a live child, then stop and discard.
        hang = fleet.script("hang", HANG)
        await _call(client, "spawn", {"task": "long", "model": hang, "name": "long"})
        await _until_state(client, "long", "working")
        timed = await _call(client, "wait", {"agents": ["long"], "timeout": 0.2})
        assert timed["timed_out"] is True
        assert timed["settled"] == []
        [row] = timed["working"]
        assert (row["key"], row["state"]) == ("a3", "working")
        assert row["age_s"] >= 0
        steered = await _call(
            client, "control", {"action": "steer", "agent": "long", "text": "faster"}
        )
        assert steered["key"] == "a3"
        side = await _call(
            client, "control", {"action": "ask", "agent": "long", "text": "what now?"}
        )
        assert side["key"] == "a3"
        assert "\n│ BTW: still reading\n" in side["answer"]
        paused = await _call(
            client, "control", {"action": "pause", "agent": "long", "text": "enough"}
        )
        assert paused["state"] == "paused"
        stopped = await _call(client, "stop", {"agents": ["*"]})
        assert {h["key"] for h in stopped["handoffs"]} >= {"a1", "a2", "a3"}
        discarded = await _call(
            client, "control", {"action": "discard", "agent": "a3", "text": "done with it"}
        )
        assert discarded["discarded"] is True
        asked_tool = await client.call_tool(
            "control", {"action": "ask", "agent": "a1", "text": "why?"}
        )
        assert asked_tool.is_error  # a stopped child answers nothing: an error, not a hang

        # The supervisor ends (its idle rule, a crash): the next call starts the next one.
        ended = await anyio.run_process(
            [sys.executable, "-m", "orchestrator", "serve", "--stop"],
            cwd=fleet.repo,
            env=fleet.env,
            check=False,
        )
        assert ended.returncode == 0
        assert (await _call(client, "info", {"topic": "mode"}))["mode"]
        assert (await _call(client, "peek", {}))["agents"] == []


async def _error(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """An error result: text only, one line of JSON with the kind and the message."""
    result = await client.call_tool(name, args)
    assert result.is_error
    assert result.structured_content is None
    [item] = result.content
    assert "\n" not in _text(item)
    error: dict[str, Any] = json.loads(_text(item))["error"]
    assert error["message"].startswith(f"{name}: ")
    return error


async def _until_state(client: Client, agent: str, state: str) -> None:
    with anyio.fail_after(30):
        while True:
            [row] = (await _call(client, "peek", {"agents": [agent]}))["agents"]
            if row["state"] == state:
                return
            await anyio.sleep(0.1)


def test_every_tool_errors_and_notifications_over_the_sdk_client(tmp_path: Path) -> None:
    with running_fleet(tmp_path, prefix="flm-") as fleet:
        anyio.run(_session, fleet)
