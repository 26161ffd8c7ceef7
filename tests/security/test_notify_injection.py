"""A hostile child's words against the notifiers (``subagents.notify``): a command, a webhook and
the desktop notifier, all real (a receiver script, a raw loopback HTTP server, a stand-in
``notify-send`` on ``PATH``), fed by real sandboxed children through the real supervisor.

What the child controls reaches every receiver: its report (a ``settled`` event), its question
(``needs-input``), its name (a nested spawn names its child) and the task echoed back. Each
carries shell metacharacters, ``$(…)`` and backticks, newlines, a leading ``-`` that would be
an option, a JSON break-out, a CRLF header injection and an AppleScript break-out. None may
run anything, add an argv word or option, add a header, or change the JSON's keys.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from orchestrator._config import Config
from orchestrator.core._supervisor import SpawnRequest, open_supervisor
from orchestrator.notify._receivers import desktop_argv

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.slow, pytest.mark.needs("sandbox")]

CEILING = 90
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def payload(marker: Path) -> str:
    """Every way a text could break out of where a notifier puts it, each touching *marker*."""
    return (
        f"$(touch {marker}) `touch {marker}` ; touch {marker} && touch {marker} | touch {marker}"
        f'\n--urgency=low -rf "}}, "kind": "owned", "x": "'
        f'\r\nX-Injected: yes\r\n\r\n{{"kind": "owned"}}'
        f'" & (do shell script "touch {marker}") & "'
        f'\\" & (do shell script "touch {marker}") & \\"'
    )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    home = Path(tempfile.mkdtemp(prefix="fni-", dir="/tmp"))  # short socket paths
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("# sample\n")
    git_env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=repo, env=git_env, check=True, capture_output=True)
    try:
        yield {"home": home, "repo": repo, "tmp": tmp_path}
    finally:
        shutil.rmtree(home, ignore_errors=True)


class RawHttp:
    """A loopback HTTP server that keeps each request's raw bytes (head and body)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + body)
                conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


