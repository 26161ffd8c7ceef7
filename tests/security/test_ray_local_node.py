"""The supervisor's own Ray node, started by the ray launcher (``address="local"``), and its loss.

This module makes its process a Ray driver, so it runs in a pytest of its own
(``tests/conftest.py`` ``RAY_DRIVERS``). Found by a hostile run: the supervisor died 60 s after
its local node did, with every child. Two causes:

- ``ray.init`` starts the local GCS and raylet with ``PR_SET_PDEATHSIG``, which fires when the
  *thread* that called it exits (DESIGN §10); called from a trio worker thread, which trio
  retires after 10 s idle, the node was killed behind the supervisor's back (tested here);
- Ray ends its driver process when the GCS stays unreachable for 60 s: the whole supervisor.
  That one is tested through the real CLI, where the supervisor is the driver and waits out
  Ray's own 60 s (``tests/security/test_ray_node_loss_cli.py``); it was also waited out here,
  75 s more of the suite for the same behaviour.
"""

import threading
import time

import psutil
import pytest
import ray
import trio
from trio._core import _thread_cache as trio_thread_cache

from orchestrator.launch._ray import RayLauncher

pytestmark = pytest.mark.slow

#: trio retires an idle worker thread after IDLE_TIMEOUT (10 s); shortened here, so the test
#: waits for the thread's end, not for 10 real seconds.
IDLE_TIMEOUT_S = 0.5
#: After the thread ended, how long its PR_SET_PDEATHSIG kill would take to show.
KILLED_WITHIN_S = 1.5


def node_processes() -> list[psutil.Process]:
    return [
        p for p in psutil.Process().children(recursive=True) if p.name() in {"gcs_server", "raylet"}
    ]


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_local_node_outlives_the_thread_that_connected(monkeypatch) -> None:
    monkeypatch.setattr(trio_thread_cache, "IDLE_TIMEOUT", IDLE_TIMEOUT_S)
    threads: list[threading.Thread] = []

    def connect_here() -> None:
        threads.append(threading.current_thread())
        RayLauncher(slots=1)._connect()

    async def connect() -> None:
        # As the launcher does on a spawn: from a trio worker thread.
        await trio.to_thread.run_sync(connect_here)

    trio.run(connect)
    try:
        assert ray.is_initialized()
        node = node_processes()
        assert {p.name() for p in node} == {"gcs_server", "raylet"}, node
        [thread] = threads
        thread.join(30)  # trio retired the worker thread that ran _connect
        assert not thread.is_alive(), thread
        time.sleep(KILLED_WITHIN_S)
        assert all(alive(p) for p in node), f"the local node died with its thread: {node}"
    finally:
        ray.shutdown()  # the node, its workers, monitor and dashboard: this process started them
