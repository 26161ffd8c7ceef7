"""The todo checklist an agent keeps while it works, and the ``todo`` tool over it.

A checklist is a small tree of tasks. Only leaves carry a status of their own; a parent's status
is derived from its subtasks every time it is read (done when all are done, in progress when any
is in progress or some are done, else pending), so it can never disagree with them. At most one
leaf is ``in_progress``: starting another parks the previous one as ``pending``. ``progress()``
is what the supervisor's ``peek`` shows: done/total leaves, the current task and the next three.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from ._base import (
    BaseTool,
    Progress,
    ToolContext,
    ToolError,
    ToolResult,
    optional_str,
    require_str,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

PENDING, IN_PROGRESS, DONE = "pending", "in_progress", "done"
STATUSES = (PENDING, IN_PROGRESS, DONE)
MAX_TASKS = 100
MAX_DEPTH = 3
MAX_TEXT = 300
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
_MARK = {PENDING: "[ ]", IN_PROGRESS: "[>]", DONE: "[x]"}


class TodoError(ToolError):
    """A checklist operation the model got wrong; the message says how to fix the call."""


@attrs.frozen(kw_only=True)
class Task:
    """A read-only snapshot of one task; a parent's ``status`` is the derived one."""

    id: str
    text: str
    status: str
    children: tuple[Task, ...] = ()


@attrs.define(eq=False)
class _Node:
    id: str
    text: str
    status: str  # a leaf's own status; ignored (derived) while the node has children
    children: list[_Node] = attrs.Factory(list)

    def derived(self) -> str:
        if not self.children:
            return self.status
        statuses = [child.derived() for child in self.children]
        if all(status == DONE for status in statuses):
            return DONE
        if any(status != PENDING for status in statuses):
            return IN_PROGRESS
        return PENDING

    def walk(self) -> Iterator[_Node]:
        yield self
        for child in self.children:
            yield from child.walk()

    def snapshot(self) -> Task:
        children = tuple(child.snapshot() for child in self.children)
        return Task(id=self.id, text=self.text, status=self.derived(), children=children)


@attrs.define(eq=False)
class Checklist:
    """The whole plan; every mutating method either applies fully or raises ``TodoError``."""

    _roots: list[_Node] = attrs.Factory(list)

    def tasks(self) -> tuple[Task, ...]:
        return tuple(root.snapshot() for root in self._roots)

    def progress(self) -> Progress:
        leaves = self._leaves()
        current = next((leaf.text for leaf in leaves if leaf.status == IN_PROGRESS), None)
        upcoming = tuple(leaf.text for leaf in leaves if leaf.status == PENDING)[:3]
        done = sum(leaf.status == DONE for leaf in leaves)
        return Progress(done=done, total=len(leaves), current=current, next=upcoming)

    def write(self, items: Sequence[Any]) -> None:
        """Replace the whole plan with ``items`` (``{id?, text, status?, children?}`` each).

        An empty list clears the plan.
        """
        self._roots = _Parser(taken=set()).parse_roots(items, first=1)

    def append(self, items: Sequence[Any]) -> None:
        """Add new top-level work; on an empty or finished checklist this is ``write``."""
        if not items:
            raise TodoError("todo append: items is empty; pass the new tasks")
        if all(leaf.status == DONE for leaf in self._leaves()):
            self.write(items)
            return
        existing = sum(1 for _ in self._nodes())
        parser = _Parser(taken={node.id for node in self._nodes()})
        added = parser.parse_roots(items, first=len(self._roots) + 1)
        count = sum(1 for root in added for _ in root.walk())
        if existing + count > MAX_TASKS:
            raise TodoError(
                f"todo append: {existing + count} tasks is too many; keep the plan under "
                f"{MAX_TASKS} (remove finished tasks or write a fresh plan)"
            )
        if any(node.status == IN_PROGRESS for root in added for node in root.walk()):
            self._park()
        self._roots.extend(added)

    def update(self, task_id: str, *, text: str | None = None, status: str | None = None) -> Task:
        """Change a task's text and/or (leaf) status; omitted fields and subtasks are kept."""
        node = self._find(task_id)
        if text is None and status is None:
            raise TodoError(f"todo update: nothing to change for {task_id}; pass text or status")
        if status is not None:
            if status not in STATUSES:
                raise TodoError(f"todo update: unknown status {status!r}; use one of {STATUSES}")
            if node.children:
                raise TodoError(
                    f"todo update: the status of {task_id} is derived from its subtasks; "
                    "update a subtask instead"
                )
        if text is not None:
            node.text = _check_text(text, op="update")
        if status == IN_PROGRESS:
            self._park()
        if status is not None:
            node.status = status
        return node.snapshot()

    def start(self, task_id: str) -> Task:
        """Make a leaf the one in progress (a parent starts its first unfinished leaf)."""
        node = self._find(task_id)
        leaf = next((n for n in node.walk() if not n.children and n.status != DONE), None)
        if leaf is None:
            leaf = node if not node.children else None
        if leaf is None:
            raise TodoError(f"todo start: every subtask of {task_id} is done; start another task")
        self._park()
        leaf.status = IN_PROGRESS
        return leaf.snapshot()

    def done(self, task_id: str) -> Task:
        """Mark a leaf done (a parent: all its leaves)."""
        node = self._find(task_id)
        for leaf in node.walk():
            if not leaf.children:
                leaf.status = DONE
        return node.snapshot()

    def remove(self, task_id: str) -> Task:
        """Delete a task and its subtasks."""
        node = self._find(task_id)
        for siblings, parent in self._containers():
            if node in siblings:
                siblings.remove(node)
                if parent is not None and not parent.children:
                    # The parent becomes a leaf again and needs a status of its own.
                    parent.status = DONE if node.derived() == DONE else PENDING
                return node.snapshot()
        raise AssertionError(task_id)  # pragma: no cover - _find found it in the tree

    def render(self) -> str:
        progress = self.progress()
        if not self._roots:
            return "Todo: empty."
        lines = [f"Todo ({progress.done}/{progress.total} done):"]
        lines.extend(_render(task, depth=0) for task in self.tasks())
        return "\n".join(lines)

    def _nodes(self) -> Iterator[_Node]:
        for root in self._roots:
            yield from root.walk()

    def _leaves(self) -> list[_Node]:
        return [node for node in self._nodes() if not node.children]

    def _containers(self) -> Iterator[tuple[list[_Node], _Node | None]]:
        yield self._roots, None
        for node in self._nodes():
            yield node.children, node

    def _find(self, task_id: str) -> _Node:
        for node in self._nodes():
            if node.id == task_id:
                return node
        known = ", ".join(node.id for node in self._nodes()) or "none; write a plan first"
        raise TodoError(f"todo: no task with id {task_id!r} (ids: {known})")

    def _park(self) -> None:
        for leaf in self._leaves():
            if leaf.status == IN_PROGRESS:
                leaf.status = PENDING


