"""The import rules inside ``child`` (its sub-packages' ``__init__`` docstrings), read with ``ast``.

Every import statement counts, wherever it stands: inside a function or under
``TYPE_CHECKING`` it still reaches the module it names. ``tests/test_invariants.py`` checks the
rules between packages; this file checks the layers within ``child``.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("orchestrator", "child", "ipc", "sandbox")

#: Each layer, and the prefixes of what its modules may import (the runtime: all of child).
RULES = {
    "child.tools": ("ipc", "child.tools"),
    "child.backends.builtin": ("ipc", "child.tools", "child.backends"),
    "child.backends": ("ipc", "child.tools", "child.backends"),
    "child": ("ipc", "child"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> set[str]:
    """The modules of ours that the file at *path* imports, as absolute names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module or "")
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1]
            names.add(".".join([*base, *([node.module] if node.module else [])]))
    return {n for n in names if n.split(".")[0] in OURS}


def layer(name: str) -> str:
    """The most specific layer of :data:`RULES` that *name* belongs to."""
    return max((key for key in RULES if within(name, key)), key=len)


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def allowed(importer: str, target: str) -> bool:
    own = layer(importer)
    if own == "child.backends" and within(target, "child.backends.builtin"):
        return False  # only the runtime starts the builtin agent
    return any(within(target, prefix) for prefix in RULES[own])


MODULES = sorted((ROOT / "child").rglob("*.py"))


def test_the_walk_finds_every_layer():
    assert {layer(module_name(path)) for path in MODULES} == set(RULES)


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_a_child_module_imports_only_what_its_layer_may(path):
    name = module_name(path)
    refused = sorted(target for target in imported(path) if not allowed(name, target))
    assert refused == [], f"{name} ({layer(name)}) may not import {refused}"


@pytest.mark.parametrize(
    ("importer", "target"),
    [
        ("child.tools._base", "child.backends._base"),
        ("child.tools._todo", "child._runtime"),
        ("child.backends._pi", "child._runtime"),
        ("child.backends._mcp", "child.backends.builtin._loop"),
        ("child.backends.builtin._loop", "child._view"),
        ("child._runtime", "orchestrator"),
        ("child._forkserver", "sandbox"),
    ],
)
def test_the_rules_refuse_an_import_up_or_out(importer, target):
    assert not allowed(importer, target)


def test_relative_imports_are_resolved_against_the_package():
    registry = ROOT / "child" / "tools" / "_registry.py"
    assert {"child.tools._bash", "child.tools._todo", "child.tools._base"} <= imported(registry)
