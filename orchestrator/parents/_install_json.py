"""Editing a parent's JSON configuration so that removing an entry restores the bytes.

``fleet install`` adds one member (or one array item) as text, in the file's own indentation,
right after the last existing one; ``fleet uninstall`` removes exactly that span. Containers
the install had to create (the file, ``mcpServers``, ``permissions.allow``) go again when they
are left empty. Nothing else in the file is rewritten.
"""

import json
from pathlib import Path
from typing import Any

import attrs

from orchestrator._errors import UsageError


@attrs.define
class Node:
    kind: str  # "object", "array" or "value"
    start: int
    end: int  # one past the closing character
    members: list[tuple[str, int, "Node"]] = attrs.field(factory=list)  # (key, key start, value)
    items: list["Node"] = attrs.field(factory=list)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text

    def skip(self, i: int) -> int:
        while i < len(self.text) and self.text[i] in " \t\r\n":
            i += 1
        return i

    def string_end(self, i: int) -> int:
        i += 1
        while self.text[i] != '"':
            i += 2 if self.text[i] == "\\" else 1
        return i + 1

    def value(self, i: int) -> Node:
        i = self.skip(i)
        char = self.text[i]
        if char == "{":
            node = Node("object", i, i)
            i = self.skip(i + 1)
            while self.text[i] != "}":
                key_end = self.string_end(i)
                key = json.loads(self.text[i:key_end])
                colon = self.skip(key_end)
                child = self.value(colon + 1)
                node.members.append((key, i, child))
                i = self.skip(child.end)
                if self.text[i] == ",":
                    i = self.skip(i + 1)
            node.end = i + 1
            return node
        if char == "[":
            node = Node("array", i, i)
            i = self.skip(i + 1)
            while self.text[i] != "]":
                child = self.value(i)
                node.items.append(child)
                i = self.skip(child.end)
                if self.text[i] == ",":
                    i = self.skip(i + 1)
            node.end = i + 1
            return node
        if char == '"':
            return Node("value", i, self.string_end(i))
        end = i
        while end < len(self.text) and self.text[end] not in ",}] \t\r\n":
            end += 1
        return Node("value", i, end)


def parse(text: str, path: Path) -> Node:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc}); fix it or remove it first") from None
    node = _Parser(text).value(0)
    if node.kind != "object":
        raise UsageError(f"{path}: expected a JSON object at the top")
    return node


def _indent_of(text: str, pos: int) -> str:
    """The leading whitespace of the line *pos* is on."""
    line_start = text.rfind("\n", 0, pos) + 1
    line = text[line_start:pos]
    return line[: len(line) - len(line.lstrip(" \t"))]


def _starts_line(text: str, pos: int) -> bool:
    return not text[text.rfind("\n", 0, pos) + 1 : pos].strip()


def _render(value: Any, indent: str, step: str) -> str:
    dumped = json.dumps(value, indent=len(step) or None)
    return dumped.replace("\n", "\n" + indent)


def _step(text: str) -> str:
    """The file's indentation unit (two spaces when it has none yet)."""
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" \t")
        if stripped and len(stripped) < len(line):
            return line[: len(line) - len(stripped)]
    return "  "


def _insert(text: str, container: Node, key: str | None, value: Any, step: str) -> str:
    """*text* with ``"key": value`` (or the array item *value*) added to *container*."""
    entries = [m[1] for m in container.members] if container.kind == "object" else []
    ends = [m[2].end for m in container.members] if container.kind == "object" else []
    if container.kind == "array":
        entries = [n.start for n in container.items]
        ends = [n.end for n in container.items]
    outer = _indent_of(text, container.start)
    if entries:
        indent = _indent_of(text, entries[-1])
        separator = ",\n" + indent if _starts_line(text, entries[-1]) else ", "
        at = ends[-1]
    else:
        indent = outer + step
        separator = "\n" + indent
        at = container.start + 1
        # An empty container "{}" or "[ ]": our entry, then its closing line.
        inner_end = container.end - 1
        body = (f"{json.dumps(key)}: " if key is not None else "") + _render(value, indent, step)
        return text[:at] + separator + body + "\n" + outer + text[inner_end:]
    body = (f"{json.dumps(key)}: " if key is not None else "") + _render(value, indent, step)
    return text[:at] + separator + body + text[at:]


