"""Layer-to-stage partitioning: worked cases, the DP against brute force, and the DP
and CP-SAT against each other.

Times are binary fractions of a second and memory whole gigabytes, so the integer
ticks of the solvers hold them exactly and the hand-worked numbers compare with ==.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.descriptors.pipeline_layout import uniform_stages
from autoplan.descriptors.space import StageShape
from autoplan.errors import InputError
from autoplan.search.partition import (
    Partition,
    PartitionProblem,
    SolverTimeout,
    best_partition,
    partition_cpsat,
    partition_dp,
    stage_memory,
    stage_time,
)

GB = 1e9


def one_f_one_b(p: int) -> tuple[int, ...]:
    """Microbatches held by each stage under 1F1B: stage s holds p - s."""
    return tuple(p - s for s in range(p))


def problem(layers: int, stages: int, *, t: float = 1.0, static: float = 0.0, act: float = 0.0,
            first_time: float = 0.0, last_time: float = 0.0, last_static: float = 0.0,
            capacity: float = 1e6 * GB, shape: StageShape = StageShape.ANY) -> PartitionProblem:
    """Equal layers; extras on the first and last stages only."""
    stage_extra = [0.0] * stages
    stage_extra[0] += first_time
    stage_extra[-1] += last_time
    stage_static = [0.0] * stages
    stage_static[-1] += last_static
    return PartitionProblem(
        layer_time=(t,) * layers, layer_static=(static,) * layers, layer_activation=(act,) * layers,
        stage_time=tuple(stage_extra), stage_static=tuple(stage_static),
        inflight=one_f_one_b(stages), capacity=capacity, shape=shape)


def both(p: PartitionProblem) -> Partition | None:
    """The DP's answer, after checking that CP-SAT gives the same one."""
    dp, cp = partition_dp(p), partition_cpsat(p)
    assert (dp is None) == (cp is None), (dp, cp)
    if dp is not None and cp is not None:
        assert cp.optimal
        assert cp.layers == dp.layers
        assert math.isclose(cp.bottleneck_s, dp.bottleneck_s, rel_tol=1e-9)
    return dp


# --------------------------------------------------------------------------- worked cases


@pytest.mark.parametrize("layers", [32, 30])
def test_equal_layers_without_extras_or_memory_pressure_take_ceil_l_over_p_layers_of_time(layers):
    got = both(problem(layers, 4, t=0.5))
    assert got is not None
    assert got.bottleneck_s == math.ceil(layers / 4) * 0.5
    assert max(got.layers) == math.ceil(layers / 4)
    if layers % 4 == 0:
        assert got.layers == uniform_stages(layers, 4)


def test_a_large_vocabulary_moves_layers_off_the_last_stage():
    # logits cost 4 layers of time and hold 20 GB; 32 layers of 1 s on 4 stages.
    # Uniform (8, 8, 8, 8): the last stage takes 8 + 4 = 12 s. The 36 s of work cannot
    # take less than 36 / 4 = 9 s a stage, reached only by (9, 9, 9, 5).
    p = problem(32, 4, static=1 * GB, last_time=4.0, last_static=20 * GB, capacity=80 * GB)
    got = both(p)
    assert got is not None
    assert max(stage_time(p, uniform_stages(32, 4))) == 12.0
    assert got.layers == (9, 9, 9, 5)
    assert got.bottleneck_s == 9.0
    assert got.peak_bytes == (9 * GB, 9 * GB, 9 * GB, 25 * GB)


