"""Suite-wide hooks: ``@pytest.mark.needs(...)`` (see ``tests/_needs.py``)."""

import pytest

from tests._needs import missing


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture: a test that needs something absent fails here, in one line.
    for marker in item.iter_markers("needs"):
        for name in marker.args:
            if line := missing(name):
                pytest.fail(line, pytrace=False)
