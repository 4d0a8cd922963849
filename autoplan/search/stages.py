"""Uneven layer-to-stage splits for the search: the partition problem of a plan, built
from the cost model's own per-stage functions, a cheap bound on what any split can
reach, and the plan with its best split."""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_right

from autoplan.caches import memo
from autoplan.cost.bounds import (
    StageWork,
    cost_key,
    optimizer_seconds_floor,
    stage_memory,
    stage_work_for,
    step_overhead,
)
from autoplan.descriptors.pipeline_layout import Chunk, from_stage_lists, uniform_stages, with_mtp
from autoplan.descriptors.space import StageShape
from autoplan.plan import Memory, Plan
from autoplan.schedules.memory import peak_inflight
from autoplan.search.partition import PartitionProblem, best_partition


def _classes(p: int) -> list[int]:
    """One representative stage per cost class: first, a middle one, last."""
    return sorted({0, min(1, p - 1), p - 1})


def _class_of(s: int, p: int) -> int:
    return 0 if s == 0 else p - 1 if s == p - 1 else min(1, p - 1)


def _stage_fixed_times(plan: Plan) -> tuple[float, ...]:
    """Fixed seconds per stage, per microbatch, forward + backward, for the partitioner.

    Stage time is about linear in the layers a stage holds, so a layer's share is the
    difference between the stage with two layers and with one; the rest (embedding,
    logits, transfers) is the stage's fixed share. (The bounds use
    :func:`_fixed_floors`, valid where the time is not quite linear.)"""
    return _stage_fixed_times_of(cost_key(plan))


def _total(w: StageWork) -> float:
    return w.forward + w.backward


@memo(16384)
def _stage_fixed_times_of(key: Plan) -> tuple[float, ...]:
    p = key.layout.pp
    fixed: dict[int, float] = {}
    for c in _classes(p):
        one, two = stage_work_for(key, c, 1), stage_work_for(key, c, 2)
        fixed[c] = _total(one) - (_total(two) - _total(one))
    return tuple(fixed[_class_of(s, p)] for s in range(p))


def _mixed(plan: Plan) -> bool:
    """The model has both dense and MoE layers (a leading block of dense ones; a hybrid
    model's kinds are costed one by one: :func:`_kind_deltas`)."""
    return 0 < plan.model.moe_layers < plan.model.layers and not plan.model.is_hybrid


@memo(4096)
def _kind_deltas(key: Plan) -> tuple[tuple[float, float], ...]:
    """A hybrid model's (seconds, forward seconds) per microbatch that one more layer of
    each kind (``Model.kinds`` order) adds to a middle stage of its lightest kind."""
    mid = min(1, key.layout.pp - 1)
    one = stage_work_for(key, mid, 1)
    out = []
    for kind in key.model.kinds:
        two = stage_work_for(key, mid, 2, extra=kind)
        out.append((max(0.0, _total(two) - _total(one)), max(0.0, two.forward - one.forward)))
    return tuple(out)


def _layer_steps(key: Plan) -> tuple[float, float]:
    """(seconds, seconds of a dense layer) per microbatch, forward + backward, that one
    more layer adds to a middle stage, whose layers stand for every layer; the two are
    equal unless the model mixes dense and MoE layers (``key``: a cost key, see
    ``cost_key``)."""
    return _layer_deltas(key)[0]


@memo(16384)
def _layer_deltas(key: Plan) -> tuple[tuple[float, float], tuple[float, float]]:
    """:func:`_layer_steps`, then the same of the forward alone."""
    mid = min(1, key.layout.pp - 1)
    one, two = stage_work_for(key, mid, 1), stage_work_for(key, mid, 2)
    # never below zero: a mixed stage's first ZeRO-3 gather is the mean layer's
    # (``dp.zero3_exposed``), so a dense layer added to an MoE one can shorten it
    step, fwd = max(0.0, _total(two) - _total(one)), max(0.0, two.forward - one.forward)
    if not _mixed(key):
        return (step, step), (fwd, fwd)
    dense = stage_work_for(key, mid, 2, dense=1)
    return ((step, max(0.0, _total(dense) - _total(one))),
            (fwd, max(0.0, dense.forward - one.forward)))


