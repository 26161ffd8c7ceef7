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

import pytest

from tests._needs import missing

#: Test modules that call ``ray.init`` in the test process (paths from the repository root).
RAY_DRIVERS = (
    "tests/orchestrator/launch/test_ray.py",
    "tests/orchestrator/launch/test_ray_sweep.py",
    "tests/security/test_ray_node.py",
    "tests/security/test_ray_node_sandbox.py",
    "tests/security/test_ray_local_node.py",
)
#: Set in the wrapper's own pytest: there, and only there, the driver modules are collected.
DRIVER_ENV = "FLEET_TEST_RAY_DRIVER"


def pytest_ignore_collect(collection_path, config) -> bool | None:
    if os.environ.get(DRIVER_ENV) == "1":
        return None
    relative = os.path.relpath(collection_path, config.rootpath)
    return True if relative in RAY_DRIVERS else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture: a test that needs something absent fails here, in one line.
    for marker in item.iter_markers("needs"):
        for name in marker.args:
            if line := missing(name):
                pytest.fail(line, pytrace=False)
