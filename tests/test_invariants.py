"""Package boundaries (DESIGN §1), checked in fresh interpreters.

Each package is imported with every submodule found by ``pkgutil.walk_packages`` in a new
``python -c`` process, so modules added later are covered without editing this file; what the
process then holds of ours must respect the dependency direction. ``__main__`` modules are
entry points (importing one would run it), so their own imports are read with ``ast`` instead.
"""

import ast
import json
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
    assert loaded.isdisjoint(heavy), sorted(loaded & heavy)
    # Yet the API is still there, imported on first use.
    result = _python("import orchestrator; print(orchestrator.open_supervisor.__module__)")
    assert result.stdout.strip() == "orchestrator.core._supervisor", result.stderr