def partition_problem(plan: Plan, shape: StageShape) -> PartitionProblem:
    """Per-layer and per-stage costs of ``plan``, for the partitioner. With vpp > 1 the
    problem is the layers each pipeline rank holds over all its chunks (its time and
    memory are the sum of its chunks', each chunk holding at least one layer); any such
    split is expressible (:func:`chunks_of`), whatever the launcher's ``shape``."""
    if plan.stages is not None or plan.chunks is not None:  # the split is what we solve for
        plan = dataclasses.replace(plan, stages=None, chunks=None)
    p, v, m, layers = plan.layout.pp, plan.layout.vpp, plan.num_microbatches, plan.model.layers
    stage_time = _stage_fixed_times(plan)
    inflight = tuple(peak_inflight(plan.schedule, p, m, v, s) for s in range(p))
    # memory is linear in the layers: per stage class and in-flight count, the stage
    # with one and with two layers give a layer's bytes (weights, grads and optimizer,
    # plus activations per in-flight microbatch-chunk) and the stage's fixed bytes
    one = {c: stage_work_for(plan, c, 1) for c in _classes(p)}
    two = {c: stage_work_for(plan, c, 2) for c in _classes(p)}
    a1 = {c: stage_memory(plan, c, one[c], 1) for c in _classes(p)}
    b1 = {c: stage_memory(plan, c, two[c], 1) for c in _classes(p)}
    mid = min(1, p - 1)
    layer_static = _states(b1[mid]) - _states(a1[mid])
    layer_act = b1[mid].activations - a1[mid].activations  # one layer, one in-flight chunk
    stage_static = []
    for s in range(p):
        c = _class_of(s, p)
        at = stage_memory(plan, c, one[c], inflight[s])  # the stage holding one layer
        per_layer = _states(b1[c]) - _states(a1[c]) + inflight[s] * (
            b1[c].activations - a1[c].activations)
        stage_static.append(at.peak - per_layer)
    step, dense_step = _layer_steps(cost_key(plan))
    times = [step] * layers
    statics, acts = [layer_static] * layers, [layer_act] * layers
    if _mixed(plan):  # the dense first layers: their own time and memory per layer
        d1 = stage_memory(plan, mid, stage_work_for(plan, mid, 2, dense=1), 1)
        for i in range(plan.model.layers - plan.model.moe_layers):
            times[i] = dense_step
            statics[i] = _states(d1) - _states(a1[mid])
            acts[i] = d1.activations - a1[mid].activations
    if plan.model.is_hybrid:  # each layer by its kind: the partitioner sees them
        model = plan.model
        deltas = dict(zip(model.kinds, _kind_deltas(cost_key(plan)), strict=True))
        mems = {kind: stage_memory(plan, mid, stage_work_for(plan, mid, 2, extra=kind), 1)
                for kind in model.kinds}
        for i in range(layers):
            kind = model.kind(i)
            times[i] = deltas[kind][0]
            statics[i] = _states(mems[kind]) - _states(a1[mid])
            acts[i] = mems[kind].activations - a1[mid].activations
    return PartitionProblem(
        layer_time=tuple(times), layer_static=tuple(statics),
        layer_activation=tuple(acts), stage_time=stage_time,
        stage_static=tuple(stage_static), inflight=inflight,
        capacity=plan.cluster.device.mem_bytes,
        shape=shape if v == 1 else StageShape.ANY, min_layers=v,
    )


def _states(mem: Memory) -> float:
    return mem.weights + mem.grads + mem.optimizer


