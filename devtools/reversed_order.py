"""A pytest plugin that runs the collected tests in reverse order (``-p devtools.reversed_order`` from the
repository root): a test's counts must not depend on the tests before it (tests/test_test_order.py,
devtools/order_evidence.sh)."""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.reverse()
