"""The supervisor's own Ray node, started by the ray launcher (``address="local"``), and its loss.

This module makes its process a Ray driver, so it runs in a pytest of its own
(``tests/conftest.py`` ``RAY_DRIVERS``). Found by a hostile run: the supervisor died 60 s after
its local node did, with every child. Two causes, each tested here:

- ``ray.init`` starts the local GCS and raylet with ``PR_SET_PDEATHSIG``, which fires when the
  *thread* that called it exits (DESIGN §10); called from a trio worker thread, which trio
  retires after 10 s idle, the node was killed behind the supervisor's back;
- Ray ends its driver process when the GCS stays unreachable for 60 s: the whole supervisor.
"""

import contextlib
import time

import psutil
import pytest
import ray
import trio

from orchestrator.launch._ray import RayLauncher

pytestmark = pytest.mark.slow

#: trio retires an idle worker thread after 10 s; a little more.
THREAD_RETIRED_S = 13
#: Ray's default wait for a lost GCS before it ends the driver is 60 s; a margin over it.
GCS_GIVEN_UP_S = 75


def node_processes() -> list[psutil.Process]:
    return [
        p for p in psutil.Process().children(recursive=True) if p.name() in {"gcs_server", "raylet"}
    ]


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_local_node_outlives_the_thread_that_connected() -> None:
    async def connect() -> None:
        # As the launcher does on a spawn: from a trio worker thread.
        await trio.to_thread.run_sync(RayLauncher(slots=1)._connect)

    trio.run(connect)
    assert ray.is_initialized()
    node = node_processes()
    assert {p.name() for p in node} == {"gcs_server", "raylet"}, node
    time.sleep(THREAD_RETIRED_S)  # the worker thread that ran _connect is gone by now
    assert all(alive(p) for p in node), f"the local node died with its thread: {node}"


def test_the_supervisor_outlives_its_lost_local_node() -> None:
    assert ray.is_initialized()  # by the test above (same process)
    node = node_processes()
    assert node, "no local node"
    # Ray's other processes of this node (its workers, monitor, dashboard), listed while the
    # raylet still parents its workers: they lose their node too, and go with the test.
    rest = [p for p in psutil.Process().children(recursive=True) if p not in node]
    try:
        for process in node:  # the node is lost: OOM, a person, a crash
            process.kill()
        deadline = time.monotonic() + GCS_GIVEN_UP_S
        while time.monotonic() < deadline:  # Ray used to end this very process at 60 s
            time.sleep(1)
        # Reaching this line is the test: a driver Ray ended never reports (its wrapper fails).
        assert not any(alive(p) for p in node)
        assert ray.is_initialized()
    finally:
        for process in rest:
            with contextlib.suppress(psutil.Error):
                process.kill()
