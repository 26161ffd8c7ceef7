"""Package boundaries (DESIGN §1), checked in fresh interpreters, and whole classes (no mixins).

Each package is imported with every submodule found by ``pkgutil.walk_packages`` in a new
``python -c`` process, so modules added later are covered without editing this file; what the
process then holds of ours must respect the dependency direction. ``__main__`` modules are
entry points (importing one would run it), so their own imports are read with ``ast`` instead.
"""

import ast
import builtins
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = ("orchestrator", "child", "ipc", "sandbox")
ALLOWED = {
    "ipc": {"ipc"},
    "sandbox": {"sandbox"},
    "child": {"child", "ipc"},
    "orchestrator": {"orchestrator", "ipc", "sandbox"},
}
PROBE = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
walked = [package.__name__]
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    if info.name.rsplit(".", 1)[-1] != "__main__":
        importlib.import_module(info.name)
        walked.append(info.name)
ours = {"orchestrator", "child", "ipc", "sandbox"}
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ours)
print(json.dumps({"walked": walked, "loaded": loaded}))
"""


def probe(package: str) -> dict[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, package],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, list[str]] = json.loads(result.stdout.splitlines()[-1])
    return report


def tops(modules: list[str]) -> set[str]:
    return {module.split(".")[0] for module in modules}


@pytest.mark.parametrize("package", OURS)
def test_importing_a_package_loads_only_what_it_may_import(package):
    report = probe(package)
    assert report["walked"][0] == package
    assert set(report["walked"]) <= set(report["loaded"])  # the walk really imported them
    assert tops(report["loaded"]) <= ALLOWED[package], report["loaded"]


def test_importing_ipc_loads_nothing_else_of_ours():
    report = probe("ipc")
    assert tops(report["loaded"]) == {"ipc"}
    # The walk found the real modules, so the check above is not vacuous.
    assert {"ipc._channel", "ipc._framing", "ipc._loadout"} <= set(report["walked"])


def main_imports(package: str) -> set[str]:
    path = ROOT / package / "__main__.py"
    if not path.exists():
        return set()
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            names.add(package)  # a relative import stays inside the package
    return names & set(OURS)


@pytest.mark.parametrize("package", OURS)
def test_entry_points_respect_the_same_boundaries(package):
    assert main_imports(package) <= ALLOWED[package]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_fleet_verb_starts_without_the_supervisor():
    # Every verb but `serve` only talks to a running supervisor: the CLI must not import the
    # supervisor, its launchers or what they pull in (an LLM parent runs many verbs).
    result = _python(
        "import json, sys; import orchestrator.cli._main; "
        "print(json.dumps(sorted(m for m in sys.modules)))"
    )
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert "orchestrator.cli._main" in loaded
    heavy = {
        "orchestrator.core._supervisor",
        "orchestrator.core._run",
        "orchestrator.control._server",
    }
    heavy |= {"orchestrator.launch._launcher", "orchestrator.launch._tmux", "psutil", "libtmux"}
    heavy |= {"orchestrator.web._server", "hypercorn", "starlette", "jinja2"}  # fleet web's own
    assert loaded.isdisjoint(heavy), sorted(loaded & heavy)
    # Yet the API is still there, imported on first use.
    result = _python("import orchestrator; print(orchestrator.open_supervisor.__module__)")
    assert result.stdout.strip() == "orchestrator.core._supervisor", result.stderr


WARM_VERB = """
import json, os, socket, sys, tempfile, threading
from pathlib import Path
import orchestrator.cli._main
from orchestrator._config import load_config
from orchestrator.control._client import call
load_config(cwd=Path.cwd())
path = Path(tempfile.mkdtemp()) / "control.sock"
server = socket.socket(socket.AF_UNIX)
server.bind(str(path))
server.listen(1)
threading.Thread(target=lambda: server.accept()[0].close(), daemon=True).start()
try:
    call(path, "0" * 64, "peek", {"agents": []}, timeout=5)
