"""Each test runs in one cost scope (``autoplan.caches``): the plans it evaluates share
their layers' costs, and none of them outlives the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autoplan import caches


@pytest.fixture(autouse=True)
def cost_scope() -> Iterator[None]:
    with caches.scope():
        yield
