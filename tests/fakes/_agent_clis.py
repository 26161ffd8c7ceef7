"""Run the real agent CLIs (Pi, Claude Code, Codex, Gemini CLI, opencode) offline, against the
scripted model server.

Each ``*_command`` writes the CLI's private state (config, HOME, TMPDIR) under `state_dir` and
returns the argv, environment and cwd that make it talk only to `base_url`. The flags and
variables are the ones verified against the pinned versions in ``scripts/install-agent-clis``
(details and traps: ``docs/testing.md``). The environment is built from scratch, not copied from
ours, so no proxy variable, API key or user config leaks into a test.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping

REPO = Path(__file__).resolve().parents[2]
NPM_BIN = REPO / ".npm-prefix" / "bin"
MAX_LINE_BYTES = 4 * 1024 * 1024


@attrs.frozen(kw_only=True)
class CliCommand:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _base_env(home: Path) -> dict[str, str]:
    # The CLIs are node scripts (`#!/usr/bin/env node`) or need rg/fd: our bin first, then the
    # directory of the node that installed them, then the system.
    node = shutil.which("node")
    path = [str(NPM_BIN)] + ([str(Path(node).parent)] if node else []) + ["/usr/bin", "/bin"]
    return {"PATH": os.pathsep.join(path), "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb"}


def pi_command(
    *,
    base_url: str,
    workspace: Path,
    state_dir: Path,
    binary: str = "pi",
) -> CliCommand:
    """``pi --mode rpc`` on provider ``fake``, model ``fake-model``; ``pi-next`` runs 1.6.0."""
    agent_dir = _private_dir(state_dir / "pi-agent")
    model = {
        "id": "fake-model",
        "name": "Fake model",
        "reasoning": False,
        "input": ["text"],
        "contextWindow": 128_000,
        "maxTokens": 4096,
        # Dollars per million tokens: non-zero so cost mapping is observable.
        "cost": {"input": 1.0, "output": 2.0, "cacheRead": 0.5, "cacheWrite": 0.0},
    }
    provider = {
        "baseUrl": f"{base_url}/v1",
        "api": "openai-completions",
        "apiKey": "sk-scripted",  # any non-empty value: without one pi silently drops the provider
        "models": [model],
    }
    (agent_dir / "models.json").write_text(json.dumps({"providers": {"fake": provider}}))
    # Retries off: otherwise one scripted 500 becomes up to a dozen requests and agent_ends.
    settings = {"retry": {"enabled": False, "provider": {"maxRetries": 0}}}
    (agent_dir / "settings.json").write_text(
        json.dumps(settings | {"compaction": {"enabled": False}})
    )
    env = _base_env(_private_dir(state_dir / "home"))
    env |= {"PI_CODING_AGENT_DIR": str(agent_dir), "PI_OFFLINE": "1"}
    argv = [
        str(NPM_BIN / binary),
        "--mode",
        "rpc",
        "--no-session",
        "--provider",
        "fake",
        "--model",
        "fake-model",
        "--tools",
        "read,grep,find,ls",
        "--no-extensions",
        "--no-skills",
        "--no-prompt-templates",
        "--no-themes",
        "--no-context-files",
    ]
    return CliCommand(argv=tuple(argv), env=env, cwd=workspace)


def claude_command(
    *,
    base_url: str,
    workspace: Path,
    state_dir: Path,
    bare: bool = False,
) -> CliCommand:
    """``claude -p`` with stream-json in and out; ``bare`` trims each request to ~4 KB."""
    env = _base_env(_private_dir(state_dir / "home"))
    env |= {
        "TMPDIR": str(_private_dir(state_dir / "tmp")),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-ant-scripted",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS": "10000",
    }
    argv = [
        str(NPM_BIN / "claude"),
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--input-format",
        "stream-json",
        "--no-session-persistence",
        "--permission-mode",
        "acceptEdits",
        # With "=": a bare list would swallow the next argument as another tool name.
        "--allowedTools=Read,Bash",
    ]
    if bare:
        argv.append("--bare")
    return CliCommand(argv=tuple(argv), env=env, cwd=workspace)


def codex_command(
    *,
    base_url: str,
    workspace: Path,
    state_dir: Path,
    prompt: str,
) -> CliCommand:
    """``codex exec --json``; run it with stdin = /dev/null (an open pipe blocks it)."""
    codex_home = _private_dir(state_dir / "codex-home")
    # Not an ancestor of CODEX_HOME: a CODEX_HOME inside TMPDIR breaks codex's sandboxed tools.
    scratch = _private_dir(state_dir / "scratch")
    config = f"""\
model = "fake-model"
model_provider = "fake"
approval_policy = "never"

[analytics]
enabled = false

[features]
plugins = false
unbounded_connection_retries = false