except Exception as exc:
    print(type(exc).__name__, file=sys.stderr)
print(json.dumps(sorted(sys.modules)))
"""


def test_a_warm_verb_imports_only_what_one_request_needs():
    # An LLM parent calls `fleet peek --json` in a loop (DESIGN §13: <= 3x `python -c pass`):
    # the verb's whole path, config and one control request, stays off the event loop, the
    # ipc codec and the renderers' and launchers' libraries.
    result = subprocess.run(
        [sys.executable, "-c", WARM_VERB],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "FLEET_HOME"}
        | {"FLEET_HOME": "/nonexistent"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "Unreachable"  # the request was made, and failed cleanly
    modules = set(json.loads(result.stdout))
    loaded = {name.split(".")[0] for name in modules}
    heavy = {"trio", "ipc", "cattrs", "orjson", "rich", "psutil", "libtmux", "yaml"}
    heavy |= {"platformdirs", "httpx", "mcp", "cryptography", "sandbox", "child"}
    assert loaded.isdisjoint(heavy), sorted(loaded & heavy)
    ours = {"orchestrator._records", "orchestrator.core", "orchestrator.control._server"}
    assert modules.isdisjoint(ours), sorted(modules & ours)


# -- the rooms inside orchestrator/ and child/ (DESIGN §1) -----------------------------------------
#
# Every import statement counts, wherever it stands: a type-only or function-local import still
# reaches back. A module belongs to the room of its sub-package; the top-level private modules of
# orchestrator/ (errors, config, records, sync) are its foundation, which every room may use.

FOUNDATION = "orchestrator:foundation"
FACADE = "orchestrator"
ROOMS: dict[str, set[str]] = {
    FOUNDATION: {FOUNDATION},
    "orchestrator.governance": {FOUNDATION},
    "orchestrator.workspace": {FOUNDATION},
    "orchestrator.coordination": {FOUNDATION},
    "orchestrator.notify": {FOUNDATION},
    # Spend: budgets, ledger, quota, roles, fallback (the core passes its notes in).
    "orchestrator.spend": {FOUNDATION, "ipc", "orchestrator.notify"},
    "orchestrator.launch": {FOUNDATION, "ipc", "sandbox"},
    "orchestrator.remote": {FOUNDATION, "ipc"},
    # The journal is written for core through a protocol; control wires it in.
    "orchestrator.durability": {FOUNDATION, "ipc"},
    # Maps reach the supervisor through a protocol and keep their ledger in durability.
    "orchestrator.batch": {
        FOUNDATION,
        "orchestrator.durability",
        "orchestrator.governance",
        "orchestrator.workspace",
        "sandbox",
    },
    # Agent definitions: a definition's schema check and limits, nothing of a run.
    "orchestrator.definitions": {FOUNDATION, "orchestrator.governance", "orchestrator.spend"},
    "orchestrator.core": {
        FOUNDATION,
        "orchestrator.batch",
        "orchestrator.definitions",
        "orchestrator.remote",
        "orchestrator.governance",
        "orchestrator.spend",
        "orchestrator.workspace",
        "orchestrator.coordination",
        "orchestrator.launch",
        "orchestrator.notify",
        "ipc",
        "sandbox",
    },
    "orchestrator.control": {
        FOUNDATION,
        "orchestrator.batch",
        "orchestrator.core",
        "orchestrator.coordination",
        "orchestrator.durability",
        "orchestrator.launch",
        "orchestrator.workspace",
        "ipc",
        "sandbox",
    },
    # A verb is a client: it reaches the fleet through the control client or the public facade.
    # A parent (fleet mcp, fleet install) is a client too: the control client side, never core.
    "orchestrator.parents": {
        FOUNDATION,
        "orchestrator.control",
        "orchestrator.coordination",
        "ipc",
    },
    # The web view is a client too: the control client side, never core.
    "orchestrator.web": {FOUNDATION, "orchestrator.control"},
    "orchestrator.cli": {
        FOUNDATION,
        FACADE,
        "orchestrator.batch",
        "orchestrator.control",
        "orchestrator.parents",
        "orchestrator.web",
    },
    # The facade offers the embedded supervisor (core) and connect(), the client of a running
    # one (control), each imported on first use.
    FACADE: {FOUNDATION, "orchestrator.core", "orchestrator.control"},
    "orchestrator.__main__": {"orchestrator.cli"},
    "child.tools": {"ipc"},
    "child.backends": {"child.tools", "ipc"},
    # The builtin agent sits on the shared plumbing; only the runtime above imports it.
    "child.backends.builtin": {"child.backends", "child.tools", "ipc"},
    "child": {"child.backends", "child.backends.builtin", "child.tools", "ipc"},
    "ipc": set(),
    "sandbox": set(),
}
#: The only modules that may import the supervisor: the facade and the control server above it.
SUPERVISOR = "orchestrator.core._supervisor"
SUPERVISOR_IMPORTERS = {FACADE, "orchestrator.control._server", "orchestrator.control._daemon"}
SUPERVISOR_IMPORTERS |= {"orchestrator.control._review", "orchestrator.control._durable"}
# _stale is the part of _durable that reads what a previous supervisor left (split off for size).
SUPERVISOR_IMPORTERS |= {"orchestrator.control._stale"}
SUPERVISOR_IMPORTERS |= {"orchestrator.control._map", "orchestrator.control._land"}


def product_modules(root: Path = ROOT) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in OURS:
        for path in (root / package).rglob("*.py"):
            if "_demo_data" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _target(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_edges(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """Module -> {imported product module: line of the first import statement naming it}."""
    edges: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        found: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _target(name, path.name == "__init__.py", node)
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for named in targets:
                target = named
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.setdefault(target, getattr(node, "lineno", 0))
        edges[name] = found
    return edges


def room(module: str) -> str:
    """The room a module belongs to (its deepest listed sub-package)."""
    if module in {FACADE, "orchestrator.__main__"}:
        return module
    parts = module.split(".")
    if parts[0] == "orchestrator" and parts[1].startswith("_"):
        return FOUNDATION
    for depth in range(len(parts), 0, -1):
        prefix = ".".join(parts[:depth])
        if prefix in ROOMS and prefix != FACADE:
            return prefix
    return parts[0]


def layering_violations(modules: dict[str, Path]) -> list[str]:
    problems = []
    for name, targets in sorted(import_edges(modules).items()):
        mine = room(name)
        allowed = ROOMS[mine] | {mine}
        for target, line in sorted(targets.items()):
            theirs = room(target)
            where = f"{modules[name].relative_to(ROOT)}:{line}"
            if theirs not in allowed:
                problems.append(f"{where}: {name} ({mine}) imports {target} ({theirs})")
            elif target == SUPERVISOR and name not in SUPERVISOR_IMPORTERS:
                problems.append(f"{where}: {name} reaches back into the supervisor")
    return problems


def import_circles(modules: dict[str, Path]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    edges = {name: set(targets) for name, targets in import_edges(modules).items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return circles


def test_every_module_belongs_to_a_room_with_a_rule():
    modules = product_modules()
    assert len(modules) > 100  # the walk found the product, so the checks below are not vacuous
    assert {room(name) for name in modules} <= set(ROOMS), sorted(
        name for name in modules if room(name) not in ROOMS
    )


def test_rooms_import_only_what_their_rule_allows():
    problems = layering_violations(product_modules())
    assert not problems, "\n".join(problems)


def test_no_import_circle_anywhere_in_the_product():
    circles = import_circles(product_modules())
    assert not circles, "\n".join(" <-> ".join(circle) for circle in circles)


def test_every_sub_package_states_its_rule():
    for name, path in product_modules().items():
        if path.name == "__init__.py" and name.count(".") >= 1:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            assert "import" in doc.lower(), f"{path.relative_to(ROOT)}: say what it may import"


def test_the_layering_check_names_a_back_import(tmp_path):
    # A deliberately added back-import fails the check with the offending import named.
    shutil.copytree(ROOT / "orchestrator", tmp_path / "orchestrator")
    for package in ("child", "ipc", "sandbox"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    watchdog = tmp_path / "orchestrator" / "governance" / "_watchdog.py"
    watchdog.write_text(
        watchdog.read_text() + "\nfrom orchestrator.core._supervisor import Supervisor\n"
    )
    modules = product_modules(tmp_path)
    problems = [p.replace(str(tmp_path), "") for p in layering_violations_at(tmp_path, modules)]
    assert any(
        "orchestrator/governance/_watchdog.py:" in p
        and "imports orchestrator.core._supervisor (orchestrator.core)" in p
        for p in problems
    ), problems
    circles = import_circles(modules)
    assert any("orchestrator.governance._watchdog" in circle for circle in circles), circles


def layering_violations_at(root: Path, modules: dict[str, Path]) -> list[str]:
    global ROOT  # noqa: PLW0603 - the check names paths relative to the tree it reads
    saved, ROOT = ROOT, root
    try:
        return layering_violations(modules)
    finally:
        ROOT = saved


# -- whole classes: no mixins in orchestrator/ (issue 35) -----------------------------------------
#
# A class of ours may extend another class of ours only when that base is an exception, a Protocol
# or an Enum. Anything else is a mixin (``ChildRun(ParentCommands, Ending)`` was one: three files
# for one object, its parts declaring the host's attributes they borrow): one concept is one class
# in one module, or a composition of named parts. Bases are resolved through each module's imports
# (re-exports included), so a base of ours is found whatever name it is imported under.

#: Library bases that make a class of ours a legitimate base for another one.
KIND_BASES = {"Protocol", "Enum", "StrEnum", "IntEnum", "Flag", "IntFlag"}
KIND_BASES |= {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


def _base_name(node: ast.expr) -> str:
    """``Name``, ``Name[T]`` or ``module.Name`` -> the dotted name of the base."""
    if isinstance(node, ast.Subscript):
        node = node.value
    return ast.unparse(node)


Classes = dict[str, dict[str, ast.ClassDef]]
Imported = dict[str, dict[str, tuple[str, str]]]


def class_table(modules: dict[str, Path]) -> tuple[Classes, Imported]:
    """(module -> {class name: its ClassDef}, module -> {local name: (module, name) imported})."""
    classes: Classes = {}
    imported: Imported = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        classes[name] = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        names: dict[str, tuple[str, str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _target(name, path.name == "__init__.py", node)
                for alias in node.names:
                    names[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    names[alias.asname or alias.name.split(".")[0]] = (alias.name, "")
        imported[name] = names
    return classes, imported


def _resolve(
    module: str, dotted: str, classes: Classes, imported: Imported, depth: int = 0
) -> tuple[str, str] | None:
    """The (module, class) of ours that *dotted* names in *module*, or None for a library's."""
    if depth > 8 or module not in classes:
        return None
    head, _, rest = dotted.partition(".")
    if not rest and head in classes[module]:
        return module, head
    if head not in imported[module]:
        return None
    source, name = imported[module][head]
    if rest:  # module.Name: `import x.y as m` or `from x import y` (a module) then m.Name
        target = f"{source}.{name}" if name else source
        if target in classes:
            return _resolve(target, rest, classes, imported, depth + 1)
        return None
    if f"{source}.{name}" in classes:
        return None  # a module, not a class
    return _resolve(source, name, classes, imported, depth + 1)


