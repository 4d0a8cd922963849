"""Uneven layer-to-stage splits for the search: the partition problem of a plan, built
from the cost model's own per-stage functions, a cheap bound on what any split can
reach, and the plan with its best split."""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

from autoplan.cost.bounds import (
    StageWork,
    cost_key,
    optimizer_seconds,
    stage_memory,
    stage_work,
    stage_work_for,
    step_overhead,
)
from autoplan.parallel.pp import uniform_stages
from autoplan.plan import Plan
from autoplan.schedules.memory import peak_inflight
from autoplan.search.partition import PartitionProblem, best_partition
from autoplan.search.space import StageShape


def _classes(p: int) -> list[int]:
    """One representative stage per cost class: first, a middle one, last."""
    return sorted({0, min(1, p - 1), p - 1})


def _class_of(s: int, p: int) -> int:
    return 0 if s == 0 else p - 1 if s == p - 1 else min(1, p - 1)


def _linear_times(plan: Plan) -> tuple[float, tuple[float, ...]]:
    """(seconds per layer, fixed seconds per stage), per microbatch, forward + backward.

    Stage time is linear in the layers a stage holds, so a layer's share is the
    difference between the stage with two layers and with one; the rest (embedding,
    logits, transfers) is the stage's fixed share. A mixture of experts with dense
    first layers has two kinds of layer: the cheaper one's time is returned, so the
    bounds built on it stay valid for every split."""
    return _linear_times_of(cost_key(plan))


def _total(w: StageWork) -> float:
    return w.forward + w.backward


@lru_cache(maxsize=16384)
def _linear_times_of(plan: Plan) -> tuple[float, tuple[float, ...]]:
    p = plan.layout.pp
    fixed: dict[int, float] = {}
    for c in _classes(p):
        one, two = stage_work_for(plan, c, 1), stage_work_for(plan, c, 2)
        fixed[c] = _total(one) - (_total(two) - _total(one))
    return min(_layer_steps(plan)), tuple(fixed[_class_of(s, p)] for s in range(p))


def _mixed(plan: Plan) -> bool:
    """The model has both dense and MoE layers."""
    return 0 < plan.model.moe_layers < plan.model.layers


@lru_cache(maxsize=16384)
def _layer_steps(key: Plan) -> tuple[float, float]:
    """(seconds, seconds of a dense layer) per microbatch that one more layer adds to a
    middle stage, whose layers stand for every layer; the two are equal unless the model
    mixes dense and MoE layers (``key``: a cost key, see ``cost_key``)."""
    mid = min(1, key.layout.pp - 1)
    one = _total(stage_work_for(key, mid, 1))
    step = _total(stage_work_for(key, mid, 2)) - one
    if not _mixed(key):
        return step, step
    return step, _total(stage_work_for(key, mid, 2, dense=1)) - one


def partition_problem(plan: Plan, shape: StageShape) -> PartitionProblem:
    """Per-layer and per-stage costs of ``plan`` (vpp = 1), for the partitioner."""
    assert plan.layout.vpp == 1, "uneven splits are for one chunk per stage"
    p, m, layers = plan.layout.pp, plan.num_microbatches, plan.model.layers
    _, stage_time = _linear_times(plan)
    inflight = tuple(peak_inflight(plan.schedule, p, m, 1, s) for s in range(p))
    # memory is linear in the layers and, per stage class, in the in-flight count:
    # two evaluations per class at 1 and 2 in-flight microbatches give its coefficients
    coef: dict[int, tuple[float, float, float, float]] = {}
    for c in _classes(p):
        one, two = stage_work_for(plan, c, 1), stage_work_for(plan, c, 2)
        a1, a2 = stage_memory(plan, c, one, 1), stage_memory(plan, c, one, 2)
        b1 = stage_memory(plan, c, two, 1)
        static_layer = (b1.weights + b1.grads + b1.optimizer) - (a1.weights + a1.grads + a1.optimizer)
        act_layer = b1.activations - a1.activations  # one layer, one in-flight microbatch
        per_inflight = a2.peak - a1.peak  # one more in-flight microbatch of the 1-layer stage
        coef[c] = (a1.peak - per_inflight, per_inflight, static_layer, act_layer)
    middle = coef[min(1, p - 1)]
    layer_static, layer_act = middle[2], middle[3]
    stage_static = []
    for s in range(p):
        base, per_inflight, static_layer, act_layer = coef[_class_of(s, p)]
        one_layer = base + inflight[s] * per_inflight  # the stage holding one layer
        stage_static.append(one_layer - static_layer - inflight[s] * act_layer)
    step, dense_step = _layer_steps(cost_key(plan))
    times = [step] * layers
    statics, acts = [layer_static] * layers, [layer_act] * layers
    if _mixed(plan):  # the dense first layers: their own time and memory per layer
        mid = min(1, p - 1)
        a1 = stage_memory(plan, mid, stage_work_for(plan, mid, 1), 1)
        d1 = stage_memory(plan, mid, stage_work_for(plan, mid, 2, dense=1), 1)
        for i in range(plan.model.layers - plan.model.moe_layers):
            times[i] = dense_step
            statics[i] = (d1.weights + d1.grads + d1.optimizer) - (a1.weights + a1.grads + a1.optimizer)
            acts[i] = d1.activations - a1.activations
    return PartitionProblem(
        layer_time=tuple(times), layer_static=tuple(statics),
        layer_activation=tuple(acts), stage_time=stage_time,
        stage_static=tuple(stage_static), inflight=inflight,
        capacity=plan.cluster.device.mem_bytes, shape=shape,
    )


