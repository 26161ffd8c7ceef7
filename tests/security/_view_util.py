"""A fleet world for the view tests: a git repository, a private FLEET_HOME, hostile payloads.

A hostile child is a ``command``-backend child running :data:`PAYLOAD` (standing in for an agent
CLI after a prompt injection). It performs each ``kind:argument`` operation it is given and
writes ``{op: result}`` as JSON to ``$TMPDIR/view-results.json`` (its scratch): ``"ok"``,
``"ok:<content>"`` for reads and listings, or the errno name the attempt failed with. The test
then checks the host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest

from orchestrator._config import Config
from orchestrator._records import SpawnRequest

if TYPE_CHECKING:
    from collections.abc import Iterator

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}

PAYLOAD = r"""
import errno, json, os, socket, subprocess, sys
out = {}
for op in json.loads(sys.argv[1]):
    kind, _, arg = op.partition(":")
    arg = os.path.expandvars(arg)
    try:
        if kind == "read":
            with open(arg, "rb") as f:
                out[op] = "ok:" + f.read().decode(errors="replace")
            continue
        if kind == "list":
            out[op] = "ok:" + ",".join(sorted(os.listdir(arg)))
            continue
        if kind == "readlink":
            out[op] = "ok:" + os.readlink(arg)
            continue
        if kind == "procs":
            # Every process this child can see, and what it can read of each.
            seen = []
            for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        seen.append(f.read(80).replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    pass
            out[op] = "ok:" + "|".join(seen)
            continue
        if kind == "write":
            with open(arg, "a") as f:
                f.write("hostile")
        elif kind == "setuid":
            # Make a file and try every way to give it the setuid and setgid bits.
            with open(arg, "w") as f:
                f.write("#!/bin/sh\nid\n")
            results = []
            for how in ("chmod", "fchmod", "open"):
                try:
                    if how == "chmod":
                        os.chmod(arg, 0o6755)
                    elif how == "fchmod":
                        fd = os.open(arg, os.O_RDONLY)
                        try:
                            os.fchmod(fd, 0o4755)
                        finally:
                            os.close(fd)
                    else:
                        os.close(os.open(arg + ".new", os.O_CREAT | os.O_WRONLY, 0o4755))
                    results.append(how + "=ok")
                except OSError as exc:
                    results.append(how + "=" + errno.errorcode.get(exc.errno, str(exc)))
            out[op] = ",".join(results)
            continue
        elif kind == "tmux":
            # arg: "SOCKET MARKER": ask a tmux server to touch MARKER on its host.
            sock, marker = arg.split(" ")
            done = subprocess.run(
                ["tmux", "-S", sock, "run-shell", "touch " + marker],
                capture_output=True, text=True, timeout=10,
            )
            out[op] = f"exit {done.returncode}: {done.stderr.strip()}"
            continue
        elif kind == "unix":
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(arg)
        elif kind == "status":
            with open("/proc/self/status") as f:
                out[op] = "ok:" + ";".join(
                    line.strip() for line in f if line.startswith(("Cap", "Uid", "NoNewPrivs"))
                )
            continue
        out[op] = "ok"
    except OSError as exc:
        out[op] = errno.errorcode.get(exc.errno, str(exc))
# The report is capped: the full results go to scratch, which the test reads on the host.
with open(os.path.join(os.environ["TMPDIR"], "view-results.json"), "w") as f:
    json.dump(out, f)
print(json.dumps({op: result[:60] for op, result in out.items()}))
"""


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README.md").write_text("# repo\n")
    env = {**os.environ, **GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=path, env=env, check=True, capture_output=True)
    return path


@attrs.define
class World:
    home: Path
    repo: Path
    scripts: Path

    @property
    def session(self) -> Path:
        return self.home / "sessions" / "t"

    def config(self, **overrides: Any) -> Config:
        settings: dict[str, Any] = {"agents_scope": "project", "kill_grace": 1.0, **overrides}
        return Config(home=self.home, session="t", workspace=self.repo, **settings)

    def script(self, name: str, text: str) -> str:
        path = self.scripts / f"{name}.yaml"
        path.write_text(textwrap.dedent(text))
        return f"scripted:{path}"

    def honest(self, name: str = "honest") -> SpawnRequest:
        """A builtin scout that reads the README and reports."""
        model = self.script(
            "honest",
            """
            turns:
              - steps:
                  - tool: read
                    args: {path: README.md}
                  - reply: "honest: {{last}}"
            """,
        )
        return SpawnRequest(task="read the readme", name=name, model=model)

    @staticmethod
    def hostile(ops: list[str], *, name: str = "hostile", mode: str | None = None) -> SpawnRequest:
        return SpawnRequest(
            task="escape",
            name=name,
            mode=mode,
            agent="worker" if mode == "worktree" else "scout",
            backend="command",
            command=(sys.executable, "-c", PAYLOAD, json.dumps(ops)),
        )


def results(world: World, key: str) -> dict[str, str]:
    """The hostile payload's ``{op: result}``, as it left them in its scratch dir."""
    data: dict[str, str] = json.loads(
        (world.session / "scratch" / key / "view-results.json").read_text()
    )
    return data


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    # Short: socket paths must fit sun_path.
    home = Path(tempfile.mkdtemp(prefix="flv-", dir="/tmp"))
    monkeypatch.setenv("FLEET_HOME", str(home))
    monkeypatch.delenv("FLEET_MODEL", raising=False)
    monkeypatch.delenv("FLEET_SESSION", raising=False)
    monkeypatch.delenv("FLEET_SANDBOX", raising=False)
    monkeypatch.delenv("FLEET_ALLOW_UNSANDBOXED", raising=False)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    try:
        yield World(home=home, repo=make_repo(tmp_path / "repo"), scripts=scripts)
    finally:
        shutil.rmtree(home, ignore_errors=True)
