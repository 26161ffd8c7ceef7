"""The notifier against real receivers: a command, a loopback webhook, the desktop's argv."""

import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.lowlevel

from orchestrator._config import NotifyConfig, load_config
from orchestrator._errors import UsageError
from orchestrator._records import ChildRecord, State
from orchestrator.governance._redaction import SecretSet
from orchestrator.notify import CONTEXT_CLIP, Notifier, _notifier, desktop_argv, event_for

CEILING = 30


def record(**fields: Any) -> ChildRecord:
    values: dict[str, Any] = {
        "key": "a1",
        "name": "scout-1",
        "agent": "scout",
        "mode": "scout",
        "task": "look",
        "workspace": "/tmp",
        "backend": "scripted",
    }
    values.update(fields)
    rec = ChildRecord(**values)
    rec.state = State.IDLE
    return rec


@attrs.define
class Hook:
    """A loopback HTTP receiver: records each POST; answers *status* after *delay* seconds."""

    url: str
    bodies: list[dict[str, Any]]
    status: list[int]
    delay: list[float]
    hits: list[float]


@pytest.fixture
def hook() -> Iterator[Hook]:
    state = Hook(url="", bodies=[], status=[200], delay=[0.0], hits=[])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            state.hits.append(time.monotonic())
            length = int(self.headers["Content-Length"])
            body = json.loads(self.rfile.read(length))
            time.sleep(state.delay[0])
            state.bodies.append(body)
            self.send_response(state.status[0])
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def receiver_script(tmp_path: Path, *, sleep: float = 0.0, rc: int = 0) -> list[str]:
    out = tmp_path / "events.jsonl"
    script = tmp_path / "receiver.py"
    script.write_text(
        "import sys, time\n"
        f"time.sleep({sleep})\n"
        f"open({str(out)!r}, 'a').write(sys.stdin.read())\n"
        f"sys.exit({rc})\n"
    )
    return [sys.executable, str(script)]


def events(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def until(condition: Any, limit: float = 10.0) -> None:
    """Poll *condition* (counters with no event of their own)."""
    with trio.fail_after(limit):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.02)


def notifier(config: NotifyConfig, secrets: SecretSet | None = None, **kw: Any) -> Notifier:
    return Notifier(config, "s1", scrub=(secrets or SecretSet()).scrub, **kw)


async def test_a_command_receives_the_event_json_on_stdin(tmp_path: Path) -> None:
    n = notifier(NotifyConfig(command=receiver_script(tmp_path)))
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            n.start(nursery)
            n.note(record(), report="## Found\nthe loader is in config.py")
            n.note(record(key="a2", name="w"), error="model failed: HTTP 500", failure=True)
            await until(lambda: n.counts()["command"]["delivered"] == 2)
            nursery.cancel_scope.cancel()
    settled, failed = events(tmp_path)
    assert settled["kind"] == "settled"
    assert {k: settled[k] for k in ("session", "key", "name", "state")} == {
        "session": "s1",
        "key": "a1",
        "name": "scout-1",
        "state": "idle",
    }
    assert settled["context"] == "## Found the loader is in config.py"  # one line
    assert failed["kind"] == "failed"
    assert failed["key"] == "a2"
    assert failed["context"] == "model failed: HTTP 500"


async def test_a_report_longer_than_the_clip_never_leaves_whole(tmp_path: Path) -> None:
    n = notifier(NotifyConfig(command=receiver_script(tmp_path)))
    report = "word " * 2000
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            n.start(nursery)
            n.note(record(), report=report)
            await until(lambda: len(events(tmp_path)) == 1)
            nursery.cancel_scope.cancel()
    [event] = events(tmp_path)
    assert len(event["context"]) == CONTEXT_CLIP
    assert event["context"].endswith("…")


def test_a_hostile_report_carrying_the_childs_token_is_redacted() -> None:
    token = "f1e2d3c4b5a697880011223344556677"  # noqa: S105 - a test secret
    key = bytes(range(32))
    secrets = SecretSet([key, token])
    # The token straddles the clip: clipping first would leak its first half.
    report = "x" * (CONTEXT_CLIP - 16) + token + " and the session key " + key.hex()
    hostile = record(name=f"n-{token}")
    event = event_for(
        hostile, session="s1", report=report, error="", failure=False, scrub=secrets.scrub
    )
    text = json.dumps(event)
    assert token not in text
    assert token[:12] not in text
    assert key.hex() not in text
    assert "[redacted]" in event["context"]
    assert event["name"] == "n-[redacted]"
    failed = event_for(
        hostile,
        session="s1",
        report="",
        error=f"crashed: {token}",
        failure=True,
        scrub=secrets.scrub,
    )
    assert token not in json.dumps(failed)


async def test_the_webhook_gets_each_event_posted_as_json(tmp_path: Path, hook: Hook) -> None:
    n = notifier(NotifyConfig(webhook=hook.url))
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            n.start(nursery)
            n.note(record(), report="done")
            await until(lambda: len(hook.bodies) == 1)
            nursery.cancel_scope.cancel()
    assert hook.bodies[0]["kind"] == "settled"
    assert hook.bodies[0]["key"] == "a1"
    assert n.counts()["webhook"]["delivered"] == 1


