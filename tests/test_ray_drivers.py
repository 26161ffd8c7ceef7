"""The test modules that make their process a Ray driver, run in a pytest of their own.

See ``tests/conftest.py``: after ``ray.shutdown()`` a driver process keeps Ray's native threads,
and one was seen holding the GIL for over ten minutes, freezing the next test. Here they run in a
child pytest, one per module; its result is this test's, its output is shown when it fails, and
a child that prints its summary but does not exit (the same freeze, at its exit) is killed.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DRIVER_ENV, RAY_DRIVERS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
#: The whole module's run, and the grace after its summary line before it is killed.
MODULE_TIMEOUT_S = 600
EXIT_GRACE_S = 30
SUMMARY = re.compile(r"^=* ?(\d+ passed|\d+ failed|.*error).* in [\d.]+s", re.MULTILINE)


@pytest.mark.parametrize("module", RAY_DRIVERS, ids=[Path(m).stem for m in RAY_DRIVERS])
def test_a_ray_driver_module_passes_in_its_own_process(module: str, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    env = {**os.environ, DRIVER_ENV: "1"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module]
    with out.open("wb") as sink:
        child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
        started = time.monotonic()
        summarised_at = None
        while child.poll() is None:
            now = time.monotonic()
            if summarised_at is None and SUMMARY.search(out.read_text(errors="replace")):
                summarised_at = now
            late = summarised_at is not None and now - summarised_at > EXIT_GRACE_S
            if late or now - started > MODULE_TIMEOUT_S:
                child.kill()
                child.wait()
                break
            time.sleep(0.5)
    text = out.read_text(errors="replace")
    summary = SUMMARY.search(text)
    assert summary is not None, f"{module}: no summary within {MODULE_TIMEOUT_S} s\n{text}"
    line = text[summary.start() : summary.end()]
    assert "failed" not in line, f"{module}: {line}\n{text}"
    assert "error" not in line, f"{module}: {line}\n{text}"
    assert re.search(r"\d+ passed", line), text
    assert child.returncode in (0, -9), f"{module}: exit {child.returncode}\n{text}"
