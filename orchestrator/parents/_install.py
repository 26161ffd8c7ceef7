"""``fleet install``/``uninstall``: registering ``fleet mcp`` in a parent's own configuration.

Each parent has an :class:`Installer`; :data:`INSTALLERS` is the table the CLI reads. Install
is idempotent and prints what it changed; uninstall removes exactly what install added (the
other bytes of each file stay as they were). The registered command is this interpreter's
``python -m orchestrator mcp``, so the parent starts the very fleet that installed it. No
installer reads or writes a credential: they add one server entry and the allow rules that
let the parent call fleet's tools without a prompt nobody can answer.
"""

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import tomlkit
import tomlkit.exceptions

from orchestrator._errors import UsageError
from orchestrator.parents import _install_fs as fs
from orchestrator.parents import _install_json as js
from orchestrator.parents._install_fs import Place
from orchestrator.parents._install_pi import PiInstaller

Scope = Literal["project", "user"]
SERVER: Final = "fleet"
CLAUDE_RULE: Final = "mcp__fleet"  # every tool of the fleet server, nothing else
CREATED_DIRS: Final = frozenset({".claude", ".codex", ".gemini", "opencode", ".config"})
FLEET_VARIABLES: Final = (
    "FLEET_HOME",
    "FLEET_SESSION",
    "FLEET_MODEL",
    "FLEET_MAX_SUBAGENTS",
    "FLEET_LANE",
    "FLEET_ALLOW_UNSANDBOXED",
    "FLEET_AGENT_DIRS",
    "FLEET_SANDBOX",
    "FLEET_SURFACE",
)
CODEX_TIMEOUT: Final = 120  # seconds: wait may block up to 100
OPENCODE_SCHEMA: Final = "https://opencode.ai/config.json"
#: What a parent needs before it uses what install wrote, said in one line after the install.
TRUST: Final = {
    ("codex", "project"): (
        "note: codex reads {project}/.codex/config.toml only once the project is trusted: "
        'run `codex` there and trust it, or add [projects."{project}"] '
        'trust_level = "trusted" to ~/.codex/config.toml (or install with --user)'
    ),
    ("gemini", "project"): (
        "note: gemini reads {project}/.gemini/settings.json only in a trusted folder: run "
        "`gemini` there and trust it (headless: GEMINI_CLI_TRUST_WORKSPACE=true; --skip-trust "
        "does not load it)"
    ),
    ("gemini", "user"): (
        "note: gemini starts MCP servers only in a trusted folder: run `gemini` in each "
        "project once and trust it (headless: --skip-trust or GEMINI_CLI_TRUST_WORKSPACE=true)"
    ),
    ("pi", "project"): (
        "note: pi 1.x loads {project}/.pi/extensions only once the project is trusted: "
        "/trust in pi, or `pi --approve` per run"
    ),
}


def trust_note(parent: str, scope: Scope, project: Path) -> str | None:
    """The one line that says how *parent* comes to load what ``install`` wrote, if it must."""
    note = TRUST.get((parent, scope))
    return note.format(project=project) if note else None


class Installer(Protocol):
    name: str

    def install(self, scope: Scope, *, home: Path, project: Path) -> list[str]: ...

    def uninstall(self, scope: Scope, *, home: Path, project: Path) -> list[str]: ...


def fleet_argv() -> list[str]:
    """The command a parent runs: this interpreter's fleet, whatever the parent's PATH."""
    return [str(Path(sys.executable).absolute()), "-P", "-m", "orchestrator", "mcp"]


def place_of(scope: Scope, home: Path, project: Path) -> Place:
    """Where *scope* writes: the project (no link followed below it) or the user's home."""
    return Place(project, confined=True) if scope == "project" else Place(home, confined=False)


def _write(place: Place, path: Path, before: str | None, after: str, lines: list[str]) -> None:
    if after == (before if before is not None else ""):
        return
    if before is not None and after in {"", "{}\n"} and not path.is_symlink():
        gone = [path, *fs.remove(place, path, CREATED_DIRS)]
        lines.extend(f"removed {p}" for p in gone)
        return
    fs.write(place, path, after)
    lines.append(f"{'wrote' if before is None else 'updated'} {path}")