def chunks_of(plan: Plan, per_stage: tuple[int, ...]) -> tuple[Chunk, ...]:
    """A per-chunk layout giving pipeline rank s ``per_stage[s]`` layers over its vpp
    chunks, as evenly as they divide. A rank's short chunks are the ones beside its fixed
    work: the first rank's first chunks (the embedding's), the last rank's last chunks
    (the loss's and MTP's), a middle rank's last, as NeMo's recipes place the embedding
    and loss in the layer count (``account_for_embedding/loss_in_pipeline_split``)."""
    v = plan.layout.vpp
    lists = []
    for s, total in enumerate(per_stage):
        base, extra = divmod(total, v)
        if s == 0:  # the embedding's chunk is the short one
            lists.append([base + (k >= v - extra) for k in range(v)])
        else:
            lists.append([base + (k < extra) for k in range(v)])
    return with_mtp(from_stage_lists(lists), plan.model.mtp_layers)


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
    """Most layers each stage can hold within its memory: the most x such that its x
    lightest layers fit (every run of x layers weighs at least those; a model mixing
    light dense and heavy MoE layers holds at most its dense ones light). -1 where not
    even an empty stage fits."""
    caps = []
    n = problem.n_layers
    # the layers by kind: (static bytes, activation bytes per in-flight chunk) -> count
    kinds: dict[tuple[float, float], int] = {}
    for static, act in zip(problem.layer_static, problem.layer_activation, strict=True):
        kinds[(static, act)] = kinds.get((static, act), 0) + 1
    for s in range(problem.n_stages):
        room = problem.capacity - problem.stage_static[s]
        if room < 0:
            caps.append(-1)
            continue
        f = problem.inflight[s]
        held = 0
        for per, count in sorted((static + f * act, k) for (static, act), k in kinds.items()):
            if per <= 0:
                held += count
                continue
            take = min(count, math.floor(room / per))
            held += take
            room -= take * per
            if take < count:
                break
        caps.append(min(n, held))
    return tuple(caps)


def split_bound(plan: Plan, works: tuple[StageWork, ...], fill: bool = True) -> float:
    """A step time no uneven split of ``plan`` beats (:func:`min_pipeline_time`), plus
    the optimizer step of a stage holding the mean parameters (``works``: of any split,
    for the parameters). ``fill=False`` bounds every schedule and vpp of the layout
    where ``plan`` is its 1F1B at vpp 1 (the fewest sends: the least fixed time per
    stage): the least bottleneck of equal layers, the cheaper kind's, in closed form;
    where the model mixes dense and MoE layers, that of its MoE layers alone (a stage's
    dense layers only add to it); the least a stage holds, a layer a chunk (vpp of
    them, MoE ones where the stages before it hold all the dense ones, as each holds as
    many); or the mean stage's time (the busiest stage runs at least the mean of the
    layers' seconds, each by its kind as :func:`min_pipeline_time` counts them, and the
    stages' fixed seconds, whatever the split): the most of these."""
    n, m = plan.model.layers, plan.num_microbatches
    if not fill:  # the cheaper layer kind's time: below every layer's; and the mean stage
        key = cost_key(plan)
        step, dense_step = _layer_steps(key)
        fixed = _fixed_floors(plan)
        dense = n - plan.model.moe_layers if _mixed(plan) else 0
        mean = (dense * dense_step + (n - dense) * step + math.fsum(fixed)) / len(fixed)
        v = plan.layout.vpp
        busiest = max(mean, min_bottleneck(min(step, dense_step), fixed, n),
                      # each chunk holds a layer: stage s at least v, past the dense ones
                      # where s v layers come before it
                      *(c + v * (step if s * v >= dense else min(step, dense_step))
                        for s, c in enumerate(fixed)))
        if dense:  # the MoE layers alone, whole, over the stages (the dense ones only add)
            busiest = max(busiest, min_bottleneck(step, fixed, n - dense))
        return _bound(plan, works, m * busiest)
    times, fills, first = _layer_costs(plan)
    return _bound(plan, works, min_pipeline_time(
        times, fills, _fixed_floors(plan), (n,) * plan.layout.pp, m, first, plan.layout.vpp))