def mixin_inheritance(modules: dict[str, Path]) -> list[str]:
    """Every class under orchestrator/ extending a class of ours that is not an exception, a
    Protocol or an Enum (a mixin), as ``path:line: Class extends module.Base``."""
    classes, imported = class_table(modules)

    def legitimate(
        module: str, node: ast.ClassDef, seen: frozenset[tuple[str, str]] = frozenset()
    ) -> bool:
        for base in node.bases:
            dotted = _base_name(base)
            found = _resolve(module, dotted, classes, imported)
            if found is None:
                if dotted.rpartition(".")[2] in KIND_BASES:
                    return True
            elif found not in seen and legitimate(
                found[0], classes[found[0]][found[1]], seen | {found}
            ):
                return True
        return False

    problems = []
    for module, table in sorted(classes.items()):
        if module.split(".")[0] != "orchestrator":
            continue
        for node in table.values():
            for base in node.bases:
                found = _resolve(module, _base_name(base), classes, imported)
                if found is not None and not legitimate(found[0], classes[found[0]][found[1]]):
                    where = f"{modules[module].relative_to(ROOT)}:{node.lineno}"
                    problems.append(f"{where}: {node.name} extends {found[0]}.{found[1]}")
    return problems


def test_no_class_in_orchestrator_is_mixed_in():
    modules = product_modules()
    classes, imported = class_table(modules)
    # The walk sees the classes and resolves our bases through imports (not vacuous).
    assert "ChildRun" in classes["orchestrator.core._run"]
    assert "Supervisor" in classes["orchestrator.core._supervisor"]
    resolve = functools.partial(_resolve, classes=classes, imported=imported)
    assert resolve("orchestrator.definitions._format", "UsageError") == (
        "orchestrator._errors",
        "UsageError",
    )
    assert resolve("orchestrator.core._host", "RunHost") == ("orchestrator.core._host", "RunHost")
    problems = mixin_inheritance(modules)
    assert not problems, "\n".join(problems)