Edit = Callable[[str, Path], str]


def _edit_json(
    place: Place, path: Path, edits: list[Edit], lines: list[str], *, remove: bool
) -> tuple[Path, str | None, str] | None:
    """What *edits* make of *path*: (path, before, after), or ``None`` when nothing changes."""
    before = fs.read(place, path)
    if before is None and remove:
        lines.append(f"{path} not installed")
        return None
    text = before if before is not None else "{}\n"
    for edit in edits:
        text = edit(text, path)
    if text == (before if before is not None else "{}\n"):
        lines.append(f"{path} {'not installed' if remove else 'already up to date'}")
        return None
    return path, before, text


def _member(keys: list[str], value: Any) -> tuple[Edit, Edit]:
    return (
        lambda text, path: js.set_member(text, keys, value, path),
        lambda text, path: js.remove_member(text, keys, path),
    )


def _item(keys: list[str], item: Any) -> tuple[Edit, Edit]:
    return (
        lambda text, path: js.add_item(text, keys, item, path),
        lambda text, path: js.remove_item(text, keys, item, path),
    )


class JsonInstaller:
    """A parent whose registration is members of JSON files."""

    def __init__(
        self,
        name: str,
        files: Callable[[Scope, Path, Path], list[tuple[Path, list[tuple[Edit, Edit]]]]],
    ) -> None:
        self.name = name
        self._files = files

    def install(self, scope: Scope, *, home: Path, project: Path) -> list[str]:
        return self._run(scope, home, project, remove=False)

    def uninstall(self, scope: Scope, *, home: Path, project: Path) -> list[str]:
        return self._run(scope, home, project, remove=True)

    def _run(self, scope: Scope, home: Path, project: Path, *, remove: bool) -> list[str]:
        # Every file is read and edited before the first is written: a link, a broken file or
        # anything else refused leaves all of them as they were.
        lines: list[str] = []
        place = place_of(scope, home, project)
        pending = []
        for path, edits in self._files(scope, home, project):
            chosen = [rm for _, rm in reversed(edits)] if remove else [add for add, _ in edits]
            change = _edit_json(place, path, chosen, lines, remove=remove)
            if change is not None:
                pending.append(change)
        for path, before, after in pending:
            _write(place, path, before, after, lines)
        return lines


def _claude(scope: Scope, home: Path, project: Path) -> list[tuple[Path, list[tuple[Edit, Edit]]]]:
    command, *args = fleet_argv()
    # alwaysLoad: connected before the first turn and never deferred behind tool search.
    entry = {"type": "stdio", "command": command, "args": args, "alwaysLoad": True}
    if scope == "user":
        return [
            (home / ".claude.json", [_member(["mcpServers", SERVER], entry)]),
            (home / ".claude" / "settings.json", [_item(["permissions", "allow"], CLAUDE_RULE)]),
        ]
    return [
        (project / ".mcp.json", [_member(["mcpServers", SERVER], entry)]),
        (
            project / ".claude" / "settings.local.json",
            [
                _item(["permissions", "allow"], CLAUDE_RULE),
                _item(["enabledMcpjsonServers"], SERVER),
            ],
        ),
    ]


def _gemini(scope: Scope, home: Path, project: Path) -> list[tuple[Path, list[tuple[Edit, Edit]]]]:
    command, *args = fleet_argv()
    # trust: this server's tool calls need no confirmation (the other servers' still do).
    entry = {"command": command, "args": args, "trust": True}
    base = home if scope == "user" else project
    return [(base / ".gemini" / "settings.json", [_member(["mcpServers", SERVER], entry)])]