def min_bottleneck(layer_time: float, stage_time: tuple[float, ...], layers: int) -> float:
    """The least bottleneck B any split of ``layers`` equal layers can reach (memory
    ignored, at least one layer per stage): the least B with
    f(B) = sum_s floor((B - c_s) / t) >= L.

    The continuous relaxation gives B0 = (L t + sum c) / p, and f(B0 + t) >= L, so the
    answer is max(B0', c_max + t) where B0' is the least c_s + k t in [B0, B0 + t]:
    one candidate per stage."""
    t, p = layer_time, len(stage_time)
    floor_at_least_one = max(stage_time) + t
    if t <= 0:
        return max(stage_time)

    def fits(b: float) -> bool:
        return sum(max(0, math.floor((b - c) / t + 1e-9)) for c in stage_time) >= layers

    if fits(floor_at_least_one):
        return floor_at_least_one
    b0 = (layers * t + math.fsum(stage_time)) / p
    candidates = sorted(c + math.ceil((b0 - c) / t - 1e-9) * t for c in stage_time)
    for b in candidates:
        if fits(b):
            return max(b, floor_at_least_one)
    return max(b0 + t, floor_at_least_one)


def layer_caps(problem: PartitionProblem) -> tuple[int, ...]:
    """Most (equal) layers each stage can hold within its memory."""
    caps = []
    n = problem.n_layers
    static, act = min(problem.layer_static), min(problem.layer_activation)  # the lightest layer
    for s in range(problem.n_stages):
        per = static + problem.inflight[s] * act
        room = problem.capacity - problem.stage_static[s]
        caps.append(-1 if room < 0 else n if per <= 0 else min(n, math.floor(room / per)))
    return tuple(caps)


def min_bottleneck_capped(problem: PartitionProblem) -> float | None:
    """The least bottleneck of equal layers when each stage also holds at most what fits
    in its memory (a lower bound for the partitioner's answer); None when no split fits.
    f(B) = sum_s min(cap_s, floor((B - c_s) / t)) is a nondecreasing step function of B:
    bisect for its first step reaching L."""
    caps, n = layer_caps(problem), problem.n_layers
    if min(caps) < problem.min_layers or sum(caps) < n:
        return None
    t, c = min(problem.layer_time), problem.stage_time  # the cheapest layer: still a bound
    if t <= 0:
        return max(c)

    def count(b: float) -> int:
        return sum(min(k, max(0, math.floor((b - cs) / t + 1e-9))) for k, cs in zip(caps, c, strict=True))

    lo = max(cs + problem.min_layers * t for cs in c)
    hi = max(c) + n * t
    if count(lo) >= n:
        return lo
    for _ in range(64):  # to float precision
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if count(mid) >= n else (mid, hi)
    return lo


def split_bound(plan: Plan, works: tuple[StageWork, ...]) -> float:
    """A step time no uneven split of ``plan`` beats: m times the least bottleneck, plus
    the optimizer step of a stage holding the mean parameters."""
    layer_time, stage_time = _linear_times(plan)
    return _bound(plan, works, min_bottleneck(layer_time, stage_time, plan.model.layers))


def split_bound_with_memory(plan: Plan, problem: PartitionProblem) -> float | None:
    """:func:`split_bound` with each stage's memory cap taken into account; None when
    no split of equal layers fits."""
    bottleneck = min_bottleneck_capped(problem)
    return None if bottleneck is None else _bound(plan, stage_work(plan), bottleneck)


def _bound(plan: Plan, works: tuple[StageWork, ...], bottleneck: float) -> float:
    params = [w.params for w in works]
    optimizer = optimizer_seconds(plan, works) * (sum(params) / len(params)) / max(params)
    return plan.num_microbatches * bottleneck + optimizer + step_overhead(plan)


@lru_cache(maxsize=4096)
def _best(problem: PartitionProblem) -> tuple[int, ...] | None:
    part = best_partition(problem)
    return None if part is None else part.layers


def with_best_stages(plan: Plan, shape: StageShape,
                     problem: PartitionProblem | None = None) -> Plan | None:
    """``plan`` with the split the partitioner picks for its schedule and memory;
    None when no split the launcher can express fits in memory."""
    if shape is StageShape.UNIFORM or plan.layout.pp == 1 or plan.layout.vpp > 1:
        return plan
    layers = _best(problem or partition_problem(plan, shape))
    if layers is None:
        return None
    if layers == uniform_stages(plan.model.layers, plan.layout.pp):
        return dataclasses.replace(plan, stages=None)
    return dataclasses.replace(plan, stages=layers)