def split_bound_with_memory(plan: Plan, problem: PartitionProblem,
                            works: tuple[StageWork, ...]) -> float | None:
    """:func:`split_bound` with each stage's memory cap taken into account; None when
    no split of equal layers fits (``works``: of any split, for the parameters)."""
    caps = layer_caps(problem)
    if min(caps) < problem.min_layers or sum(caps) < problem.n_layers:
        return None
    times, fills, first = _layer_costs(plan)
    return _bound(plan, works, min_pipeline_time(
        times, fills, _fixed_floors(plan), caps, plan.num_microbatches, first,
        problem.min_layers))


def _layer_costs(plan: Plan) -> tuple[tuple[float, ...], tuple[float, ...], int]:
    """(times, fills, first): per layer in model order, the seconds per microbatch it
    adds to its stage and to the fill of the stages after it, and the first stage
    whose fill counts.

    A stage's first chunk holds at least 1/vpp of its layers but on stage 0, whose
    short chunk holds the embedding (:func:`chunks_of`): its fill counts from stage 1
    at vpp > 1. The first chunk runs the forward and the fused backward; the forward
    only where the schedule runs W apart (its drain counts B alone; the fill alone
    still bounds)."""
    return _layer_costs_of(cost_key(plan))


@memo(16384)
def _layer_costs_of(key: Plan) -> tuple[tuple[float, ...], tuple[float, ...], int]:
    (step, dense_step), (fwd, dense_fwd) = _layer_deltas(key)
    v, n = key.layout.vpp, key.model.layers
    # a hybrid's layers are all its lightest kind's here (``stage_work_for``): the
    # kinds' own deltas are measured beside one light layer, and a stage's exposed
    # communication (TP behind W, EP behind compute) is not additive over kinds, so only
    # the lightest kind's is a bound below every stage (tests/unit/test_bounds.py)
    dense = n - key.model.moe_layers if _mixed(key) else 0
    times = (dense_step,) * dense + (step,) * (n - dense)
    # (``ScheduleSpec.drain_counts_w``: where W runs apart the drain counts B alone)
    fill, dense_fill = (step, dense_step) if key.schedule.spec.drain_counts_w else (fwd, dense_fwd)
    fills = (dense_fill / v,) * dense + (fill / v,) * (n - dense)
    return times, fills, int(v > 1)


def _fixed_floors(plan: Plan) -> tuple[float, ...]:
    """Per stage, fixed seconds per microbatch c_s with the stage's time at least
    c_s + t x for any x layers it can hold (t the middle stage's seconds per layer, as
    in :func:`_layer_costs`). A stage's time is not quite linear in its layers: ZeRO-3
    waits for its first layer's gather, the mean of the stage's (``dp.zero3_exposed``),
    so the embedding's or the logits' parameters weigh less the more layers they share
    the stage with. Time less t x is then least at one end: at one layer or at the
    most a stage can hold (the others keeping their minimum)."""
    return _fixed_floors_of(cost_key(plan))


@memo(16384)
def _fixed_floors_of(key: Plan) -> tuple[float, ...]:
    p, v, n = key.layout.pp, key.layout.vpp, key.model.layers
    most = max(1, n - (p - 1) * v)
    t = _layer_steps(key)[0]
    floor = {c: min(_total(stage_work_for(key, c, 1)) - t,
                    _total(stage_work_for(key, c, most)) - t * most) for c in _classes(p)}
    return tuple(floor[_class_of(s, p)] for s in range(p))