def _remove(text: str, container: Node, index: int) -> str:
    """*text* without entry *index* of *container* (and the separator install wrote)."""
    if container.kind == "object":
        spans = [(m[1], m[2].end) for m in container.members]
    else:
        spans = [(n.start, n.end) for n in container.items]
    start, end = spans[index]
    if len(spans) == 1:
        empty = "{}" if container.kind == "object" else "[]"
        return text[: container.start] + empty + text[container.end :]
    if index > 0:
        return text[: spans[index - 1][1]] + text[end:]
    return text[:start] + text[spans[1][0] :]


def _chain(root: Node, keys: list[str]) -> list[Node]:
    """The objects along *keys* that exist, root first."""
    chain = [root]
    for key in keys:
        found = [m[2] for m in chain[-1].members if m[0] == key]
        if not found or found[0].kind != "object":
            break
        chain.append(found[0])
    return chain


def _member(node: Node, key: str) -> tuple[int, Node] | None:
    for index, (name, _, value) in enumerate(node.members):
        if name == key:
            return index, value
    return None


def set_member(text: str, keys: list[str], value: Any, path: Path) -> str:
    """*text* with the member at *keys* set to *value* (created with its parents if missing)."""
    root = parse(text, path)
    chain = _chain(root, keys[:-1])
    if len(chain) < len(keys):
        missing = keys[len(chain) - 1 :]
        nested: Any = value
        for key in reversed(missing[1:]):
            nested = {key: nested}
        return _insert(text, chain[-1], missing[0], nested, _step(text))
    found = _member(chain[-1], keys[-1])
    if found is None:
        return _insert(text, chain[-1], keys[-1], value, _step(text))
    _, node = found
    if json.loads(text[node.start : node.end]) == value:
        return text
    indent = _indent_of(text, chain[-1].members[found[0]][1])
    return text[: node.start] + _render(value, indent, _step(text)) + text[node.end :]


def remove_member(text: str, keys: list[str], path: Path) -> str:
    """*text* without the member at *keys*; parents left empty go too (never the root)."""
    while keys:
        root = parse(text, path)
        chain = _chain(root, keys[:-1])
        if len(chain) < len(keys):
            return text
        found = _member(chain[-1], keys[-1])
        if found is None:
            return text
        text = _remove(text, chain[-1], found[0])
        if len(chain[-1].members) > 1 or len(keys) == 1:
            return text
        keys = keys[:-1]
    return text


def add_item(text: str, keys: list[str], item: Any, path: Path) -> str:
    """*text* with *item* in the array at *keys* (created if missing)."""
    root = parse(text, path)
    chain = _chain(root, keys[:-1])
    found = _member(chain[-1], keys[-1]) if len(chain) == len(keys) else None
    if found is None:
        return set_member(text, keys, [item], path)
    array = found[1]
    if array.kind != "array":
        raise UsageError(f"{path}: {'.'.join(keys)} is not a list")
    if item in json.loads(text[array.start : array.end]):
        return text
    return _insert(text, array, None, item, _step(text))


def remove_item(text: str, keys: list[str], item: Any, path: Path) -> str:
    """*text* without *item* in the array at *keys*; an array left empty goes too."""
    root = parse(text, path)
    chain = _chain(root, keys[:-1])
    found = _member(chain[-1], keys[-1]) if len(chain) == len(keys) else None
    if found is None or found[1].kind != "array":
        return text
    array = found[1]
    values = [json.loads(text[n.start : n.end]) for n in array.items]
    if item not in values:
        return text
    if len(values) == 1:
        return remove_member(text, keys, path)
    return _remove(text, array, values.index(item))


def has(text: str, keys: list[str], path: Path) -> bool:
    chain = _chain(parse(text, path), keys[:-1])
    return len(chain) == len(keys) and _member(chain[-1], keys[-1]) is not None
