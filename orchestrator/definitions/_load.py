"""Agent definitions: Markdown files with YAML front matter, found in scoped directories.

A definition names an agent's tools, mode, backend and limits; the Markdown body is its system
prompt. ``load_agents`` reads the directories of a scope in order, later same-name definitions
overriding earlier ones (format and scopes: ``docs/agents.md``)::

    bundled (the ``agents`` package)  <  extra_dirs (Claude Code / Pi)  <  user  <  project

A malformed file fails the whole load with one ``AgentDefinitionError`` line — a typo in a
definition must not silently turn into a different agent. Scouts are checked here as well as at
launch: a scout may never hold a mutating tool, and no override may hand one to a scout.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

from orchestrator._errors import UsageError
from orchestrator.definitions._format import (
    MUTATING_TOOLS,
    AgentDefinition,
    AgentDefinitionError,
    parse_agent,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

# The definition and its parser live in _format; the package, _plan, _supervisor, the tests and
# child.tools' MUTATING_TOOLS note import them from here.
__all__ = [
    "MUTATING_TOOLS",
    "SCOPES",
    "AgentDefinition",
    "AgentDefinitionError",
    "expand_agent_dirs",
    "load_agents",
    "parse_agent",
]

SCOPES: Final = ("default", "project", "both")
#: ``--agent-dirs`` words for where Claude Code and Pi keep agents: the project's, the user's.
AGENT_DIR_WORDS: Final = {
    "claude": (Path(".claude/agents"), Path("~/.claude/agents")),
    "pi": (Path(".pi/agents"), Path("~/.pi/agent/agents")),
}


def expand_agent_dirs(entries: Sequence[str], *, workspace: Path) -> list[Path]:
    """The directories ``--agent-dirs`` names: ``claude`` and ``pi`` stand for their tools'
    project (under *workspace*) and user directories; anything else is a directory."""
    found: list[Path] = []
    for entry in entries:
        if entry in AGENT_DIR_WORDS:
            project, user = AGENT_DIR_WORDS[entry]
            found.extend([workspace / project, user.expanduser()])
        else:
            found.append(Path(entry).expanduser())
    return found


def load_agents(
    scope: str = "default",
    *,
    cwd: Path,
    user_dir: Path | None = None,
    extra_dirs: Sequence[Path] = (),
) -> dict[str, AgentDefinition]:
    """Every definition visible in ``scope``, by name; later directories override earlier ones.

    ``default`` = bundled + user; ``project`` = bundled + the nearest ``.fleet/agents`` at or
    above ``cwd``; ``both`` = bundled + user + project. The user directory is ``user_dir``, else
    ``$FLEET_AGENTS_DIR``, else ``$XDG_CONFIG_HOME/fleet/agents`` (``~/.config/fleet/agents``).
    ``extra_dirs`` hold Claude Code (a path containing ``.claude``) or Pi agent files, loaded
    after the bundled ones. Missing directories are skipped.
    """
    if scope not in SCOPES:
        raise UsageError(f"load agents: scope {scope!r} is not one of {', '.join(SCOPES)}")
    layers: list[tuple[str, list[Path]]] = [("bundled", _bundled_files())]
    for extra in extra_dirs:
        source = "claude" if ".claude" in extra.parts else "pi"
        layers.append((source, _markdown_files(extra)))
    if scope in {"default", "both"}:
        layers.append(("user", _markdown_files(user_dir or _default_user_dir())))
    if scope in {"project", "both"}:
        project = _project_dir(cwd)
        layers.append(("project", _markdown_files(project) if project else []))
    agents: dict[str, AgentDefinition] = {}
    for source, files in layers:
        seen: dict[str, Path] = {}
        for path in files:
            definition = parse_agent(path.read_text(encoding="utf-8"), path=path, source=source)
            if definition.name in seen:
                raise AgentDefinitionError(
                    path,
                    "name",
                    f"{definition.name!r} is also defined in {seen[definition.name]}",
                    "give one of them another name",
                )
            seen[definition.name] = path
            _check_override(agents.get(definition.name), definition)
            agents[definition.name] = definition
    return agents


def _check_override(previous: AgentDefinition | None, new: AgentDefinition) -> None:
    if previous is None or not previous.is_scout:
        return
    mutating = sorted(MUTATING_TOOLS & set(new.tools))
    if mutating:
        raise AgentDefinitionError(
            new.path,
            "tools",
            f"overrides the scout {new.name!r} from {previous.path} with mutating tools "
            f"({', '.join(mutating)})",
            "an override may not make a scout write; define the writer under another name",
        )


def _markdown_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(path for path in directory.glob("*.md") if path.is_file())


def _bundled_files() -> list[Path]:
    # A regular (non-zip) install: the package directory is a real path.
    root = Path(str(importlib.resources.files("agents")))
    return _markdown_files(root)


def _default_user_dir() -> Path:
    explicit = os.environ.get("FLEET_AGENTS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "fleet" / "agents"


def _project_dir(cwd: Path) -> Path | None:
    start = cwd.resolve()
    for directory in (start, *start.parents):
        candidate = directory / ".fleet" / "agents"
        if candidate.is_dir():
            return candidate
    return None