def min_pipeline_time(times: tuple[float, ...], fills: tuple[float, ...],
                      stage_time: tuple[float, ...], caps: tuple[int, ...], m: int,
                      first_fill: int = 0, min_layers: int = 1) -> float:
    """A lower bound on the least A such that some split of the layers into contiguous
    runs, stage s holding layers [e_s, e_{s+1}), at most caps[s] of them, has

        m (c_s + sum(times[e_s:e_{s+1}])) + sum(fills[e_{first_fill}:e_s]) <= A

    for every stage s: its busy time after the first microbatch's forward reached it
    (terms 1 and 2 of ``cost.bounds.step_time_lower_bound``; c_s its fixed seconds per
    microbatch, ``fills`` what a layer held before s adds to that fill).

    Given A, the greedy split that ends each stage in turn as late as it can places the
    most layers: moving a stage's start one layer later (+t of its time, +f <= t of
    fill) lets its end move by m t - f >= 0 of time, never earlier; with the caps, by
    induction the greedy's ends are at least any split's that meets A (each stage also
    ends early enough to leave the later ones their minimum layers, as every split
    does). An A whose greedy falls short of all layers is thus below the optimum, and
    bisection keeps only such an A as its answer. The bound relaxes the rest: a stage
    may hold fewer than the minimum, and one whose fixed time and fill exceed A alone
    is passed over, not failed (a later-ending greedy than a split's brings it more
    fill)."""
    n = len(times)
    prefix, fprefix = [0.0], [0.0]
    for t, f in zip(times, fills, strict=True):
        prefix.append(prefix[-1] + t)
        fprefix.append(fprefix[-1] + f)
    c = stage_time
    lo = max(m * (cs + min_layers * min(times)) for cs in c)
    if prefix[-1] <= 0:
        return lo

    p = len(c)

    def reaches(a: float) -> bool:
        end, fill = 0, 0.0
        for s, (cap, cs) in enumerate(zip(caps, c, strict=True)):
            room = (a - fill) / m - cs  # seconds of layers stage s can hold
            if room >= 0:  # ... leaving the later stages their minimum
                limit = min(n - (p - 1 - s) * min_layers, end + cap)
                last = bisect_right(prefix, prefix[end] + room + 1e-12, end, limit + 1) - 1
                if s >= first_fill:
                    fill += fprefix[last] - fprefix[end]
                end = last
                if end >= n:
                    return True
        return False

    if reaches(lo):
        return lo
    hi = m * (max(c) + prefix[-1]) + fprefix[-1]
    for _ in range(64):  # to 1e-3 of the answer: a bound need not be sharper
        if hi - lo <= 1e-3 * hi:
            break
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return lo


def _bound(plan: Plan, works: tuple[StageWork, ...], busy: float) -> float:
    return busy + optimizer_seconds_floor(plan, works) + step_overhead(plan)


@memo(4096)
def _best(problem: PartitionProblem) -> tuple[int, ...] | None:
    part = best_partition(problem)
    return None if part is None else part.layers


def with_best_stages(plan: Plan, shape: StageShape,
                     problem: PartitionProblem | None = None) -> Plan | None:
    """``plan`` with the split the partitioner picks for its schedule and memory (with
    vpp > 1, a per-chunk layout: :func:`chunks_of` the best layers per rank); None when
    no split the launcher can express fits in memory."""
    lay = plan.layout
    if shape is StageShape.UNIFORM or lay.pp == 1 or not plan.schedule.spec.looping:
        return plan
    layers = _best(problem or partition_problem(plan, shape))
    if layers is None:
        return None
    if lay.vpp > 1:
        chunks = chunks_of(plan, layers)
        if len({c.layers for c in chunks}) == 1:  # equal chunks: the uniform split
            return dataclasses.replace(plan, stages=None, chunks=None)
        return dataclasses.replace(plan, stages=None, chunks=chunks)
    if layers == uniform_stages(plan.model.layers, lay.pp):
        return dataclasses.replace(plan, stages=None)
    return dataclasses.replace(plan, stages=layers)



