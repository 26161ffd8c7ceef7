"""The supervisor feeds the notifier: a real child settles, asks and is left unanswered."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from orchestrator._config import Config
from orchestrator.core._supervisor import SpawnRequest, open_supervisor

pytestmark = pytest.mark.slow

CEILING = 60
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Path]]:
    home = Path(tempfile.mkdtemp(prefix="fnt-", dir="/tmp"))  # short socket paths
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("# sample\n")
    git_env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=repo, env=git_env, check=True, capture_output=True)
    out = tmp_path / "events.jsonl"
    receiver = tmp_path / "receiver.py"
    receiver.write_text(f"import sys\nopen({str(out)!r}, 'a').write(sys.stdin.read())\n")
    try:
        yield {"home": home, "repo": repo, "tmp": tmp_path, "out": out, "receiver": receiver}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def script(world: dict[str, Path], name: str, text: str) -> str:
    path = world["tmp"] / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    return f"scripted:{path}"


def config(world: dict[str, Path], model: str, **notify: Any) -> Config:
    return Config(
        home=world["home"],
        session="t",
        workspace=world["repo"],
        model=model,
        notify={"command": [sys.executable, str(world["receiver"])], **notify},
    )


def events(world: dict[str, Path]) -> list[dict[str, Any]]:
    if not world["out"].exists():
        return []
    return [json.loads(line) for line in world["out"].read_text().splitlines()]


async def until(condition: Any) -> None:
    while not condition():  # noqa: ASYNC110 - a file another process writes
        await trio.sleep(0.05)


async def test_a_settled_child_reaches_the_command_with_its_key_and_clipped_line(world) -> None:
    model = script(world, "scout", 'turns:\n  - steps:\n      - reply: "found: {{task}}"\n')
    with trio.fail_after(CEILING):
        async with open_supervisor(config(world, model)) as sup:
            [child] = await sup.spawn([SpawnRequest(task="the loader", name="finder")])
            [note] = await sup.wait([child.key])
            await until(lambda: len(events(world)) == 1)
    [event] = events(world)
    assert event["kind"] == "settled"
    assert event["key"] == child.key
    assert event["name"] == "finder"
    assert event["state"] == note["state"]
    assert event["context"] == note["report"] == "found: the loader"


async def test_an_unanswered_question_becomes_needs_input(world) -> None:
    asks = """
    turns:
      - steps:
          - tool: ask_parent
            args: {question: "Which database?"}
          - reply: "use {{last}}"
    """
    model = script(world, "asks", asks)
    with trio.fail_after(CEILING):
        async with open_supervisor(config(world, model, needs_input_after_s=0.3)) as sup:
            [child] = await sup.spawn([SpawnRequest(task="pick one")])
            [note] = await sup.wait()
            assert note["question"]["text"] == "Which database?"
            await until(lambda: len(events(world)) == 1)
            [asked] = events(world)
            assert asked["kind"] == "needs-input"
            assert asked["key"] == child.key
            assert asked["state"] == "waiting"
            assert asked["question"] == note["question"]["id"]
            assert asked["context"] == "Which database?"
            sup.answer(note["question"]["id"], "postgres")
            await sup.wait([child.key])
            await until(lambda: len(events(world)) == 2)
    assert [e["kind"] for e in events(world)] == ["needs-input", "settled"]


async def test_a_hostile_report_quoting_a_siblings_token_reaches_nobody_unredacted(world) -> None:
    hold = script(world, "hold", "turns:\n  - steps:\n      - wait: 30\n        until: steer\n")
    with trio.fail_after(CEILING):
        async with open_supervisor(config(world, hold)) as sup:
            [sibling] = await sup.spawn([SpawnRequest(task="hold")])
            token = sup.runs[sibling.key].token
            assert sup.secrets.scrub(token) == "[redacted]"  # the token the child holds
            (world["repo"] / "loot.txt").write_text(
                f"{token} and the session key {sup.session_key.hex()}\n"
            )
            code = "print('stolen: ' + open('loot.txt').read() * 2)"
            [hostile] = await sup.spawn(
                [
                    SpawnRequest(
                        task="leak",
                        backend="command",
                        command=(sys.executable, "-c", code),
                    )
                ]
            )
            await sup.wait([hostile.key])
            await until(lambda: len(events(world)) == 1)
    [event] = events(world)
    assert event["key"] == hostile.key
    assert event["context"].startswith("stolen: [redacted] and the session key [redacted]")
    text = world["out"].read_text()
    assert token not in text
    assert sup.session_key.hex() not in text


async def test_slow_receivers_delay_neither_the_fleet_nor_its_shutdown(world) -> None:
    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hits.append(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(30)

        def log_message(self, *args: object) -> None:
            pass

    hits: list[bytes] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    slow = world["tmp"] / "slow.py"
    slow.write_text("import sys, time\nsys.stdin.read()\ntime.sleep(30)\n")
    model = script(world, "scout", 'turns:\n  - steps:\n      - reply: "done: {{task}}"\n')
    settings = config(
        world,
        model,
        command=[sys.executable, str(slow)],
        webhook=f"http://127.0.0.1:{server.server_address[1]}/",
        timeout_s=60,
    )
    try:
        started = time.monotonic()
        with trio.fail_after(CEILING):
            async with open_supervisor(settings) as sup:
                first, second = await sup.spawn(
                    [SpawnRequest(task="one"), SpawnRequest(task="two")]
                )
                notes = await sup.wait([first.key, second.key], every=True)
                assert {n["report"] for n in notes} == {"done: one", "done: two"}
                while not hits:  # noqa: ASYNC110 - the receiver is another thread
                    await trio.sleep(0.05)
                [third] = await sup.spawn([SpawnRequest(task="three")])
                [note] = await sup.wait([third.key])
                assert note["report"] == "done: three"
                # Peek counts per receiver: one in flight, the rest queued, nothing lost yet.
                counts = sup.peek()["notify"]
                assert set(counts) == {"command", "webhook"}
                assert counts["webhook"] == {
                    "delivered": 0,
                    "failed": 0,
                    "dropped": 0,
                    "last_error": "",
                }
        # Both receivers were still stuck on the first event (30 s each) when the supervisor
        # ended: nothing waited for them.
        assert time.monotonic() - started < 25
        assert len(hits) == 1
        # The stuck command receiver was killed with the supervisor, not left behind.
        stuck = [
            p for p in psutil.process_iter(["cmdline"]) if str(slow) in (p.info["cmdline"] or [])
        ]
        assert stuck == []
    finally:
        server.shutdown()
        server.server_close()