def test_the_mixin_check_names_a_mixed_in_class(tmp_path):
    # The old shape, planted again: ChildRun(ParentCommands) with the commands in a module of
    # their own, and Supervisor(FleetViews) through a re-export. Both are named; the exception
    # and Protocol hierarchies (UsageError(FleetError), SpawnHost(RunHost)) are not.
    shutil.copytree(ROOT / "orchestrator", tmp_path / "orchestrator")
    for package in ("child", "ipc", "sandbox"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    core = tmp_path / "orchestrator" / "core"
    (core / "_commands.py").write_text(
        "class ParentCommands:\n    key: str\n\n    async def steer(self, text: str) -> None:\n"
        "        pass\n"
    )
    (core / "_views.py").write_text("class FleetViews:\n    def peek(self):\n        return {}\n")
    (core / "__init__.py").write_text(
        (core / "__init__.py").read_text() + "\nfrom orchestrator.core._views import FleetViews\n"
    )
    run = core / "_run.py"
    run.write_text(
        "from orchestrator.core._commands import ParentCommands\n"
        + run.read_text().replace("class ChildRun:", "class ChildRun(ParentCommands):", 1)
    )
    sup = core / "_supervisor.py"
    sup.write_text(
        "from orchestrator import core as views\n"
        + sup.read_text().replace("class Supervisor:", "class Supervisor(views.FleetViews):", 1)
    )
    problems = mixin_inheritance_at(tmp_path, product_modules(tmp_path))
    assert any(
        p.startswith("orchestrator/core/_run.py:")
        and p.endswith("ChildRun extends orchestrator.core._commands.ParentCommands")
        for p in problems
    ), problems
    assert any(
        p.endswith("Supervisor extends orchestrator.core._views.FleetViews") for p in problems
    ), problems
    assert len(problems) == 2, problems


def mixin_inheritance_at(root: Path, modules: dict[str, Path]) -> list[str]:
    global ROOT  # noqa: PLW0603 - the check names paths relative to the tree it reads
    saved, ROOT = ROOT, root
    try:
        return mixin_inheritance(modules)
    finally:
        ROOT = saved
