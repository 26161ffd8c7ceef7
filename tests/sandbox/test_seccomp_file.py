"""The seccomp filter file a process writes goes away with it, even when it was SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

_WRITE = (
    "import sys, time; from sandbox._seccomp import filter_file; "
    "print(filter_file(), flush=True); sys.exit(0) if sys.argv[1] == 'exit' else time.sleep(60)"
)


def _start(tmp: Path, mode: str) -> tuple[subprocess.Popen[str], Path]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITE, mode],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],
    )
    assert proc.stdout is not None
    path = Path(proc.stdout.readline().strip())
    assert path.name == "nosuid.bpf"
    return proc, path


def test_the_filter_directory_is_removed_at_exit_and_a_killed_ones_by_the_next(tmp_path):
    killed, killed_path = _start(tmp_path, "sleep")
    assert killed_path.is_file()
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.stdout is not None
    killed.stdout.close()
    assert killed_path.parent.exists()  # a SIGKILLed process runs no atexit
    foreign = tmp_path / "fleet-seccomp-notapid-x"
    foreign.mkdir()
    live = tmp_path / f"fleet-seccomp-{os.getpid()}-x"
    live.mkdir()

    clean, clean_path = _start(tmp_path, "exit")
    assert not killed_path.parent.exists()  # swept: its pid is gone
    assert clean.wait() == 0
    assert clean.stdout is not None
    clean.stdout.close()
    assert not clean_path.parent.exists()  # removed at exit
    assert foreign.exists()
    assert live.exists()  # a live process's directory is never touched
    assert tempfile.gettempdir() != str(tmp_path)  # the test never used the real /tmp