def _mark(task: Task) -> str:
    # "[~]" tells a partly done parent from the one leaf being worked on ("[>]").
    return "[~]" if task.children and task.status == IN_PROGRESS else _MARK[task.status]


def _render(task: Task, *, depth: int) -> str:
    line = f"{'  ' * depth}{_mark(task)} {task.id} {task.text}"
    return "\n".join([line, *(_render(child, depth=depth + 1) for child in task.children)])


def _check_text(text: Any, *, op: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise TodoError(f"todo {op}: every task needs a non-empty text (got {text!r})")
    if len(text) > MAX_TEXT:
        raise TodoError(f"todo {op}: a task text is {len(text)} chars; keep it under {MAX_TEXT}")
    return text.strip()


@attrs.define(eq=False)
class _Parser:
    """Validates decoded JSON items into nodes, giving id-less items the next free ``1.2`` id."""

    taken: set[str]
    # Every explicit id in the submitted items, so an automatic id never steals one.
    reserved: set[str] = attrs.Factory(set)

    def parse_roots(self, items: Any, *, first: int) -> list[_Node]:
        if not isinstance(items, list):
            raise TodoError("todo: items must be a list of {text, id?, status?, children?}")
        self.reserved = set(_explicit_ids(items))
        roots = self._parse(items, parent=None, first=first, depth=1)
        count = sum(1 for root in roots for _ in root.walk())
        if count > MAX_TASKS:
            raise TodoError(f"todo: {count} tasks is too many; keep the plan under {MAX_TASKS}")
        current = [n.id for r in roots for n in r.walk() if n.status == IN_PROGRESS]
        if len(current) > 1:
            raise TodoError(
                f"todo: {len(current)} tasks are in_progress ({', '.join(current)}); "
                "at most one task may be in progress"
            )
        return roots

    def _parse(self, items: Any, *, parent: str | None, first: int, depth: int) -> list[_Node]:
        if not isinstance(items, list):
            raise TodoError("todo: children must be a list of {text, id?, status?, children?}")
        if depth > MAX_DEPTH:
            raise TodoError(f"todo: tasks nest {depth} deep; keep the plan within {MAX_DEPTH}")
        nodes: list[_Node] = []
        number = first
        for item in items:
            if not isinstance(item, dict):
                raise TodoError(f"todo: each item must be an object with a text (got {item!r})")
            unknown = set(item) - {"id", "text", "status", "children"}
            if unknown:
                raise TodoError(
                    f"todo: unknown item field(s) {sorted(unknown)}; use id, text, status, children"
                )
            raw_id = item.get("id")
            if raw_id is None:
                while (task_id := _child_id(parent, number)) in self.taken | self.reserved:
                    number += 1
                number += 1
            else:
                task_id = _check_id(raw_id)
            if task_id in self.taken:
                raise TodoError(f"todo: task id {task_id!r} is used twice; ids must be unique")
            self.taken.add(task_id)
            status = item.get("status", PENDING)
            if status not in STATUSES:
                raise TodoError(f"todo: unknown status {status!r}; use one of {STATUSES}")
            node = _Node(id=task_id, text=_check_text(item.get("text"), op="write"), status=status)
            if item.get("children"):
                node.children = self._parse(
                    item["children"], parent=task_id, first=1, depth=depth + 1
                )
                # A parent's own status is derived; a stored one would only mislead.
                node.status = PENDING
            nodes.append(node)
        return nodes


def _explicit_ids(items: list[Any]) -> Iterator[str]:
    for item in items:
        if isinstance(item, dict):
            if isinstance(item.get("id"), str):
                yield item["id"]
            if isinstance(item.get("children"), list):
                yield from _explicit_ids(item["children"])


def _check_id(raw: Any) -> str:
    if not isinstance(raw, str) or not _ID.match(raw):
        raise TodoError(f"todo: bad task id {raw!r}; use up to 32 letters, digits, '.', '-', '_'")
    return raw


def _child_id(parent: str | None, number: int) -> str:
    return str(number) if parent is None else f"{parent}.{number}"


_ITEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "Stable id; omit to get '1', '1.2', ..."},
        "text": {"type": "string"},
        "status": {"type": "string", "enum": list(STATUSES)},
        "children": {"type": "array", "items": {"$ref": "#/$defs/item"}},
    },
    "required": ["text"],
    "additionalProperties": False,
}


