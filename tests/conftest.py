"""Suite-wide hooks: ``@pytest.mark.needs(...)`` (see ``tests/_needs.py``), and the test
modules that make this process a Ray driver, which run in a pytest of their own
(``tests/test_ray_drivers.py``).

A process that was a Ray driver keeps Ray's native threads after ``ray.shutdown()``, and one of
them was seen to hold the GIL for ten minutes and more, freezing whatever test came next (a
fork-server test failed after 712 s with its trio deadline long past). So no test module run in
the suite's own process calls ``ray.init``: those that must (they drive the ray launcher in
process) are collected only where ``FLEET_TEST_RAY_DRIVER=1``, which the wrapper sets.
"""

import contextlib
import fcntl
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, settings
from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]

from tests._needs import missing

# Property tests run beside real processes (three xdist workers on two cores, children of their
# own): a slow draw is the machine's load, not the strategy's fault, and no example has a
# deadline. A test's own ``@settings`` still sets its ``max_examples``.
settings.register_profile(
    "fleet", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("fleet")

#: Test modules that call ``ray.init`` in the test process (paths from the repository root).
RAY_DRIVERS = (
    "tests/orchestrator/launch/test_ray.py",
    "tests/orchestrator/launch/test_ray_sweep.py",
    "tests/security/test_ray_node.py",
    "tests/security/test_ray_node_sandbox.py",
    "tests/security/test_ray_local_node.py",
)
#: Every process this run starts inherits it (the supervisor hands its environment on): what
#: is still running with it once the run ends was left behind (:func:`pytest_sessionfinish`).
RUN_ENV = "FLT_TEST_RUN"
#: How long the run's last processes may take to go before they count as left behind.
LEFTOVER_GRACE_S = 10.0
_RUN = pytest.StashKey[str]()
_OWN_BASETEMP = pytest.StashKey[str]()
_PASSED = pytest.StashKey[bool]()
#: Set in the wrapper's own pytest: there, and only there, the driver modules are collected.
DRIVER_ENV = "FLEET_TEST_RAY_DRIVER"
#: Tests that start a Ray cluster: one at a time across the run's workers (two clusters on two
#: cores starve each other, and ``fleet demo --ray``'s test counts the machine's Ray heads).
RAY_USERS = (
    "tests/test_ray_drivers.py",
    "tests/e2e/test_demo_ray.py",
    "tests/e2e/test_ray_fleet.py",
    "tests/e2e/test_ray_node_loss.py",
    "tests/e2e/test_ray_revive.py",
    "tests/e2e/test_ray_scale.py",
    "tests/test_benchmarks.py::test_a_benchmarks_smoke_run_completes_and_prints_its_json_line[ray_fleet]",
    "tests/security/test_ray_node_loss_cli.py",
)
#: Tests that run one at a time under the same lock: Ray clusters, and tests that look for
#: their processes by what runs on the whole machine (the hostile shells' ``sleep 301N``).
ONE_AT_A_TIME = (*RAY_USERS, "tests/security/test_shells.py")
ONE_AT_A_TIME_GROUP = "one-at-a-time"
#: Modules whose tests take tens of seconds each: run first, so that the workers end together
#: instead of one of them running the longest tests last.
HEAVY_FIRST = (
    "tests/test_ray_drivers.py",
    "tests/test_benchmarks.py",
    "tests/e2e/",
    "tests/faults/",
)


def pytest_ignore_collect(collection_path, config) -> bool | None:
    if os.environ.get(DRIVER_ENV) == "1":
        return None
    relative = os.path.relpath(collection_path, config.rootpath)
    return True if relative in RAY_DRIVERS else None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Short temporary paths: sockets live under tmp_path and a Unix socket's path must fit in
    # ~104 bytes. Under xdist each worker's tmp_path gains ``popen-gwN/``; pytest's default root
    # (/tmp/pytest-of-USER/pytest-N/) then leaves too little for a CLI's socket. A fresh root of
    # our own is shorter than the default even with the worker's part (pytest owns it: it is
    # emptied at the start, and the workers' roots are made under it).
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="flt-", dir="/tmp")
        config.stash[_OWN_BASETEMP] = config.option.basetemp
    if not hasattr(config, "workerinput"):
        # Set before xdist starts its workers, so they and all they start carry it. A pytest
        # run inside a test (the Ray drivers, fault_soak) marks its own processes.
        config.stash[_RUN] = os.environ[RUN_ENV] = f"{os.getpid()}-{secrets.token_hex(4)}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next(
            (n for n, prefix in enumerate(HEAVY_FIRST) if item.nodeid.startswith(prefix)),
            len(HEAVY_FIRST),
        )

    items.sort(key=rank)  # stable: the order within each rank is the collection's