def recorder(path: Path, out: Path) -> Path:
    """A program that appends its argv and stdin, as one JSON line, to *out*."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"with open({str(out)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'stdin': sys.stdin.read()}) + '\\n')\n"
    )
    path.chmod(0o755)
    return path


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def until(condition: Any) -> None:
    while not condition():  # noqa: ASYNC110 - files other processes write
        await trio.sleep(0.05)


async def test_a_hostile_childs_words_inject_into_no_notifier(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp: Path = world["tmp"]
    marker = tmp / "injected"
    evil = payload(marker)
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    commands, desktops = tmp / "command.jsonl", tmp / "desktop.jsonl"
    receiver = recorder(tmp / "receiver", commands)
    recorder(bin_dir / "notify-send", desktops)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    server = RawHttp()
    asks = tmp / "asks.yaml"
    asks.write_text(
        textwrap.dedent(
            f"""
            turns:
              - steps:
                  - tool: ask_parent
                    args: {{question: {json.dumps(evil)}}}
                  - reply: "answered"
            """
        )
    )
    config = Config(
        home=world["home"],
        session="t",
        workspace=world["repo"],
        notify={
            "command": [str(receiver), "--fixed"],
            "webhook": server.url,
            "desktop": True,
            "needs_input_after_s": 0.3,
            "events": ["settled", "failed", "needs-input"],
        },
    )
    code = f"import sys; sys.stdout.write({evil!r} + ' task: ' + sys.stdin.read())"
    try:
        with trio.fail_after(CEILING):
            async with open_supervisor(config) as sup:
                [talker, asker] = await sup.spawn(
                    [
                        SpawnRequest(
                            task=evil,
                            name=f"-rf $(touch {marker})\nX-Injected: yes",
                            backend="command",
                            command=(sys.executable, "-c", code),
                        ),
                        SpawnRequest(task="ask", name="asker", model=f"scripted:{asks}"),
                    ]
                )
                assert talker.sandboxed
                assert asker.sandboxed
                await sup.wait([talker.key])
                [asked] = await sup.wait([asker.key])
                await until(lambda: len(lines(commands)) >= 2 and len(server.requests) >= 2)
                await until(lambda: len(lines(desktops)) >= 2)
                sup.answer(asked["question"]["id"], "fine")
                await sup.wait([asker.key])
                await until(lambda: len(lines(commands)) >= 3 and len(server.requests) >= 3)
    finally:
        server.close()

    assert not marker.exists(), "a child's words ran a command"
    sent = lines(commands)
    # The command: exactly its configured argv, the event one line of JSON on stdin.
    for call in sent:
        assert call["argv"] == ["--fixed"], call
        assert call["stdin"].count("\n") == 1, call
        json.loads(call["stdin"])
    events = [json.loads(c["stdin"]) for c in sent]
    keys = {"kind", "session", "key", "name", "state", "context", "at"}
    for event in events:
        assert keys <= set(event) <= keys | {"question", "waited_s"}, event
        assert event["kind"] in {"settled", "failed", "needs-input"}, event
    by_key = {(e["key"], e["kind"]): e for e in events}
    talked = by_key[(talker.key, "settled")]
    assert talked["name"] == f"-rf $(touch {marker})\nX-Injected: yes"  # data, not an option
    assert talked["context"].startswith("$(touch ")  # the report, as one clipped line
    assert "\n" not in talked["context"]
    assert "\r" not in talked["context"]
    needs = by_key[(asker.key, "needs-input")]
    assert needs["context"].startswith("$(touch ")

    # The webhook: our headers only, and a body that is exactly the same JSON events.
    for raw in server.requests:
        head, _, body = raw.partition(b"\r\n\r\n")
        names = [line.split(b":", 1)[0].lower() for line in head.split(b"\r\n")[1:]]
        assert b"x-injected" not in names, head
        assert head.split(b"\r\n")[0] == b"POST /hook HTTP/1.1", head
        event = json.loads(body)
        assert keys <= set(event), event
        assert event["kind"] in {"settled", "failed", "needs-input"}, event
    assert sorted(
        json.loads(r.partition(b"\r\n\r\n")[2])["key"] for r in server.requests
    ) == sorted(e["key"] for e in events)

    # The desktop: notify-send's own options, then "--", then exactly the title and the body.
    for call in lines(desktops):
        argv = call["argv"]
        assert len(argv) == 5, argv
        assert argv[0] == "--app-name=fleet", argv
        assert argv[1] in {"--urgency=normal", "--urgency=critical"}, argv
        assert argv[2] == "--", argv
        assert argv[3].startswith("fleet: "), argv


def applescript_strings(script: str) -> list[str]:
    """The string literals of an AppleScript source, decoded (``\\"`` and ``\\\\`` escapes);
    raises on an unterminated one."""
    found, i = [], 0
    while (start := script.find('"', i)) != -1:
        j, text = start + 1, []
        while script[j] != '"':
            if script[j] == "\\":
                j += 1
            text.append(script[j])
            j += 1
        found.append("".join(text))
        i = j + 1
    return found


@pytest.mark.parametrize("platform", ["darwin", "linux"])
def test_the_desktop_notifier_keeps_a_hostile_name_and_text_inside_their_words(
    platform: str, tmp_path: Path
) -> None:
    evil = payload(tmp_path / "injected")
    event = {"kind": "needs-input", "key": "a1", "name": evil, "state": "waiting", "context": evil}
    argv = desktop_argv(event, platform=platform, which=lambda name: f"/usr/bin/{name}")
    title = f"fleet: {evil} needs your input"
    if platform == "darwin":
        assert len(argv) == 3, argv
        assert argv[:2] == ["/usr/bin/osascript", "-e"], argv
        script = argv[2]
        assert applescript_strings(script) == [evil, title], script
        # Outside the two literals: exactly the one command, nothing the child wrote.
        outside = script
        for literal in (
            '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"' for s in (evil, title)
        ):
            outside = outside.replace(literal, "", 1)
        assert outside == "display notification  with title ", outside
    else:
        assert argv == [
            "/usr/bin/notify-send",
            "--app-name=fleet",
            "--urgency=critical",
            "--",
            title,
            evil,
        ]
