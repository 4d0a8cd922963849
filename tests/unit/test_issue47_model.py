"""The cost model under input issue 47 found it could not take: every recompute module on
every kind of model without a division by zero, Daly's wall clock in log space, and the
prefix cache that holds what fits."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.cost.stage import module_recompute
from autoplan.descriptors.job import Documents
from autoplan.kernels import packing
from autoplan.vocab import Recompute, RecomputeModule
from tests.helpers import cpu_seconds, make_plan


@pytest.mark.parametrize("model", ["llama3-8b", "mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b"])
def test_every_recompute_module_costs_a_finite_time_on_every_kind_of_model(model):
    base = make_plan(model, gpus=8, dp=8, global_batch=8, seq_len=1024,
                     recompute=Recompute.SELECTIVE)
    for module in RecomputeModule:
        plan = dataclasses.replace(base, recompute_modules=(module,))
        dense, moe = module_recompute(plan)
        assert math.isfinite(dense) and math.isfinite(moe) and dense >= 0 and moe >= 0
        if not base.model.is_moe and module in (RecomputeModule.MOE, RecomputeModule.MOE_ACT,
                                                RecomputeModule.SHARED_EXPERTS):
            assert dense == moe == 0.0  # a dense model has nothing of them to recompute


# ---- packed documents: closed form, the same figures as enumerating the pieces

def _enumerated(documents, seq_len: int) -> list[list[int]]:
    """The packing piece by piece, as kernels/packing.py enumerated it before issue 47: the
    lengths repeated, cut every ``seq_len`` tokens, ``SEQUENCES`` sequences."""
    from autoplan.kernels.packing import SEQUENCES

    lengths = documents.lengths()
    out: list[list[int]] = []
    current: list[int] = []
    room, i = seq_len, 0
    while len(out) < SEQUENCES:
        left = lengths[i % len(lengths)]
        i += 1
        while left:
            take = min(left, room)
            current.append(take)
            left, room = left - take, room - take
            if room == 0:
                out.append(current)
                current, room = [], seq_len
                if len(out) == SEQUENCES:
                    break
    return out


_DOCUMENTS = st.one_of(
    st.builds(lambda n: Documents("fixed", length=float(n)), st.integers(8, 20_000)),
    st.builds(lambda m, s: Documents("lognormal", length=m, sigma=s),
              st.floats(1.0, 20_000.0), st.floats(0.0, 3.0)),
    st.builds(lambda bins: Documents("histogram", bins=tuple(sorted(bins))),
              st.lists(st.tuples(st.integers(1, 20_000), st.floats(0.01, 10.0)), min_size=1,
                       max_size=5, unique_by=lambda b: b[0])))


@settings(max_examples=20, deadline=None)
@given(documents=_DOCUMENTS, seq_len=st.integers(1, 6000), cp=st.sampled_from([2, 3, 4, 8]))
def test_the_closed_form_packing_gives_exactly_the_enumerated_pieces_figures(documents, seq_len, cp):
    sequences = _enumerated(documents, seq_len)
    whole = seq_len * (seq_len + 1) / 2
    share = sum(sum(n * (n + 1) / 2 for n in seq) / whole for seq in sequences) / len(sequences)
    length = sum(n * n for seq in sequences for n in seq) / sum(n for seq in sequences for n in seq)
    ratios = []
    for seq in sequences:
        ranks = packing.rank_work(seq, seq_len, cp)
        mean = sum(ranks) / cp
        ratios.append(max(ranks) / mean if mean else 1.0)
    assert packing.attention_share(documents, seq_len) == share
    assert packing.attention_length(documents, seq_len) == length
    assert packing.cp_imbalance(documents, seq_len, cp) == sum(ratios) / len(ratios)


@pytest.mark.parametrize("documents", [
    Documents("fixed", length=1.0), Documents("lognormal", length=0.001, sigma=1.0),
    Documents("histogram", bins=((1, 1.0),))])
def test_one_token_documents_cost_no_more_to_pack_than_long_ones(documents):
    from autoplan.descriptors.job import MAX_SEQ_LEN

    documents.lengths()  # the distribution's quantiles: once per distribution, not timed
    with cpu_seconds() as took:
        for seq_len in (8192, 131072, MAX_SEQ_LEN):
            share = packing.attention_share(documents, seq_len)
            assert packing.attention_length(documents, seq_len) < 2
            for cp in (2, 4, 8, 16, 32):
                assert packing.cp_imbalance(documents, seq_len, cp) == pytest.approx(1.0, abs=1e-3)
    assert share < 1e-6
    assert took[0] < 0.5, took  # 8.4 million pieces at 128K, enumerated, took minutes


# ---- prefix caching holds what fits: unused prefixes are evicted, least recently used first

def test_the_kv_pool_evicts_the_least_recently_released_prefix_and_never_a_referenced_one():
    from autoplan.serving.scheduler import KVPool

    pool = KVPool(100, reserves=False, prefix=30)
    for group in (0, 1, 2):  # three requests compute their groups' prefixes and hand them over
        pool.grow(30)
        pool.cache(group)
    assert pool.used == 90 and pool.ready == {0, 1, 2}
    for group in (0, 1, 2):
        pool.unpin(group)  # released in this order: 0 is the least recently used
    assert pool.used == 0 and pool.evictable == 90 and pool.ready == {0, 1, 2}
    assert pool.can_admit(100, 100)  # cached prefixes take no room from admissions
    pool.grow(40)  # 40 + 90 > 100: group 0 goes
    assert pool.ready == {1, 2} and pool.evictable == 60
    assert pool.pin_cost(1) == 30
    pool.pin(1)  # a hit: group 1 is referenced again, no longer evictable
    assert pool.used == 70 and pool.evictable == 30
    pool.grow(10)  # 80 + 30 > 100: group 2 goes, not the referenced group 1
    assert pool.ready == {1} and pool.evictable == 0 and pool.refs == {1: 1}
    pool.unpin(1)
    assert pool.used == 50 and pool.evictable == 30 and pool.ready == {1}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_prefix_groups_past_the_cache_serve_every_request_no_slower_than_without(engine):
    import numpy as np

    from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
    from autoplan.serving.cost import StepModel
    from autoplan.serving.deployment import Deployment
    from autoplan.serving.engine import Engine
    from autoplan.serving.simulate import run_requests

    step = StepModel(resolve_model("llama3-8b"), with_gpus(resolve_cluster("dgx-h100"), 1),
                     Deployment(replicas=1, tp=1, max_num_seqs=256), Engine(engine))
    rng = np.random.default_rng(0)
    n = 300
    args = (np.cumsum(rng.exponential(0.05, n)), rng.integers(600, 1500, n), rng.integers(10, 200, n))
    for kv in (6_000, 20_000):  # 6,000 tokens: four to ten prompts at once
        without = run_requests(step, *args, kv)
        for groups in (40, 5000):  # 5,000 x 896 tokens of prefixes: 750 times the cache
            shared = run_requests(step, *args, kv, prefix=(900, groups))
            assert len(shared.index) == len(without.index) == n  # none refused
            assert shared.ttft.mean() <= without.ttft.mean() * (1 + 1e-12)
            assert 0 <= shared.prefix_hit_share <= 1
        few = run_requests(step, *args, kv, prefix=(900, 2))  # two groups fit: most hit
        assert few.prefix_hit_share > 0.4 and few.ttft.mean() < without.ttft.mean()
