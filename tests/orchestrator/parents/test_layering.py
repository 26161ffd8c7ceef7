"""The parents room is a client: of ``control`` it imports only the client side."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import orchestrator.parents

ROOM = Path(orchestrator.parents.__file__).parent
CLIENT_SIDE = {"orchestrator.control._client", "orchestrator.control._daemon_client"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def test_parents_import_only_the_control_client_and_never_core():
    modules = sorted(ROOM.rglob("*.py"))
    assert len(modules) >= 5  # the walk found the room
    for path in modules:
        for name in _imports(path):
            if name.startswith("orchestrator.control"):
                assert name in CLIENT_SIDE, f"{path.name} imports {name}"
            assert not name.startswith("orchestrator.core"), f"{path.name} imports {name}"


def test_the_mcp_server_loads_without_the_supervisor():
    code = (
        "import json, sys; import orchestrator.parents._mcp, orchestrator.parents._install; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert "orchestrator.parents._mcp" in loaded
    heavy = {"orchestrator.core._supervisor", "orchestrator.control._server", "psutil", "libtmux"}
    assert not loaded & heavy, sorted(loaded & heavy)