class TodoTool(BaseTool):
    """The ``todo`` tool; ``checklist`` is this agent's plan, one per tool instance."""

    name = "todo"
    description = (
        "Keep your task checklist. op=write {items} sets the whole plan for a new request; "
        "append {items} adds genuinely new work to an unfinished plan; update {id, text?, "
        "status?}; start {id} marks the one task you are working on now (the previous one goes "
        "back to pending); done {id}; remove {id}. Items are {id?, text, status?, children?}; "
        "a parent's status follows its subtasks."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "op": {
                "type": "string",
                "enum": ["write", "append", "update", "start", "done", "remove"],
            },
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}},
            "id": {"type": "string", "description": "Task id for update/start/done/remove."},
            "text": {"type": "string", "description": "New text for update."},
            "status": {"type": "string", "enum": list(STATUSES)},
        },
        "required": ["op"],
        "additionalProperties": False,
        "$defs": {"item": _ITEM_SCHEMA},
    }

    def __init__(self, checklist: Checklist | None = None) -> None:
        self.checklist = checklist if checklist is not None else Checklist()

    async def execute(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult:
        op = require_str(args, "op", tool="todo")
        checklist = self.checklist
        if op in {"write", "append"}:
            items = args.get("items")
            if not isinstance(items, list):
                raise TodoError(f"todo {op}: items must be a list of {{text, id?, status?}}")
            if op == "write":
                checklist.write(items)
            else:
                checklist.append(items)
            text = checklist.render()
        elif op in {"update", "start", "done", "remove"}:
            task_id = require_str(args, "id", tool="todo")
            if op == "update":
                checklist.update(
                    task_id,
                    text=optional_str(args, "text", tool="todo"),
                    status=optional_str(args, "status", tool="todo"),
                )
                text = checklist.render()
            elif op == "remove":
                checklist.remove(task_id)
                text = checklist.render()
            else:
                # start/done answer with the one task they changed: the model already knows
                # the plan, and repeating it every step would flood its context.
                task = checklist.start(task_id) if op == "start" else checklist.done(task_id)
                progress = checklist.progress()
                done = f"{progress.done}/{progress.total} done"
                text = f"{_mark(task)} {task.id} {task.text} ({done})"
        else:
            raise TodoError(
                f"todo: unknown op {op!r}; use write, append, update, start, done or remove"
            )
        if ctx.on_progress is not None:
            ctx.on_progress(checklist.progress())
        return ToolResult(text=text)