def test_binding_memory_moves_layers_off_the_first_stage():
    # 16 layers of 1 s, 1 GB of states and 1 GB of activations per microbatch; 1F1B
    # holds 4, 3, 2, 1 microbatches, so a layer costs 5, 4, 3, 2 GB on stages 0..3.
    # Uniform puts 4 * 5 = 20 GB on stage 0, over the 18 GB. Fitting: stage 0 <= 3
    # layers, stage 1 <= 4 (16 GB). A 5 s bottleneck needs 16 <= 3 + 4 + 5 + 5: yes;
    # 4 s: 3 + 4 + 4 + 4 = 15 < 16, no. Least peak at 5 s: 15 GB by (3, 3, 5, 5)
    # (3*5, 3*4, 5*3, 5*2 GB); 14 GB would allow only 2 + 3 + 4 + 5 = 14 layers.
    p = problem(16, 4, static=1 * GB, act=1 * GB, capacity=18 * GB)
    assert stage_memory(p, uniform_stages(16, 4))[0] == 20 * GB
    got = both(p)
    assert got is not None
    assert got.layers == (3, 3, 5, 5)
    assert got.bottleneck_s == 5.0
    assert got.peak_bytes == (15 * GB, 12 * GB, 15 * GB, 10 * GB)
    assert both(dataclasses.replace(p, shape=StageShape.UNIFORM)) is None


def test_no_split_that_fits_gives_none():
    # at 6 GB, stages 0..3 hold at most 1, 1, 2, 3 layers: 7 of the 16
    assert both(problem(16, 4, static=1 * GB, act=1 * GB, capacity=6 * GB)) is None


def test_a_stage_whose_fixed_memory_alone_is_over_capacity_gives_none():
    assert both(problem(8, 2, last_static=81 * GB, capacity=80 * GB)) is None


def test_fewer_layers_than_stages_need_empty_stages():
    assert both(problem(3, 4)) is None
    got = both(dataclasses.replace(problem(3, 4), min_layers=0))
    assert got is not None and got.bottleneck_s == 1.0
    assert got.layers == (0, 1, 1, 1)  # an empty first stage ranks first


def test_one_stage_holds_every_layer():
    got = both(problem(5, 1, last_time=2.0))
    assert got is not None and got.layers == (5,) and got.bottleneck_s == 7.0


def test_two_stages_put_the_logits_stage_on_the_short_side():
    got = both(problem(10, 2, last_time=2.0))
    assert got is not None and got.layers == (6, 4) and got.bottleneck_s == 6.0


def test_first_last_keeps_the_middle_stages_equal_at_some_cost():
    # the binding-memory case above: ANY's (3, 3, 5, 5) has unequal middles. With
    # middles of k layers, k <= 4 (stage 1 holds 4 GB a layer), the ends <= 3 and <= 5
    # layers: only (3, 4, 4, 5) holds 16 layers; the same 5 s, but 16 GB on stage 1.
    free = problem(16, 4, static=1 * GB, act=1 * GB, capacity=18 * GB)
    got = both(dataclasses.replace(free, shape=StageShape.FIRST_LAST))
    assert got is not None
    assert got.layers == (3, 4, 4, 5)
    assert got.bottleneck_s == 5.0
    assert max(got.peak_bytes) == 16 * GB


def test_the_remainder_goes_where_the_rank_says():
    # 30 layers, 5 stages, 1 s of embedding and 3 s of logits: 34 s of work, so 7 s a
    # stage at best: stage 0 <= 6 layers, the middles <= 7, the last <= 4. Fewest on
    # stage 0 first: 30 - 3 * 7 - 4 = 5; then the last holds the 4 the middles cannot.
    got = both(problem(30, 5, first_time=1.0, last_time=3.0))
    assert got is not None
    assert got.layers == (5, 7, 7, 7, 4)
    assert got.bottleneck_s == 7.0


def test_uniform_shape_returns_the_uniform_split():
    p = problem(30, 4, last_time=4.0, shape=StageShape.UNIFORM)
    got = both(p)
    assert got is not None
    assert got.layers == uniform_stages(30, 4) == (7, 8, 8, 7)
    assert got.bottleneck_s == 11.0


def test_best_partition_is_the_dp():
    p = problem(24, 4, static=1 * GB, act=1 * GB, last_time=2.0, capacity=30 * GB)
    assert best_partition(p) == partition_dp(p)


def test_cpsat_without_time_to_find_a_split_says_so_rather_than_none():
    p = problem(126, 16, static=2 * GB, act=0.4 * GB, last_time=3.0, capacity=80 * GB)
    assert partition_dp(p) is not None
    with pytest.raises(SolverTimeout):
        partition_cpsat(p, time_limit_s=0.0)


