"""A node host's exit stream (``orchestrator.launch._node_exits``) on real processes: each
watched child's end (its status and the last 8 KiB of its output) is collected once, in a batch
with the others, without a thread a child; a poll with nothing ended waits and answers empty."""

import subprocess
import sys
import time

from orchestrator.launch._node_exits import TAIL, NodeExits
from orchestrator.launch._node_loop import NodeLoop


def child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def collect_all(exits: NodeExits, idents: set[str]) -> dict[str, tuple[int, bytes]]:
    got: dict[str, tuple[int, bytes]] = {}
    deadline = time.monotonic() + 30
    while set(got) != idents:
        assert time.monotonic() < deadline, got
        got |= exits.collect(5.0)
    return got


def test_each_end_is_collected_once_with_its_status_and_output_tail() -> None:
    exits = NodeExits(NodeLoop("test-exits"))
    loud = child("import sys; sys.stdout.write('x' * 20000 + 'END'); sys.exit(3)")
    quiet = child("import time; time.sleep(0.5)")
    killed = child("import time; time.sleep(60)")
    exits.watch("loud#1", loud)
    exits.watch("quiet#1", quiet)
    exits.watch("killed#1", killed)
    killed.kill()
    got = collect_all(exits, {"loud#1", "quiet#1", "killed#1"})
    status, tail = got["loud#1"]
    assert status == 3
    assert len(tail) == TAIL
    assert tail.endswith(b"END")
    assert got["quiet#1"] == (0, b"")
    assert got["killed#1"][0] == -9
    started = time.monotonic()
    assert exits.collect(0.5) == {}  # nothing more: each end is handed over once
    assert time.monotonic() - started >= 0.45