def _opencode(
    scope: Scope, home: Path, project: Path
) -> list[tuple[Path, list[tuple[Edit, Edit]]]]:
    entry = {"type": "local", "command": fleet_argv(), "enabled": True}
    path = (
        home / ".config" / "opencode" / "opencode.json"
        if scope == "user"
        else project / "opencode.json"
    )
    return [(path, [_opencode_schema(), _member(["mcp", SERVER], entry)])]


def _opencode_schema() -> tuple[Edit, Edit]:
    """opencode inserts ``"$schema"`` into every config it loads that has none, so a file
    fleet creates carries it from the start (and opencode leaves the file alone); uninstall
    takes it away only with a file that holds nothing else, which then goes."""
    only = {"$schema": OPENCODE_SCHEMA}

    def add(text: str, path: Path) -> str:
        fresh = not json.loads(text)
        return js.set_member(text, ["$schema"], OPENCODE_SCHEMA, path) if fresh else text

    def remove(text: str, path: Path) -> str:
        return js.remove_member(text, ["$schema"], path) if json.loads(text) == only else text

    return add, remove


class CodexInstaller:
    """Codex reads ``config.toml``: one ``[mcp_servers.fleet]`` table, comments kept."""

    name = "codex"

    def _path(self, scope: Scope, home: Path, project: Path) -> Path:
        if scope == "project":
            return project / ".codex" / "config.toml"
        codex_home = os.environ.get("CODEX_HOME")
        return (Path(codex_home) if codex_home else home / ".codex") / "config.toml"

    def _load(self, place: Place, path: Path) -> tuple[str | None, tomlkit.TOMLDocument]:
        before = fs.read(place, path)
        try:
            return before, tomlkit.parse(before or "")
        except tomlkit.exceptions.ParseError as exc:
            raise UsageError(f"{path}: not valid TOML ({exc}); fix it first") from None

    def install(self, scope: Scope, *, home: Path, project: Path) -> list[str]:
        path = self._path(scope, home, project)
        place = place_of(scope, home, project)
        before, doc = self._load(place, path)
        command, *args = fleet_argv()
        want = {
            "command": command,
            "args": args,
            # codex exec refuses every MCP call under its default policy unless approved here.
            "default_tools_approval_mode": "approve",
            "tool_timeout_sec": CODEX_TIMEOUT,
            # Started before the first turn (else codex exec's first calls find no tools).
            "required": True,
            # Codex gives a server a bare environment: the session's fleet variables pass.
            "env_vars": list(FLEET_VARIABLES),
        }
        servers = doc.get("mcp_servers")
        if servers is not None and servers.get(SERVER) is not None:
            if dict(servers[SERVER]) == want:
                return [f"{path} already up to date"]
            del servers[SERVER]
        if servers is None:
            servers = tomlkit.table(is_super_table=True)
            doc["mcp_servers"] = servers
        table = tomlkit.table()
        for key, value in want.items():
            table[key] = value
        servers[SERVER] = table
        lines: list[str] = []
        _write(place, path, before, tomlkit.dumps(doc), lines)
        return lines

    def uninstall(self, scope: Scope, *, home: Path, project: Path) -> list[str]:
        path = self._path(scope, home, project)
        place = place_of(scope, home, project)
        before, doc = self._load(place, path)
        servers = doc.get("mcp_servers")
        if before is None or servers is None or SERVER not in servers:
            return [f"{path} not installed"]
        del servers[SERVER]
        if not servers:
            del doc["mcp_servers"]
        after = tomlkit.dumps(doc)
        headers = [line for line in before.splitlines() if line.lstrip().startswith("[")]
        if headers and headers[-1].strip() == f"[mcp_servers.{SERVER}]" and after.strip():
            after = after.rstrip("\n") + "\n"  # the blank line install put before our table
        lines: list[str] = []
        _write(place, path, before, after, lines)
        return lines


INSTALLERS: Final[dict[str, Installer]] = {
    "claude": JsonInstaller("claude", _claude),
    "codex": CodexInstaller(),
    "gemini": JsonInstaller("gemini", _gemini),
    "opencode": JsonInstaller("opencode", _opencode),
    "pi": PiInstaller(),
}