def test_a_problem_of_mismatched_lengths_reports_every_field():
    with pytest.raises(InputError) as err:
        PartitionProblem(layer_time=(1.0, 1.0), layer_static=(0.0,), layer_activation=(0.0, 0.0),
                         stage_time=(0.0, 0.0), stage_static=(0.0,), inflight=(2, -1),
                         capacity=0.0)
    fields = {p.field for p in err.value.problems}
    assert fields == {"layer_static", "stage_static", "inflight[1]", "capacity"}


# --------------------------------------------------------------------------- MoE and dense


@pytest.mark.parametrize(("shape", "capacity_gb"), [(StageShape.ANY, 58), (StageShape.FIRST_LAST, 64)])
def test_a_moe_dense_mix_gets_the_same_split_from_dp_and_cpsat(shape, capacity_gb):
    # DeepSeek-style: 3 dense layers first (1 s, 2 GB of states), then 29 MoE layers
    # (1.5 s, 6 GB); 1.5 GB of activations each; 8 stages of 1F1B. FIRST_LAST needs
    # 62 GB where ANY fits in 55: its middles cannot shrink toward the front stages,
    # where 1F1B holds more microbatches.
    dense, moe, p = 3, 29, 8
    prob = PartitionProblem(
        layer_time=(1.0,) * dense + (1.5,) * moe,
        layer_static=(2 * GB,) * dense + (6 * GB,) * moe,
        layer_activation=(1.5 * GB,) * (dense + moe),
        stage_time=(0.5,) + (0.0,) * (p - 2) + (3.0,),
        stage_static=(4 * GB,) + (0.0,) * (p - 2) + (12 * GB,),
        inflight=one_f_one_b(p), capacity=capacity_gb * GB, shape=shape)
    got = both(prob)
    assert got is not None
    assert max(got.peak_bytes) <= capacity_gb * GB
    # memory binds: the fastest split without a capacity is over it
    unbounded = partition_dp(dataclasses.replace(prob, capacity=1e6 * GB))
    assert unbounded is not None
    assert max(unbounded.peak_bytes) > capacity_gb * GB
    assert got.bottleneck_s > unbounded.bottleneck_s


# --------------------------------------------------------------------------- random


@st.composite
def problems(draw, max_layers: int, max_stages: int, grid: bool = True) -> PartitionProblem:
    """Small problems with a capacity drawn around what the uniform split needs, so that
    it binds often. On the grid (times in halves of a second, memory in whole GB) ties
    are many and the ticks exact; off it, any floats."""
    n = draw(st.integers(1, max_layers))
    p = draw(st.integers(1, max_stages))
    if grid:
        halves = st.integers(0, 4).map(lambda k: k / 2)
        gbs = st.integers(0, 4).map(lambda k: k * GB)
    else:
        halves = st.floats(0.0, 2.0)
        gbs = st.floats(0.0, 4 * GB)
    lt = draw(st.lists(halves, min_size=n, max_size=n))
    ls = draw(st.lists(gbs, min_size=n, max_size=n))
    la = draw(st.lists(gbs, min_size=n, max_size=n))
    extra_t = draw(st.lists(halves, min_size=p, max_size=p))
    extra_m = draw(st.lists(gbs, min_size=p, max_size=p))
    inflight = draw(st.sampled_from([one_f_one_b(p), (1,) * p]))
    loose = PartitionProblem(layer_time=tuple(lt), layer_static=tuple(ls),
                             layer_activation=tuple(la), stage_time=tuple(extra_t),
                             stage_static=tuple(extra_m), inflight=inflight, capacity=1e6 * GB,
                             shape=draw(st.sampled_from(list(StageShape))),
                             min_layers=draw(st.sampled_from([1, 1, 0, 2])))
    need = max(stage_memory(loose, uniform_stages(n, p))) if n >= p else 40 * GB
    capacity = max(1.0, need * draw(st.sampled_from([0.5, 0.7, 0.85, 1.0, 2.0])))
    return dataclasses.replace(loose, capacity=capacity)