class OneAtATime(LoadGroupScheduling):  # type: ignore[misc]
    """``--dist loadgroup`` with the tests that run one at a time as one group: they go to one
    worker, one after the other, while the other workers share the rest test by test. Spread
    over the workers (``worksteal``), each waited on the lock below while another ran its Ray
    cluster, idle for up to minutes. (The ``xdist_group`` mark cannot say it: pytest 9 ignores
    the node id xdist 3.8 rewrites for it.)"""

    def _split_scope(self, nodeid: str) -> str:
        return ONE_AT_A_TIME_GROUP if nodeid.startswith(ONE_AT_A_TIME) else nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadGroupScheduling | None:
    return OneAtATime(config, log) if config.getvalue("dist") == "loadgroup" else None


def _ray_lock(marker: str) -> str:
    """One lock file per run, shared by its workers (they inherit the run's marker)."""
    return os.path.join(tempfile.gettempdir(), f"flt-ray-{marker}.lock")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not item.nodeid.startswith(ONE_AT_A_TIME):
        return (yield)
    path = _ray_lock(os.environ.get(RUN_ENV, "none"))
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return (yield)
    finally:
        os.close(fd)  # releases the lock


def pytest_unconfigure(config: pytest.Config) -> None:
    # Ours to remove once the run passed (a failed run's files are kept to look at).
    marker = config.stash.get(_RUN, None)
    if marker is not None:
        with contextlib.suppress(OSError):
            os.unlink(_ray_lock(marker))
    own = config.stash.get(_OWN_BASETEMP, None)
    if own is not None and config.stash.get(_PASSED, False):
        shutil.rmtree(own, ignore_errors=True)


def _left_behind(marker: str) -> list[psutil.Process]:
    """The live processes (but this one) that carry this run's *marker*."""
    found = []
    for process in psutil.process_iter(["environ"]):
        try:
            environ = process.info["environ"] or {}
            if process.pid == os.getpid() or environ.get(RUN_ENV) != marker:
                continue
            if process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def _describe(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid}: {' '.join(process.cmdline())[:300]}"
    except psutil.Error:
        return f"pid {process.pid}"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No process of this run outlives it: a test that leaves one behind (a sandbox that
    ignored its SIGTERM, a daemon never stopped) fails the run, and the process is killed.
    Checked by the process that started the run, after xdist's workers have gone."""
    config = session.config
    marker = config.stash.get(_RUN, None)
    if marker is not None:
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        left = _left_behind(marker)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = _left_behind(marker)
        if left:
            lines = [_describe(process) for process in left]
            for process in left:
                try:
                    process.kill()
                except psutil.Error:
                    continue
            writer = config.get_terminal_writer()
            writer.line()
            writer.line(
                f"{len(left)} process(es) of this run were still running {LEFTOVER_GRACE_S:g} s "
                "after its last test (killed now); find the test that left them:",
                red=True,
            )
            for line in lines:
                writer.line(f"  {line}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    config.stash[_PASSED] = session.exitstatus == 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture: a test that needs something absent fails here, in one line.
    for marker in item.iter_markers("needs"):
        for name in marker.args:
            if line := missing(name):
                pytest.fail(line, pytrace=False)
