"""Suite-wide hooks: ``@pytest.mark.needs(...)`` (see ``tests/_needs.py``), and the test
modules that make this process a Ray driver, which run in a pytest of their own
(``tests/test_ray_drivers.py``).

A process that was a Ray driver keeps Ray's native threads after ``ray.shutdown()``, and one of
them was seen to hold the GIL for ten minutes and more, freezing whatever test came next (a
fork-server test failed after 712 s with its trio deadline long past). So no test module run in
the suite's own process calls ``ray.init``: those that must (they drive the ray launcher in
process) are collected only where ``FLEET_TEST_RAY_DRIVER=1``, which the wrapper sets.
"""

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

from tests._needs import missing

# Property tests run beside real processes (two xdist workers on two cores, children of their
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
)
_OWN_BASETEMP = pytest.StashKey[str]()
_PASSED = pytest.StashKey[bool]()
#: Set in the wrapper's own pytest: there, and only there, the driver modules are collected.
DRIVER_ENV = "FLEET_TEST_RAY_DRIVER"


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


def pytest_unconfigure(config: pytest.Config) -> None:
    # Ours to remove once the run passed (a failed run's files are kept to look at).
    own = config.stash.get(_OWN_BASETEMP, None)
    if own is not None and config.stash.get(_PASSED, False):
        shutil.rmtree(own, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_PASSED] = exitstatus == 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture: a test that needs something absent fails here, in one line.
    for marker in item.iter_markers("needs"):
        for name in marker.args:
            if line := missing(name):
                pytest.fail(line, pytrace=False)