@settings(max_examples=100, deadline=None)
@given(st.booleans().flatmap(lambda grid: problems(max_layers=24, max_stages=6, grid=grid)))
def test_dp_and_cpsat_give_the_same_split(prob):
    got = both(prob)
    if got is not None:
        assert sum(got.layers) == prob.n_layers
        assert min(got.layers) >= prob.min_layers
        assert max(got.peak_bytes) <= prob.capacity
        assert allowed_shape(prob, got.layers)


def splits(n: int, p: int, m: int):
    """Every split of n layers into p stages of at least m layers."""
    for cuts in itertools.combinations_with_replacement(range(n + 1), p - 1):
        sizes = [b - a for a, b in itertools.pairwise((0, *cuts, n))]
        if min(sizes) >= m:
            yield tuple(sizes)


def allowed_shape(prob: PartitionProblem, layers: tuple[int, ...]) -> bool:
    if prob.shape is StageShape.UNIFORM:
        return layers == uniform_stages(prob.n_layers, prob.n_stages)
    return prob.shape is StageShape.ANY or len(set(layers[1:-1])) <= 1


def rank(prob: PartitionProblem, layers: tuple[int, ...]):
    """The documented rank, in floats (exact for these inputs)."""
    return (max(stage_time(prob, layers)), max(stage_memory(prob, layers)),
            layers[0], layers[-1], *layers[1:-1])


@settings(max_examples=120, deadline=None)
@given(problems(max_layers=10, max_stages=4))
def test_the_dp_returns_the_best_ranked_split_of_all(prob):
    n, p = prob.n_layers, prob.n_stages
    fitting = [s for s in splits(n, p, prob.min_layers)
               if max(stage_memory(prob, s)) <= prob.capacity
               and allowed_shape(prob, s)]
    got = partition_dp(prob)
    if not fitting:
        assert got is None
    else:
        assert got is not None
        assert got.layers == min(fitting, key=lambda s: rank(prob, s))


@pytest.mark.parametrize("seed", range(40))
def test_min_bottleneck_is_the_dp_optimum_of_equal_layers_without_memory(seed):
    """stages.min_bottleneck, the search's cheap bound, is exact for equal layers."""
    import random

    from autoplan.search.stages import min_bottleneck

    rnd = random.Random(seed)
    p, n = rnd.randint(1, 6), rnd.randint(6, 30)
    if n < p:
        return
    t = rnd.choice([1.0, 0.5, 0.25])
    fixed = tuple(rnd.choice([0.0, 0.25, 0.5, 1.0, 2.5]) for _ in range(p))
    problem = PartitionProblem(layer_time=(t,) * n, layer_static=(1.0,) * n,
                               layer_activation=(0.0,) * n, stage_time=fixed,
                               stage_static=(0.0,) * p, inflight=(1,) * p, capacity=1e12)
    part = partition_dp(problem)
    assert part is not None
    assert min_bottleneck(t, fixed, n) == pytest.approx(part.bottleneck_s)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(1, 8), st.integers(0, 1),
       st.integers(1, 2),
       st.lists(st.sampled_from([0.25, 0.5, 1.0]), min_size=9, max_size=9),
       st.lists(st.sampled_from([0.0, 0.5, 2.0]), min_size=4, max_size=4),
       st.sampled_from([1.0, 0.5, 0.25]))
def test_min_pipeline_time_never_exceeds_any_splits_pipeline_time(p, n, m, first, least,
                                                                    kinds, fixed, k):
    """Against every split into contiguous runs of at least ``least`` layers."""
    from autoplan.search.stages import min_pipeline_time

    if n < p * least:
        return
    times, fixed = tuple(kinds[:n]), tuple(fixed[:p])
    fills = tuple(t * k for t in times)  # a layer's fill never exceeds its time
    got = min_pipeline_time(times, fills, fixed, (n,) * p, m, first, min_layers=least)
    for cuts in itertools.combinations(range(1, n), p - 1):
        ends = (*cuts, n)
        if any(b - a < least for a, b in zip((0, *cuts), ends, strict=True)):
            continue
        worst, start, held = 0.0, 0, 0.0
        for s, end in enumerate(ends):
            worst = max(worst, m * (fixed[s] + sum(times[start:end])) + held)
            if s >= first:
                held += sum(fills[start:end])
            start = end
        assert got <= worst * (1 + 1e-12)


