"""A world for the impostor tests: a repository, scripts, a private FLEET_HOME, and payloads.

The payloads are what a hostile child (or a hostile process outside the fleet) runs: they
speak the wire by hand, with every token they can find, and print what they got as JSON.
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest

from orchestrator._config import Config

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}

#: Frames by hand: a hostile child brings its own client, not ours.
WIRE = r"""
import json, os, socket, struct

def frame(owner, token, corr, kind, type_, body):
    data = json.dumps({"v": 1, "token": token, "owner": owner, "corr": corr,
                       "kind": kind, "type": type_, "body": body}).encode()
    return struct.pack(">I", len(data)) + data

def hello(path, owner, token, timeout=2.0):
    # Connect to *path* and present a hello; the open socket if the supervisor said ok.
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        sock.sendall(frame(owner, token, "0", "request", "hello",
                           {"pid": os.getpid(), "backend": "builtin"}))
        head = sock.recv(4)
        if len(head) < 4:
            sock.close()
            return None
        size = struct.unpack(">I", head)[0]
        body = b""
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            if not chunk:
                break
            body += chunk
        reply = json.loads(body)
        if reply.get("kind") == "response" and reply.get("body", {}).get("ok"):
            return sock
    except OSError:
        pass
    sock.close()
    return None
"""

#: The hostile sibling: loops until *stop* exists, trying every way to speak for a sibling.
HOSTILE = (
    WIRE
    + r"""
import glob, sys, time

home, sock_path, stop = sys.argv[1], sys.argv[2], sys.argv[3]
tokens = {}            # owner -> token, from anything readable
attempts = 0           # hellos presented to the listener
wins = []              # owners whose hello the supervisor accepted
memfds = 0             # other processes' loadout memfds it managed to read
sockets_opened = 0     # other processes' sockets it managed to open through /proc
seen = set()
deadline = time.monotonic() + 240
while not os.path.exists(stop) and time.monotonic() < deadline:
    for path in glob.glob(os.path.join(home, "**", "*.json"), recursive=True):
        try:
            data = json.loads(open(path, "rb").read())
            tokens[data["owner"]] = data["token"]
        except Exception:
            pass
    for link in glob.glob("/proc/[0-9]*/fd/*"):
        if link.startswith(f"/proc/{os.getpid()}/"):
            continue
        try:
            target = os.readlink(link)
        except OSError:
            continue
        try:
            if target.startswith("/memfd:fleet-loadout"):
                with open(link, "rb") as handle:
                    data = json.loads(handle.read())
                tokens[data["owner"]] = data["token"]
                memfds += 1
            elif target.startswith("socket:") and link not in seen:
                seen.add(link)
                os.close(os.open(link, os.O_RDWR))
                sockets_opened += 1
        except Exception:
            pass
    if os.path.exists(sock_path):
        known = [int(o[1:]) for o in tokens if o[1:].isdigit()] or [1]
        owners = {f"a{n}" for n in range(max(known), max(known) + 4)} | set(tokens)
        for owner in sorted(owners):
            for token in {tokens.get(owner, "0" * 64), *list(tokens.values())[-3:]}:
                attempts += 1
                won = hello(sock_path, owner, token, timeout=0.5)
                if won is not None:
                    wins.append(owner)
                    for turn in (1, 2):
                        won.sendall(frame(owner, token, str(100 + turn), "event", "settled",
                                          {"turn": turn, "text": "IMPERSONATED"}))
                    time.sleep(0.5)
                    won.close()
    time.sleep(0.01)
print(json.dumps({"attempts": attempts, "wins": wins, "memfds": memfds,
                  "sockets_opened": sockets_opened, "tokens": len(tokens),
                  "listener": os.path.exists(sock_path)}))
"""
)

#: An impostor outside the fleet: waits for *owner*'s loadout file, and hellos with its token.
OUTSIDER = (
    WIRE
    + r"""
import sys, time

loadout, sock_path, owner = sys.argv[1], sys.argv[2], sys.argv[3]
deadline = time.monotonic() + 30
token = None
while token is None and time.monotonic() < deadline:
    try:
        token = json.loads(open(loadout, "rb").read())["token"]
    except (OSError, ValueError):
        time.sleep(0.0005)
attempts, wins = 0, 0
# Keep trying while the real child starts: a token is good until its child has connected.
until = time.monotonic() + 3
while token is not None and time.monotonic() < until:
    attempts += 1
    if hello(sock_path, owner, token) is not None:
        wins += 1
    time.sleep(0.05)
print(json.dumps({"token": token is not None, "attempts": attempts, "wins": wins}))
"""
)


def make_repo(path: Path) -> Path:
    (path / "src").mkdir(parents=True)
    (path / "README.md").write_text("# sample\n\nThe answer is 42.\n")
    env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=path, env=env, check=True, capture_output=True)
    return path


def fleet_processes(home: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["pid", "environ"]):
        try:
            if process.pid == os.getpid():
                continue
            environ = process.info["environ"] or {}
            if environ.get("FLEET_HOME") == str(home) and (
                process.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(process)
        except psutil.Error:
            continue
    return found


@attrs.define
class World:
    home: Path
    repo: Path
    scripts: Path

    def config(self, **overrides: Any) -> Config:
        settings: dict[str, Any] = {"agents_scope": "project", "kill_grace": 1.0, **overrides}
        return Config(home=self.home, session="t", workspace=self.repo, **settings)

    def script(self, name: str, text: str) -> str:
        path = self.scripts / f"{name}.yaml"
        path.write_text(textwrap.dedent(text))
        return f"scripted:{path}"

    def payload(self, name: str, text: str) -> str:
        # In the repository's .git: visible (read-only) inside a scout's sandbox, and no
        # change to the work tree.
        path = self.repo / ".git" / f"{name}.py"
        path.write_text(text)
        return str(path)

    def rejected(self) -> list[dict[str, Any]]:
        path = self.home / "sessions" / "t" / "logs" / "rejected.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    # Short: socket paths must fit sun_path. Children inherit FLEET_HOME: how they are found.
    home = Path(tempfile.mkdtemp(prefix="fls-", dir="/tmp"))
    monkeypatch.setenv("FLEET_HOME", str(home))
    monkeypatch.setenv("TMUX_TMPDIR", str(home))
    for name in ("FLEET_MODEL", "FLEET_SESSION", "TMUX", "TMUX_PANE", "FLEET_KEEP_FAILED_PANES"):
        monkeypatch.delenv(name, raising=False)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    found = World(home=home, repo=make_repo(tmp_path / "repo"), scripts=scripts)
    try:
        yield found
    finally:
        deadline = time.monotonic() + 10
        while fleet_processes(home) and time.monotonic() < deadline:
            time.sleep(0.1)
        leftovers = fleet_processes(home)
        for process in leftovers:
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.Error:
                continue
        shutil.rmtree(home, ignore_errors=True)
        assert not leftovers, f"processes survived: {leftovers}"