async def test_a_failing_webhook_is_retried_a_bounded_number_of_times(
    hook: Hook, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_notifier, "BACKOFF_S", 0.01)
    hook.status[0] = 500
    n = notifier(NotifyConfig(webhook=hook.url, retries=2))
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            n.start(nursery)
            n.note(record(), report="done")
            await until(lambda: n.counts()["webhook"]["failed"] == 1)
            await trio.sleep(0.3)  # no further attempt comes
            nursery.cancel_scope.cancel()
    assert len(hook.hits) == 3  # the first attempt and two retries
    assert "HTTP 500" in n.counts()["webhook"]["last_error"]


async def test_slow_receivers_never_delay_the_caller_and_a_full_queue_drops(
    tmp_path: Path, hook: Hook, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_notifier, "QUEUE", 2)
    hook.delay[0] = 2.0
    config = NotifyConfig(
        webhook=hook.url, command=receiver_script(tmp_path, sleep=2.0), timeout_s=0.5, retries=0
    )
    n = notifier(config)
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            n.start(nursery)
            await trio.lowlevel.checkpoint()
            started = time.monotonic()
            for index in range(10):
                n.note(record(key=f"a{index}"), report="done")
            assert time.monotonic() - started < 0.1  # note() never waits for a receiver
            # Both receivers cut off once (the command's process may start later than the hook).
            await until(lambda: min(c["failed"] for c in n.counts().values()) >= 1)
            nursery.cancel_scope.cancel()
    counts = n.counts()
    # At most one in flight and two queued: the rest were dropped (counted), none waited for.
    assert counts["webhook"]["dropped"] >= 7
    assert counts["command"]["dropped"] >= 7
    # The receiver's time limit cut the slow ones off (0.5 s, not 2 s each).
    assert counts["webhook"]["last_error"].startswith(("TooSlowError", "TimeoutError"))
    assert counts["command"]["last_error"].startswith("TooSlowError")


async def test_an_unanswered_question_becomes_needs_input_an_answered_one_does_not(
    tmp_path: Path,
) -> None:
    open_questions = {"q1", "q2"}
    config = NotifyConfig(command=receiver_script(tmp_path), needs_input_after_s=0.2)
    n = notifier(config, is_open=open_questions.__contains__)
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            n.start(nursery)
            waiting = record()
            waiting.state = State.WAITING
            n.note(waiting, question=("q1", "Which database?"))
            n.note(record(key="a2"), question=("q2", "Which port?"))
            open_questions.discard("q2")  # answered at once
            await until(lambda: len(events(tmp_path)) == 1)
            await trio.sleep(0.4)
            nursery.cancel_scope.cancel()
    [event] = events(tmp_path)
    assert event["kind"] == "needs-input"
    assert event["key"] == "a1"
    assert event["state"] == "waiting"
    assert event["question"] == "q1"
    assert event["context"] == "Which database?"


async def test_events_not_chosen_are_not_sent(tmp_path: Path) -> None:
    n = notifier(NotifyConfig(command=receiver_script(tmp_path), events=["failed"]))
    with trio.fail_after(CEILING):
        async with trio.open_nursery() as nursery:
            n.start(nursery)
            n.note(record(), report="done")
            n.note(record(key="a2"), error="boom", failure=True)
            await until(lambda: len(events(tmp_path)) == 1)
            await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
    assert [e["key"] for e in events(tmp_path)] == ["a2"]


def test_the_desktop_argv_on_linux_and_macos() -> None:
    event = event_for(
        record(name='say "hi"'),
        session="s",
        report="it's done\\",
        error="",
        failure=False,
        scrub=str,
    )
    linux = desktop_argv(event, platform="linux", which=lambda name: f"/usr/bin/{name}")
    assert linux == [
        "/usr/bin/notify-send",
        "--app-name=fleet",
        "--urgency=normal",
        "--",
        'fleet: say "hi" settled',
        "it's done\\",
    ]
    mac = desktop_argv(event, platform="darwin", which=lambda name: f"/usr/bin/{name}")
    assert mac == [
        "/usr/bin/osascript",
        "-e",
        'display notification "it\'s done\\\\" with title "fleet: say \\"hi\\" settled"',
    ]
    assert desktop_argv(event, platform="linux", which=lambda _name: None) == []


def test_the_notify_settings_are_read_and_checked(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("FLEET_HOME", raising=False)
    (tmp_path / "config.yaml").write_text(
        "subagents:\n  notify:\n    command: [notify-me, --loud]\n"
        "    webhook: http://127.0.0.1:9/x\n    needs_input_after_s: 5\n"
    )
    config = load_config(home=tmp_path, cwd=tmp_path)
    assert config.notify.command == ("notify-me", "--loud")
    assert config.notify.webhook == "http://127.0.0.1:9/x"
    assert config.notify.needs_input_after_s == 5
    assert config.notify.enabled
    assert not load_config(home=tmp_path / "none", cwd=tmp_path).notify.enabled
    for bad, message in (
        ("    webhook: ftp://x\n", "http:// or https://"),
        ("    events: [settled, nope]\n", "unknown kind 'nope'"),
        ("    wat: 1\n", "unknown setting 'wat'"),
        ("    needs_input_after_s: -1\n", "must be a number >= 0"),
        ("    desktop: sometimes\n", "desktop"),
    ):
        (tmp_path / "config.yaml").write_text(f"subagents:\n  notify:\n{bad}")
        with pytest.raises(UsageError, match=message):
            load_config(home=tmp_path, cwd=tmp_path)