def test_min_pipeline_time_by_hand():
    """Two stages of 1F1B, 4 unit layers, 4 microbatches, the fill the first stage's
    whole forward and backward: (2, 2) gives max(4*2, 4*2 + 2) = 10, (3, 1) 12, (1, 3)
    13. Three stages, 6 layers, 2 microbatches: (2, 2, 2) gives max(4, 4 + 2, 4 + 4) = 8;
    (3, 2, 1) max(6, 4 + 3, 2 + 5) = 7, the least."""
    from autoplan.search.stages import min_pipeline_time

    assert min_pipeline_time((1.0,) * 4, (1.0,) * 4, (0.0, 0.0), (4, 4), 4) == pytest.approx(10, rel=1e-3)
    got = min_pipeline_time((1.0,) * 6, (1.0,) * 6, (0.0,) * 3, (6,) * 3, 2)
    assert got == pytest.approx(7, rel=1e-3) and got <= 7
    # stage 0's fill left out (vpp > 1): (2, 2, 2) gives max(4, 4, 4 + 2) = 6, the least
    got = min_pipeline_time((1.0,) * 6, (1.0,) * 6, (0.0,) * 3, (6,) * 3, 2, first_fill=1)
    assert got == pytest.approx(6, rel=1e-3) and got <= 6


def test_cpsat_finds_the_least_peak_memory_at_a_tied_bottleneck():
    """16 layers on 5 stages, the bottleneck 2.5 s either way: (3, 1, 3, 7, 2) peaks at
    15 GB (stage 0: layer 2's 3 GB x 5 in flight), (3, 1, 4, 7, 1) at 20 GB (stage 2: layer
    5's 2 GB of weights and layers 5-7's 6 GB x 3). Both solvers find the first (the
    property test above found CP-SAT, presolve on, taking the second as optimal)."""
    prob = PartitionProblem(
        layer_time=(0.0,) * 6 + (0.5, 2.0) + (0.0,) * 4 + (0.5, 0.0, 0.5, 2.0),
        layer_static=(0.0,) * 5 + (2 * GB,) + (0.0,) * 10,
        layer_activation=(0.0, 0.0, 3 * GB, 3 * GB, 0.0, 2 * GB, 2 * GB, 2 * GB, 4 * GB, 1 * GB,
                          0.0, 0.0, 0.0, 0.0, 1 * GB, 0.0),
        stage_time=(0.0,) * 5, stage_static=(0.0,) * 5, inflight=(5, 4, 3, 2, 1),
        capacity=22.95e9, shape=StageShape.ANY, min_layers=1)
    got = both(prob)
    assert got is not None and got.layers == (3, 1, 3, 7, 2)
    assert max(got.peak_bytes) == 15e9 and got.bottleneck_s == 2.5


def test_cpsat_finds_the_least_peak_memory_when_every_layer_time_is_zero():
    """17 layers on 6 stages, no time anywhere, so the split is ranked by its largest
    stage memory: (1, 1, 1, 1, 11, 2) holds at most 8 GB (stage 2: 2 GB x 4 in flight;
    the last stage 3 + 4 + 1 GB), (1, 1, 1, 1, 12, 1) puts layer 15's 3 GB on stage 4
    beside its 6 GB of activations (9 GB). Both solvers find the first (CP-SAT with its
    presolve on found the second, and called it optimal)."""
    zero = (0.0,) * 17
    prob = PartitionProblem(
        layer_time=zero, layer_static=(0.0,) * 15 + (3 * GB, 4 * GB),
        layer_activation=(0.0, 0.0, 2 * GB, 1 * GB, 2 * GB, 1 * GB) + (0.0,) * 11,
        stage_time=(0.0,) * 6, stage_static=(0.0,) * 5 + (1 * GB,), inflight=(6, 5, 4, 3, 2, 1),
        capacity=14e9, shape=StageShape.ANY, min_layers=1)
    assert partition_dp(prob).layers == (1, 1, 1, 1, 11, 2)
    both(prob)
