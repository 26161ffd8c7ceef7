"""``orchestrator.connect()``: the README's program runs whether or not ``fleet serve`` is up,
and a second supervisor of the same session is refused in one line."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from orchestrator import Refused, load_config, open_supervisor
from tests.e2e.conftest import running_fleet

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


def _readme_program() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    [program] = [str(block) for block in blocks if "connect()" in block]
    return program


def _run(program: Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(program)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_readme_program_runs_with_and_without_a_running_supervisor(tmp_path):
    with running_fleet(tmp_path, prefix="flc-") as fleet:
        (fleet.repo / "examples").mkdir()
        shutil.copy(ROOT / "examples" / "scout.yaml", fleet.repo / "examples" / "scout.yaml")
        program = tmp_path / "program.py"
        program.write_text(_readme_program())
        # No supervisor yet: the program starts one, as a verb would.
        first = _run(program, fleet.repo, fleet.env)
        assert first.returncode == 0, first.stderr
        assert "## Summary" in first.stdout
        assert "find the config loader" in first.stdout
        # Now one runs (the program's, still up): the program attaches to it.
        assert fleet.json("peek")["agents"] == []
        second = _run(program, fleet.repo, fleet.env)
        assert second.returncode == 0, second.stderr
        assert "find the config loader" in second.stdout
        handoffs = fleet.json("stop", "a2")["handoffs"]  # stopped already: its handoff again
        assert handoffs == [] or handoffs[0]["state"] == "stopped"

        # A second supervisor of the same session: one line, nothing started.
        async def embed() -> None:
            config = load_config(cwd=fleet.repo, home=fleet.home, session="t")
            async with open_supervisor(config):
                pytest.fail("a second supervisor of the session opened")

        with pytest.raises(Refused) as refused:
            trio.run(embed)
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith("session t already has a supervisor (pid ")
        assert "orchestrator.connect()" in message
