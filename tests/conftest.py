"""Each test runs in one cost scope (``autoplan.caches``): the plans it evaluates share
their layers' costs, and the test starts from none of an earlier test's. Tests marked
``slow`` run first; tests marked ``torch`` are skipped where torch (the bench extra) is
not installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from autoplan import caches


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # slow tests first (their order kept): the workers (pytest-xdist) then end on short ones
    # and finish together, instead of one waiting on another's last long test
    items.sort(key=lambda item: "slow" not in item.keywords)
    if importlib.util.find_spec("torch") is not None:
        return
    skip = pytest.mark.skip(reason="needs torch: pip install torch==2.13.0 '.[bench]'")
    for item in items:
        if "torch" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def cost_scope() -> Iterator[None]:
    with caches.scope():
        yield
