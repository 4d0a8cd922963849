"""Memoized costs have one owner (``autoplan.caches``): every ``memo`` registers there, an
outermost scope starts from none, a scope inside another shares its memos."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autoplan import caches
from autoplan.cost.evaluate import evaluate
from autoplan.kernels import compute
from tests.helpers import make_plan

calls: list[int] = []


@pytest.fixture(autouse=True)
def cost_scope() -> Iterator[None]:
    """These tests open their own scopes: none around them (tests/conftest.py's, replaced)."""
    yield


@caches.memo(16)
def _square(x: int) -> int:
    calls.append(x)
    return x * x


def test_a_memo_is_shared_inside_a_scope_and_gone_in_the_next():
    calls.clear()
    with caches.scope():
        assert _square(3) == 9 and _square(3) == 9
        with caches.scope():  # nested: the outer one's memos
            assert _square(3) == 9
        assert calls == [3]
    assert _square.cache_info().currsize == 1  # held until the next question starts
    with caches.scope():
        assert _square.cache_info().currsize == 0
        _square(3)
    assert calls == [3, 3]


def test_an_evaluation_starts_cold_and_gives_the_same_prediction_again():
    plan = make_plan()
    with caches.scope():
        first = evaluate(plan)
    assert compute.gemm_time.cache_info().currsize > 0  # what that evaluation memoized
    caches.clear()
    assert caches.owned() == 0
    assert evaluate(plan) == first


def test_every_memo_of_the_cost_model_is_owned():
    """A memo the owner does not know would outlive every scope: the kernels', the axes',
    the stages' and the simulator's are all registered."""
    from autoplan.cost import stage
    from autoplan.parallel import mesh
    from autoplan.schedules import memory, simulator

    owned = set(map(id, caches._OWNED))
    for fn in (compute.gemm_time, compute.grouped_gemm_time, stage._shard, stage._stage,
               mesh.groups_of, memory.peak_inflight, simulator.simulate, simulator.critical_chain):
        assert id(fn) in owned, fn