[model_providers.fake]
name = "fake"
base_url = {json.dumps(base_url + "/v1")}
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 10000
"""
    (codex_home / "config.toml").write_text(config)
    env = _base_env(_private_dir(state_dir / "home"))
    env |= {"CODEX_HOME": str(codex_home), "TMPDIR": str(scratch)}
    argv = [
        str(NPM_BIN / "codex"),
        "exec",
        "--json",
        "--skip-git-repo-check",
        "-s",
        "read-only",
        prompt,
    ]
    return CliCommand(argv=tuple(argv), env=env, cwd=workspace)


def gemini_command(
    *,
    base_url: str,
    workspace: Path,
    state_dir: Path,
    prompt: str,
) -> CliCommand:
    """``gemini -p`` (headless, JSON out) on the Gemini API at `base_url`, model ``fake-model``.

    ``-m`` names the model: without it gemini first asks a routing model for a JSON complexity
    score. ``--skip-trust``: headless gemini exits 55 in a folder nobody trusted.
    """
    home = _private_dir(state_dir / "home")
    settings = {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    }
    (_private_dir(home / ".gemini") / "settings.json").write_text(json.dumps(settings))
    env = _base_env(home)
    env |= {
        "GEMINI_API_KEY": "scripted-gemini-key",
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "TMPDIR": str(_private_dir(state_dir / "tmp")),
    }
    argv = [str(NPM_BIN / "gemini"), "--skip-trust", "-m", "fake-model", "-o", "json"]
    return CliCommand(argv=(*argv, "-p", prompt), env=env, cwd=workspace)


def opencode_command(
    *,
    base_url: str,
    workspace: Path,
    state_dir: Path,
    prompt: str,
) -> CliCommand:
    """``opencode run`` on an OpenAI-compatible provider ``fake`` at `base_url` + ``/v1``.

    The provider package (``@ai-sdk/openai-compatible``) is bundled in the binary. opencode
    would fetch models.dev and npm-install its default plugins: both are turned off, and npm
    points at a closed loopback port so nothing else is tried.
    """
    home = _private_dir(state_dir / "home")
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Fake",
        "options": {"baseURL": f"{base_url}/v1", "apiKey": "sk-scripted"},
        "models": {"fake-model": {"name": "Fake model"}},
    }
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"fake": provider},
        "model": "fake/fake-model",
        "autoupdate": False,
        "share": "disabled",
    }
    path = _private_dir(state_dir / "opencode") / "config.json"
    path.write_text(json.dumps(config))
    env = _base_env(home)
    env |= {
        "OPENCODE_CONFIG": str(path),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "npm_config_registry": "http://127.0.0.1:9/",
        "TMPDIR": str(_private_dir(state_dir / "tmp")),
    }
    argv = [str(NPM_BIN / "opencode"), "run", "--model", "fake/fake-model", prompt]
    return CliCommand(argv=tuple(argv), env=env, cwd=workspace)


async def json_lines(stream: trio.abc.ReceiveStream) -> AsyncGenerator[dict[str, Any], None]:
    """JSON objects from a JSONL stream: split on ``\\n`` bytes only, each line capped in size."""
    buffer = bytearray()
    while True:
        newline = buffer.find(b"\n")
        if newline < 0:
            if len(buffer) > MAX_LINE_BYTES:
                raise ValueError(f"json_lines: a line exceeds {MAX_LINE_BYTES} bytes")
            data = await stream.receive_some(65536)
            if not data:
                if buffer.strip():  # a last record without its newline is still a record
                    yield json.loads(bytes(buffer))
                return
            buffer += data
            continue
        line = bytes(buffer[:newline]).removesuffix(b"\r")
        del buffer[: newline + 1]
        if line.strip():
            yield json.loads(line)


@attrs.define(eq=False)
class CliSession:
    """A running JSONL-speaking CLI (Pi RPC, Claude stream-json): send lines, read events."""

    process: trio.Process
    events: list[dict[str, Any]] = attrs.field(factory=list)
    _lines: AsyncGenerator[dict[str, Any], None] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        assert self.process.stdout is not None  # open_cli always pipes stdout
        self._lines = json_lines(self.process.stdout)

    async def send(self, message: Mapping[str, Any]) -> None:
        assert self.process.stdin is not None  # open_cli always pipes stdin
        await self.process.stdin.send_all(json.dumps(message).encode() + b"\n")

    async def until(self, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Read events (all kept in `events`) up to and including the first `wanted` one."""
        async for event in self._lines:
            self.events.append(event)
            if wanted(event):
                return event
        raise EOFError(f"CLI stdout ended (exit {self.process.poll()}) before the awaited event")

    async def finish(self) -> int:
        """Close stdin (how both CLIs are told to exit) and wait for the exit code."""
        assert self.process.stdin is not None  # open_cli always pipes stdin
        await self.process.stdin.aclose()
        return await self.process.wait()


@contextlib.asynccontextmanager
async def open_cli(command: CliCommand, stderr_log: Path) -> AsyncIterator[CliSession]:
    """Start `command` with piped stdin/stdout (stderr to `stderr_log`); kill it if left running."""
    with stderr_log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            list(command.argv),
            cwd=command.cwd,
            env=dict(command.env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    session = CliSession(process=process)
    try:
        yield session
    finally:
        if process.returncode is None:
            process.kill()
        # Shielded: a test cancelled by its own deadline must still reap what it started.
        with trio.CancelScope(shield=True):
            with trio.move_on_after(10):
                await process.wait()
            await session._lines.aclose()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    await trio.aclose_forcefully(pipe)
