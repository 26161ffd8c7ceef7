"""One agent definition file: YAML front matter naming the agent, then its system prompt.

:func:`parse_agent` turns a file's text into an :class:`AgentDefinition`, validating field by
field; any fault is one :class:`AgentDefinitionError` line naming the field and the fix. A file
from Claude Code or Pi (``source`` ``claude``/``pi``) is read leniently: unknown keys and tools
are dropped with a warning kept on the definition, and Claude Code's tool names are mapped to
ours. A scout may never hold a mutating tool or spawn subagents.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import attrs
import yaml

from orchestrator._errors import UsageError
from orchestrator._schemafile import read_schema_file
from orchestrator.governance._checked import check_schema
from orchestrator.spend._limits import Limit, parse_limit

#: Tools that can change the repository. ``child.tools.MUTATING_TOOLS`` is the same set; the
#: orchestrator may not import ``child``, so a test holds the two equal.
MUTATING_TOOLS: Final = frozenset({"edit", "write", "bash"})
#: What an agent gets when its definition lists no tools: fail closed, read-only.
DEFAULT_TOOLS: Final = ("read", "grep", "find", "ls", "todo")
#: Every tool a definition may name: the builtin agent's own plus the IPC-backed ones.
KNOWN_TOOLS: Final = MUTATING_TOOLS | {*DEFAULT_TOOLS, "ask_parent", "subagent", "discuss"}
MODES: Final = ("scout", "fork", "worktree")
BACKENDS: Final = ("builtin", "pi", "claude", "codex", "command")
SANDBOXES: Final = ("read_only", "review", "worker")
EFFORTS: Final = ("off", "minimal", "low", "medium", "high", "xhigh")
#: Claude Code's tool names and ours; a restricted form such as ``Bash(git:*)`` is not mapped.
CLAUDE_TOOLS: Final = {
    "Read": "read",
    "Grep": "grep",
    "Glob": "find",
    "LS": "ls",
    "Edit": "edit",
    "MultiEdit": "edit",
    "Write": "write",
    "Bash": "bash",
    "TodoWrite": "todo",
}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENDPOINT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):[0-9]{1,5}$")
_FRONT_MATTER = re.compile(
    r"\A\ufeff?---[ \t]*\r?\n(.*?)^(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.DOTALL | re.MULTILINE
)


class AgentDefinitionError(UsageError):
    """A definition file that cannot be loaded; the message is one line with the fix."""

    def __init__(self, path: Path, field: str, cause: str, fix: str) -> None:
        self.path = path
        self.field = field
        self.cause = cause
        super().__init__(f"agent definition {path}: {field}: {cause} ({fix})")


@attrs.frozen(kw_only=True)
class AgentDefinition:
    name: str
    description: str
    tools: tuple[str, ...]
    model: str | None = None
    #: A model role (``model: "@role"`` says the same); see :mod:`orchestrator.spend._modelroles`.
    role: str | None = None
    backend: str = "builtin"
    mode: str
    subagent_agents: tuple[str, ...] = ()
    effort: str | None = None
    ownership: tuple[str, ...] = ()
    sandbox: str | None = None
    env: tuple[str, ...] = ()
    #: ``host:port`` pairs its children may reach through the egress proxy, beyond the model.
    egress: tuple[str, ...] = ()
    #: A usage budget (``soft_tokens``, ``hard_tokens``, ``soft_usd``, ``hard_usd``): it may
    #: only lower the configured one (docs/governance.md, Budgets).
    budget: Limit | None = None
    #: The JSON Schema its children's results must satisfy (inline, or a file beside it).
    schema: dict[str, Any] | None = attrs.field(default=None, eq=False)
    prompt: str
    source: str
    path: Path
    #: What loading changed from the file (dropped Claude/Pi tools, ignored keys), for ``agents``.
    warnings: tuple[str, ...] = ()

    @property
    def is_scout(self) -> bool:
        return self.mode == "scout" or self.name == "scout"


#: The front-matter keys of a fleet definition; anything else is a typo worth an error.
FIELDS: Final = frozenset(attrs.fields_dict(AgentDefinition)) - {
    "prompt",
    "source",
    "path",
    "warnings",
}


def parse_agent(text: str, *, path: Path, source: str) -> AgentDefinition:
    """One definition from a file's text; ``source`` picks the dialect (``claude``/``pi``)."""
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise AgentDefinitionError(
            path,
            "front matter",
            "the file does not start with a '---' YAML block",
            "put name, description and tools between two '---' lines at the top",
        )
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as error:
        raise AgentDefinitionError(
            path,
            "front matter",
            f"invalid YAML: {_one_line(error)}",
            "fix the YAML between the '---' lines",
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AgentDefinitionError(
            path,
            "front matter",
            f"is a YAML {type(data).__name__}, not a mapping",
            "write 'key: value' lines",
        )
    return _Reader(path=path, source=source, data=data).build(prompt=text[match.end() :].strip())


@attrs.define(eq=False)
class _Reader:
    """Validates one front-matter mapping, field by field, into an ``AgentDefinition``."""

    path: Path
    source: str
    data: dict[Any, Any]
    warnings: list[str] = attrs.Factory(list)

    @property
    def foreign(self) -> bool:
        return self.source in {"claude", "pi"}

    def fail(self, field: str, cause: str, fix: str) -> AgentDefinitionError:
        return AgentDefinitionError(self.path, field, cause, fix)

    def build(self, *, prompt: str) -> AgentDefinition:
        for key in self.data:
            if key in FIELDS:
                continue
            if not self.foreign:
                raise self.fail(
                    str(key),
                    "unknown front-matter key",
                    f"remove it; known keys are {', '.join(sorted(FIELDS))}",
                )
            self.warnings.append(f"ignored front-matter key {key!r}")
        name = self.text("name") or self.path.stem
        if not _NAME.match(name):
            raise self.fail(
                "name",
                f"{name!r} is not a valid agent name",
                "use 1-64 letters, digits, '-' or '_', starting with a letter or digit",
            )
        description = self.text("description")
        if not description:
            raise self.fail("description", "is missing", "say in one line what the agent does")
        tools = self.tools()
        mode = self.choice("mode", MODES) or (
            "worktree" if MUTATING_TOOLS & set(tools) else "scout"
        )
        if not prompt:
            raise self.fail(
                "prompt",
                "the body after the front matter is empty",
                "write the system prompt below the closing '---'",
            )
        model = self.text("model")
        definition = AgentDefinition(
            name=name,
            description=description,
            tools=tools,
            # Claude Code's "inherit" is our default: no model of its own.
            model=None if model == "inherit" else model,
            role=self.role(model),
            backend=self.choice("backend", BACKENDS) or "builtin",
            mode=mode,
            subagent_agents=self.names("subagent_agents", _NAME, "agent name"),
            effort=self.choice("effort", EFFORTS),
            ownership=self.ownership(),
            sandbox=self.choice("sandbox", SANDBOXES),
            env=self.names("env", _ENV_NAME, "environment variable name"),
            egress=self.names("egress", _ENDPOINT, "host:port endpoint"),
            budget=self.budget(),
            schema=self.schema(),
            prompt=prompt,
            source=self.source,
            path=self.path,
            warnings=tuple(self.warnings),
        )
        self.check_roles(definition)
        return definition

    def role(self, model: str | None) -> str | None:
        role = self.text("role")
        if role is None:
            return None
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,39}", role):
            raise self.fail("role", f"{role!r} is not a role name", "write 'role: worker'")
        if model and model != "inherit":
            raise self.fail("role", "is given with model", "keep one: role or model")
        return role

    def budget(self) -> Limit | None:
        if self.data.get("budget") is None:
            return None
        try:
            return parse_limit(self.data["budget"], "budget")
        except UsageError as exc:
            raise self.fail(
                "budget",
                str(exc).removeprefix("budget").lstrip(": "),
                "see docs/governance.md, Budgets",
            ) from None

    def schema(self) -> dict[str, Any] | None:
        """``schema:`` as a mapping, or a JSON file's path relative to the definition."""
        value = self.data.get("schema")
        if value is None:
            return None
        try:
            if isinstance(value, str):
                path = Path(value).expanduser()
                value = read_schema_file(path if path.is_absolute() else self.path.parent / path)
            return check_schema(value, source="the JSON Schema")
        except UsageError as exc:
            raise self.fail(
                "schema", str(exc), "write a JSON Schema mapping or the path of a JSON file"
            ) from None

    def text(self, field: str) -> str | None:
        value = self.data.get(field)
        if value is None:
            return None
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise self.fail(
                field,
                f"must be a string, not {type(value).__name__}",
                f"write '{field}: some text'",
            )
        return str(value).strip() or None

    def choice(self, field: str, allowed: tuple[str, ...]) -> str | None:
        value = self.text(field)
        if value is not None and value not in allowed:
            raise self.fail(
                field,
                f"{value!r} is not one of {', '.join(allowed)}",
                f"use one of {', '.join(allowed)}",
            )
        return value

    def listed(self, field: str) -> list[str] | None:
        """A list field: a YAML list, or a string split on commas (on spaces when it has none).

        Commas win so Claude Code's ``Bash(git diff:*)`` stays one item.
        """
        value = self.data.get(field)
        if value is None:
            return None
        if isinstance(value, str):
            items = value.split("," if "," in value else None)
            return [item.strip() for item in items if item.strip()]
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return [item.strip() for item in value if item.strip()]
        raise self.fail(
            field,
            f"must be a list of strings, not {value!r}",
            f"write '{field}: [a, b]' or '{field}: a, b'",
        )

    def names(self, field: str, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
        items = self.listed(field) or []
        for item in items:
            if not pattern.match(item):
                raise self.fail(field, f"{item!r} is not a valid {what}", f"fix or remove {item!r}")
        return tuple(dict.fromkeys(items))

    def tools(self) -> tuple[str, ...]:
        listed = self.listed("tools")
        if listed is None:
            if self.foreign:
                self.warnings.append("no tools listed; given the read-only default")
            return DEFAULT_TOOLS
        tools: list[str] = []
        for item in listed:
            mapped = CLAUDE_TOOLS.get(item) if self.source == "claude" else item
            if mapped in KNOWN_TOOLS:
                tools.append(mapped)
            elif self.foreign and "(" in item:
                # Claude Code's restricted forms (Bash(git diff:*)): never widened to the tool.
                self.warnings.append(
                    f"dropped tool {item!r}: fleet cannot enforce a restricted form, "
                    f"so {item.partition('(')[0].strip()!r} is not given"
                )
            elif self.foreign:
                self.warnings.append(f"dropped tool {item!r}: fleet has no equivalent")
            else:
                raise self.fail(
                    "tools",
                    f"unknown tool {item!r}",
                    f"use some of {', '.join(sorted(KNOWN_TOOLS))}",
                )
        return tuple(dict.fromkeys(tools))

    def ownership(self) -> tuple[str, ...]:
        value = self.data.get("ownership")
        # Not split on commas: a glob such as "src/{a,b}/**" contains them.
        items = [value] if isinstance(value, str) else value
        if items is None:
            return ()
        if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
            raise self.fail(
                "ownership",
                f"must be a list of paths or globs, not {value!r}",
                "write 'ownership: [src/pkg/**, docs/x.md]'",
            )
        return tuple(dict.fromkeys(items))

    def check_roles(self, definition: AgentDefinition) -> None:
        mutating = sorted(MUTATING_TOOLS & set(definition.tools))
        if definition.is_scout and mutating:
            raise self.fail(
                "tools",
                f"scout {definition.name!r} holds mutating tools ({', '.join(mutating)})",
                "scouts are read-only: remove them, or define a writer with mode: worktree "
                "under another name",
            )
        if definition.is_scout and ("subagent" in definition.tools or definition.subagent_agents):
            raise self.fail(
                "subagent_agents",
                "a scout may not spawn subagents",
                "scouts are leaves: remove subagent and subagent_agents",
            )
        if definition.ownership and not mutating:
            raise self.fail(
                "ownership",
                "only writing agents take ownership locks",
                "remove ownership, or give the agent edit/write",
            )


def _one_line(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())
