"""A pytest plugin that runs the collected tests in reverse order (``-p devtools.reversed_order`` from the
repository root): a test's counts must not depend on the tests before it (tests/test_test_order.py,
devtools/order_evidence.sh). ``--run-first TEXT`` then moves the tests whose node id holds ``TEXT`` to the front: each
runs before any other test of its process, as it would alone."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-first",
        default=None,
        metavar="TEXT",
        help="after reversing, move the tests whose node id holds TEXT to the front",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.reverse()
    first = config.getoption("--run-first")
    if first:
        items.sort(key=lambda item: first not in item.nodeid)  # stable: the rest keep the reversed order
