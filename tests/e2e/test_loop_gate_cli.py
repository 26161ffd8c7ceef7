"""The loop gate for CLI backends, end to end: a real Pi and a real Claude Code against the
loopback scripted model server, under the real supervisor. A CLI runs its own tools, so the
supervisor cannot refuse a call: it steers the child with the gate's line, and the model sees
that line in a later request."""

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.e2e.conftest import make_repo
from tests.e2e.test_backends import CHILD, CLIS, fleet, read_call, spawn_request, use_cli
from tests.fakes.model_server import ModelServer

pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]

LINE = "loop gate: {tool} was called with the same input {n} times in the last 8 calls"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "repo")
    (repo / "OTHER.md").write_text("something else\n")
    return repo


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="flg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def cli_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-scripted")
    monkeypatch.delenv("FLEET_STALL_TIMEOUT", raising=False)
    for _, variable, _ in CLIS.values():
        monkeypatch.delenv(variable, raising=False)


def other_call(kind: str, repo: Path) -> dict[str, object]:
    """A different read (it does not repeat), slow to answer so the steer lands meanwhile."""
    call = read_call(kind, repo)
    [tool] = call["tool_calls"]
    key = "file_path" if kind == "claude" else "path"
    path = str(repo / "OTHER.md") if kind == "claude" else "OTHER.md"
    return {"delay": 2, "tool_calls": [{"name": tool["name"], "arguments": {key: path}}]}


@pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=pytest.mark.needs(k)) for k in ("pi", "claude")]
)
async def test_a_cli_child_repeating_a_read_is_steered_with_the_gates_line(
    kind, repo, home, monkeypatch
):
    use_cli(monkeypatch, kind)
    same = read_call(kind, repo)
    tool = same["tool_calls"][0]["name"]
    # Claude Code answers a second Read of an unchanged file with "unchanged" instead of its
    # text: the answers stop changing only from the second call on, so the fourth trips.
    repeats = 4 if kind == "claude" else 3
    async with ModelServer() as srv:
        srv.script(
            CHILD,
            [same] * repeats + [other_call(kind, repo), {"text": "## Summary\nchanged approach"}],
        )
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([spawn_request(kind, srv.base_url(CHILD), "read it")])
            seen = ""
            with trio.fail_after(90):
                while not seen.startswith("looping"):
                    seen = str(sup.peek([record.key])["agents"][0]["activity"])
                    await trio.sleep(0.02)
                [note] = await sup.wait([record.key])
            await sup.stop([record.key])
        calls = [r for r in srv.requests(CHILD) if r.api]
    assert seen.startswith(f"looping: {tool} was called with the same input {repeats} times")
    assert (note["error"], note["report"]) == ("", "## Summary\nchanged approach")
    assert "incomplete" not in note
    line = LINE.format(tool=tool, n=repeats)
    assert all(line not in str(c.body) for c in calls[:repeats])  # sent after the last repeat
    assert line in str(calls[-1].body)


@pytest.mark.needs("pi")
async def test_a_cli_child_that_keeps_repeating_is_stopped_incomplete_on_the_third_trip(
    repo, home, monkeypatch
):
    use_cli(monkeypatch, "pi")
    same = read_call("pi", repo)
    async with ModelServer() as srv:
        # Steered twice, it reads again: the fifth identical read is the third trip.
        srv.script(CHILD, [same] * 5 + [{"delay": 30, "text": "never"}])
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([spawn_request("pi", srv.base_url(CHILD), "read it")])
            notes: list[dict[str, object]] = []
            with trio.fail_after(90):
                while not notes or notes[-1].get("state") != "stopped":
                    notes += await sup.wait([record.key])
            handoff = record.handoff()
    assert handoff["state"] == "stopped"
    assert handoff["incomplete"] == LINE.format(tool="read", n=5) + (
        " with the same result; stop repeating it and change approach"
    )
    assert notes[-1]["incomplete"] == handoff["incomplete"]


@pytest.mark.needs("pi")
async def test_three_failing_tool_results_in_a_row_steer_a_cli_child(repo, home, monkeypatch):
    use_cli(monkeypatch, "pi")

    def missing(name: str) -> dict[str, object]:
        return {"tool_calls": [{"name": "read", "arguments": {"path": f"{name}.txt"}}]}

    async with ModelServer() as srv:
        srv.script(
            CHILD,
            [missing("a"), missing("b"), missing("c"), other_call("pi", repo), {"text": "ok"}],
        )
        async with fleet(repo, home) as sup:
            [record] = await sup.spawn([spawn_request("pi", srv.base_url(CHILD), "read them")])
            with trio.fail_after(90):
                [note] = await sup.wait([record.key])
            await sup.stop([record.key])
        calls = [r for r in srv.requests(CHILD) if r.api]
    line = "loop gate: 3 tool calls failed in a row (last: read)"
    assert (note["error"], note["report"]) == ("", "ok")
    assert all(line not in str(c.body) for c in calls[:3])
    assert line in str(calls[-1].body)
