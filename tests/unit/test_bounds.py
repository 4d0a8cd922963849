"""The search's lower bounds never exceed the step time ``evaluate`` predicts: over
candidates of every schedule, space and model family, with uniform splits, uneven
splits and per-chunk layouts. A bound above the true time would prune a better plan."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan import caches
from autoplan.cost.bounds import (
    busiest_stage_bound,
    chain_bound,
    optimizer_seconds,
    optimizer_seconds_floor,
    split_chain_floor,
    stage_work,
    step_overhead,
    step_time_lower_bound,
)
from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.space import StageShape, load_space
from autoplan.parallel import dp, mesh
from autoplan.parallel.dp import (
    _exposed,
    _stage_sync,
    _sync_seconds,
    grad_sync_after,
    grad_sync_after_least,
    grad_sync_bound,
    grad_sync_drained_least,
    grad_sync_floor,
    grad_sync_least,
    zero_stages,
)
from autoplan.schedules import Schedule
from autoplan.search.engine import _Search, candidate_plans
from autoplan.search.items import Candidate as _Candidate
from autoplan.search.layout_floor import _uniform_chain
from autoplan.search.stages import (
    partition_problem,
    split_bound,
    split_bound_with_memory,
    with_best_stages,
)
from autoplan.vocab import Axis, Offload, ZeroStage
from tests.helpers import make_plan

TIGHT = 1 + 1e-9  # a bound and a simulated time of a tie may differ in the last bits

# (model, cluster, GPUs, global batch, sequence, space, every k-th candidate)
CASES = [
    ("llama3-8b", "dgx-h100", 16, 64, 4096, "default", 13),  # every schedule
    ("gpt3-175b", "dgx-a100", 256, 512, 2048, "default", 890),
    # (the launchers' spaces grew: hybrid shards, schedules from CSV, BFPP; their strides
    # too; and by the module sets and EP overlap, issue 48)
    ("mixtral-8x7b", "dgx-h100", 32, 128, 4096, "megatron", 295),  # MoE, per-chunk splits
    ("llama3-70b", "dgx-h100", 64, 128, 8192, "torchtitan", 101),  # any split, chunks
    ("nemotron-4-15b", "dgx-h100", 32, 128, 4096, "megatron", 149),  # large vocabulary
    # MLA, dense first, MTP; module sets and EP overlap (issue 48: twice the candidates)
    ("deepseek-v3-mini", "dgx-h100", 32, 256, 4096, "megatron", 50),
    ("llama3-8b", "dgx-h100", 16, 64, 4096, "deepspeed", 3),
    ("llama3-8b", "dgx-h100", 16, 64, 4096, "fsdp", 1),
    # hybrids (issue 51): layers of different kinds, bounds on the lightest kind
    ("qwen3-next-mini", "dgx-h100", 32, 128, 16384, "megatron", 389),  # GDN + gated attention
    ("nemotron-h-mini", "dgx-h100", 16, 64, 8192, "megatron", 157),  # Mamba, MLP-only layers
]
HYBRID = CASES[-2:]


def _model(name):
    if name == "qwen3-next-mini":  # 8 layers: GDN x3 then gated full attention, twice
        return dataclasses.replace(resolve_model("qwen3-next-80b-a3b"), layers=8,
                                   mixers="GGGAGGGA", experts=64)
    if name == "nemotron-h-mini":  # Mamba / MLP / attention blocks, a 10-layer slice
        return dataclasses.replace(resolve_model("nemotron-h-56b"), layers=10,
                                   mixers="M.M.MA.M..", mlps=".-.-..-.--")
    if name != "deepseek-v3-mini":
        return resolve_model(name)
    # DeepSeek-V3's MLA, 256+1 experts, dense first layer and MTP, in 6 layers
    return dataclasses.replace(resolve_model("deepseek-v3"), layers=6, dense_layers=1)


def _every_group(walk, every):
    """Every ``every``-th group of the walk's bundles, opened (``Enumeration.unbundled``),
    without their layout bound: the bounds asked of them are worked out for these alone."""
    groups = (g for bundle in walk.walk.groups() for g in walk.walk.unbundled(bundle))
    return itertools.islice(groups, 0, None, every)


def _sample(name, cluster, gpus, gbs, seq, space_name, every):
    space = load_space(space_name)
    model, c = _model(name), with_gpus(resolve_cluster(cluster), gpus)
    plans = candidate_plans(model, c, Job(global_batch=gbs, seq_len=seq), space)
    for i, plan in enumerate(itertools.islice(plans, 0, None, every)):
        split = space.stage_shape is not StageShape.UNIFORM and plan.layout.pp > 1
        if split and (plan.chunks is not None or i % 2):
            plan = with_best_stages(plan, space.stage_shape)  # uneven stages or chunks
            if plan is None:
                continue
        yield space, plan


@functools.cache
def _samples(case):
    """``_sample(*case)``, walked once per case in a process: the step-time and split tests
    take the same sample, and walking every candidate to keep every k-th is half or more
    of their time (with the collector paused, as the search walks them)."""
    with caches.collector_paused():
        return tuple(_sample(*case))


@pytest.mark.slow  # more than about 3 s on 2 cores
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[5]}" for c in CASES])
def test_the_step_time_bound_never_exceeds_the_evaluated_step(case):
    seen: set[Schedule] = set()
    for _, plan in _samples(case):
        bound = step_time_lower_bound(plan, stage_work(plan))
        step = evaluate(plan).step_time_s
        assert bound <= step * TIGHT, (plan, bound, step)
        chain = chain_bound(plan, stage_work(plan))
        assert chain <= step * TIGHT, (plan, chain, step)
        seen.add(plan.schedule)
    if case[5] == "default" and case[0] == "llama3-8b":
        assert seen == set(load_space("default").schedules)  # every schedule of the space


@pytest.mark.slow  # more than about 3 s on 2 cores
@pytest.mark.parametrize("case", CASES[2:6] + HYBRID, ids=[f"{c[0]}-{c[5]}" for c in CASES[2:6] + HYBRID])
def test_the_split_bounds_never_exceed_the_partitioned_plans_step(case):
    for space, plan in _samples(case):
        if plan.layout.pp == 1 or plan.schedule.v_shape:
            continue
        uniform = dataclasses.replace(plan, stages=None, chunks=None)
        best = with_best_stages(uniform, space.stage_shape)
        if best is None:
            continue
        step = evaluate(best).step_time_s
        assert split_bound(uniform, stage_work(uniform)) <= step * TIGHT
        # without the fill, at its own chunks (``TimeBounds.split_floor``; a group's at its
        # members' fewest): the busiest stage's granularity, a layer a chunk, the mean
        assert split_bound(uniform, stage_work(uniform), fill=False) <= step * TIGHT
        with_memory = split_bound_with_memory(uniform, partition_problem(uniform, space.stage_shape),
                                              stage_work(uniform))
        assert with_memory is not None and with_memory <= step * TIGHT


def test_the_busiest_stage_bound_holds_for_every_schedule_of_a_layout():
    for sched in Schedule:
        vpp = 2 if sched.v_shape or sched is Schedule.INTERLEAVED else 1
        plan = make_plan(model="llama3-8b", gpus=16, dp=2, tp=2, pp=4, global_batch=64,
                         schedule=sched, vpp=vpp)
        base = dataclasses.replace(plan, schedule=Schedule.ONE_F_ONE_B,
                                   layout=dataclasses.replace(plan.layout, vpp=1))
        step = evaluate(plan).step_time_s
        for v in range(1, vpp + 1):  # the fill and drain of vpp chunks bound fewer too
            placed = (dataclasses.replace(base, schedule=Schedule.ZB_V, layout=plan.layout)
                      if sched.v_shape else base)  # a V's output layer is on stage 0
            bound = busiest_stage_bound(placed, stage_work(placed), vpp=v)
            assert bound <= step * TIGHT, (sched, v)
            if not sched.splits_backward and v == vpp:  # its drain is the whole backward
                fused = busiest_stage_bound(placed, stage_work(placed), vpp=v, fused=True)
                assert bound < fused <= step * TIGHT, (sched, v)


def test_zero_bubble_drains_only_the_input_gradients():
    """Qi et al. 2024: the W passes fill the drain. With the fused backward as drain
    the bound of GPT-3 175B's ZB-H1 plan was 30% above its step (issue 13)."""
    plan = make_plan(model="gpt3-175b", cluster="dgx-a100", gpus=1024, dp=16, tp=8, pp=8,
                     global_batch=1536, seq_len=2048, schedule=Schedule.ZB_H1,
                     sequence_parallel=True)
    works = stage_work(plan)
    m, p = plan.num_microbatches, plan.layout.pp
    step = evaluate(plan).step_time_s
    bound = step_time_lower_bound(plan, works)
    assert bound <= step * TIGHT
    # the fused-drain bound of stage p - 1, what the old bound charged, is above the step
    fused = (sum(w.forward + w.backward for w in works[:-1])
             + m * (works[-1].forward + works[-1].backward))
    assert fused > step > bound
    assert p == 8


def test_the_bound_is_the_closed_form_of_1f1b_on_equal_stages():
    """(m + p - 1)(f + b) for 1F1B with equal stages (Narayanan et al. 2021, Sec. 2.2),
    here with every stage's work the middle stage's, plus the terms after the pipeline."""
    plan = make_plan(model="llama3-8b", gpus=16, dp=2, tp=2, pp=4, global_batch=64)
    mid = stage_work(plan)[1]
    equal = (mid,) * 4
    m = plan.num_microbatches
    after = (optimizer_seconds(plan, equal) + step_overhead(plan)
             + grad_sync_bound(plan, mesh.groups(plan), equal))
    assert step_time_lower_bound(plan, equal) == pytest.approx(
        (m + 3) * (mid.forward + mid.backward) + after, rel=1e-12)


def test_where_stage_0_ends_a_1f1b_step_its_undrained_sync_makes_the_bound_the_step():
    """1F1B on a pipeline whose stage 0 ends the step (its last backward is the gradient
    chain's end): that stage's reduction has no drain to hide behind, so the makespan and
    the sync together (``dp.grad_sync_after``) are the simulated step's, which the
    sync alone, without the stages' ends (the heaviest stage's floor or the lightest's
    undrained sync), fell short of."""
    plan = make_plan(model="llama3-8b", gpus=256, dp=64, pp=4, global_batch=512,
                     zero=ZeroStage.NONE)
    works, groups = stage_work(plan), mesh.groups(plan)
    pred = evaluate(plan)
    rest = optimizer_seconds(plan, works) + step_overhead(plan)
    # by hand: the fused chain of each stage (fill, its m passes, the drain to stage 0)
    m, f, b = plan.num_microbatches, [w.forward for w in works], [w.backward for w in works]
    makespan = max(sum(f[:s]) + m * (f[s] + b[s]) + sum(b[:s]) for s in range(4))
    assert makespan == pytest.approx(pred.step_time_s - rest - pred.breakdown.dp_comm, rel=1e-12)
    undrained = _stage_sync(plan, groups, works[0], 0.0)
    assert pred.breakdown.dp_comm == pytest.approx(undrained, rel=1e-12)
    bound = step_time_lower_bound(plan, works)
    assert bound == pytest.approx(makespan + undrained + rest, rel=1e-12)
    assert bound == pytest.approx(pred.step_time_s, rel=1e-12)
    assert makespan + grad_sync_bound(plan, groups, works) + rest < 0.99 * bound


@settings(max_examples=40, deadline=None)
@given(stretch=st.floats(1.0, 3.0), slack=st.lists(st.floats(0.0, 2.0), min_size=4, max_size=4),
       share=st.floats(0.0, 1.0))
def test_the_sync_after_the_stages_ends_holds_for_every_later_makespan_and_ends(stretch, slack,
                                                                               share):
    """``dp.grad_sync_after`` of a makespan floor and each stage's least end is at most the
    makespan plus the exposed sync of every pipeline past them: any makespan T at least the
    floor, each stage ending at f_s between its least end and T (its drain T - f_s)."""
    plan = make_plan(model="llama3-8b", gpus=256, dp=64, pp=4, global_batch=512,
                     zero=ZeroStage.OPTIMIZER)
    works, groups = stage_work(plan), mesh.groups(plan)
    floor = 4 * max(w.forward + w.backward for w in works)
    ends = [floor * (0.5 + 0.5 * share) * (1 + i % 2) / 2 for i in range(4)]
    bound = grad_sync_after(plan, groups, works, floor, ends)
    assert bound >= floor
    makespan = max(floor, *ends) * stretch
    finish = [min(makespan, e + x * floor) for e, x in zip(ends, slack, strict=True)]
    finish[slack.index(max(slack))] = makespan  # one stage ends the step
    exposed = max(_stage_sync(plan, groups, w, makespan - f)
                  for w, f in zip(works, finish, strict=True))
    assert bound <= (makespan + exposed) * TIGHT


@settings(max_examples=50, deadline=None)
@given(backward=st.floats(0.0, 2.0), longer=st.floats(0.0, 2.0), later=st.floats(0.0, 2.0),
       behind=st.floats(0.0, 2.0), ahead=st.floats(0.0, 2.0), slow=st.floats(0.0, 1.0),
       overlap=st.booleans(), gather=st.booleans(), known=st.booleans())
def test_the_least_sync_after_a_stages_end_holds_for_every_longer_backward_and_later_end(
        backward, longer, later, behind, ahead, slow, overlap, gather, known):
    """``dp.grad_sync_after_least`` of a stage's floors (its backward per chunk, its end,
    the makespan) is at most the makespan plus that stage's exposed sync of every plan past
    them: a backward at least the floor, a makespan T at least the floor and the stage's
    end f, the stage ending at f at least its floor, its drain T - f; with the reduction
    and the gather overlapped or not, at every slowdown of compute beside them."""
    base = make_plan(model="llama3-8b", gpus=256, dp=64, pp=4, global_batch=512,
                     zero=ZeroStage.OPTIMIZER)
    plan = dataclasses.replace(base, stack=dataclasses.replace(
        base.stack, overlap_grad_reduce=overlap, overlap_param_gather=gather,
        comm_compute_slowdown=slow))
    works, groups = stage_work(plan), mesh.groups(plan)
    w = works[1]
    r, g = _sync_seconds(plan.zero, plan.job.dtype, w.params, w.expert_params,
                         groups[Axis.DP], groups[Axis.EDP])
    scale = r + g  # the times drawn are multiples of the sync, where it matters
    floor_b, end, makespan = backward * scale, behind * scale, ahead * scale
    forward = w.forward if known else None
    bound = grad_sync_after_least(plan, groups, w.params, w.expert_params, floor_b, forward,
                                  makespan, end)
    finish = end + later * scale
    t = max(makespan, finish) + ahead * scale * later
    exposed = _exposed(plan, groups, w.params, w.expert_params, floor_b + longer * scale,
                       t - finish, w.forward if known else w.forward * (1 + longer))
    assert bound <= (t + exposed) * TIGHT + 1e-15


def test_the_step_time_bound_holds_on_stacks_that_overlap_less():
    """The bound's sync terms read the stack's overlap of the reduction and the gather and
    the slowdown of compute beside them: it holds with each off, and at the slowdown's
    ends (none; the compute stalled throughout)."""
    stacks = [dict(overlap_grad_reduce=False), dict(overlap_param_gather=False),
              dict(comm_compute_slowdown=0.0), dict(comm_compute_slowdown=1.0)]
    checked = 0
    # every 88th of Llama 3 8B's candidates (every schedule); 30 of DeepSeek's first (MoE)
    for case, stride, first in ((CASES[0], 8, None), (MOE_UNIFORM, 2, 30)):
        for _, plan in itertools.islice(_sample(*case[:6], case[6] * stride), first):
            for change in stacks:
                each = dataclasses.replace(plan, stack=dataclasses.replace(plan.stack, **change))
                bound = step_time_lower_bound(each, stage_work(each))
                assert bound <= evaluate(each).step_time_s * TIGHT, (each, change)
                checked += 1
    assert checked >= 100


def test_the_optimizer_floor_is_the_step_of_a_rank_holding_the_mean_state():
    """Any split's fullest stage holds at least the mean of the stages' parameters."""
    kw = dict(model="llama3-8b", gpus=8, dp=2, pp=4, global_batch=32)
    uniform = make_plan(**kw)  # 32 layers: 8 a stage, the embedding and logits apart
    floor = optimizer_seconds_floor(uniform, stage_work(uniform))
    for stages in [(8, 8, 8, 8), (9, 9, 9, 5), (5, 9, 9, 9), (2, 10, 10, 10)]:
        split = make_plan(stages=stages, **kw)
        assert floor <= optimizer_seconds(split, stage_work(split)) * TIGHT
    works = stage_work(uniform)
    total = sum(w.params for w in works) / uniform.layout.dp  # ZeRO-1 shards over dp
    per_param = optimizer_seconds(uniform, works) / max(w.params / 2 for w in works)
    assert floor == pytest.approx(total / 4 * per_param, rel=1e-12)


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[5]], ids=lambda c: f"{c[0]}-{c[5]}")
def test_an_unopened_layouts_bound_holds_for_every_group_it_opens_into(case):
    """A layout enters the queue unopened, at the least mean-work floor over its micro-batches
    and sequence parallelism (search.layout_floor.LayoutFloors.layout_mean_floor, worked out per
    shard): no group it opens into may enter below it, so a layout left unopened holds no
    plan the search needed."""
    name, cluster, gpus, gbs, seq, space_name, _ = case
    walk = _Search(_model(name), with_gpus(resolve_cluster(cluster), gpus),
                   Job(global_batch=gbs, seq_len=seq), load_space(space_name), top_k=1)
    opened = 0
    for item in walk.walk.unopened():
        groups = list(walk.walk.opened(item))
        assert item.size >= sum(g.size for g in groups)
        for group in groups:
            assert item.bound <= group.bound * TIGHT, (item.base, group.plan)
            for each in walk.walk.unbundled(group):
                assert item.bound <= each.bound * TIGHT
        opened += bool(groups)
    assert opened >= 10


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[5]], ids=lambda c: f"{c[0]}-{c[5]}")
def test_a_blocks_bound_holds_for_every_layout_in_it(case):
    """Layouts enter the queue in blocks of one shard (tp, cp, ep, etp), at the least mean
    work of any pipeline degree (search.layout_floor.LayoutFloors.block_floor): it is the mean
    term of each layout's own bound (m / pp is the same for all, by hand below), so no
    layout of the block enters below it, and the block counts every candidate of its
    layouts."""
    name, cluster, gpus, gbs, seq, space_name, _ = case
    walk = _Search(_model(name), with_gpus(resolve_cluster(cluster), gpus),
                   Job(global_batch=gbs, seq_len=seq), load_space(space_name), top_k=1)
    blocks = walk.walk.blocks()
    assert walk.stats.generated == sum(b.size for b in blocks)
    least = walk.ctx.least
    for block in blocks:
        shard = {(lay.tp, lay.cp, lay.ep, lay.etp) for lay, _ in block.layouts}
        assert len(shard) == 1
        for lay, (scheds, _, sps, cps, _, per_mbs) in block.layouts:
            assert per_mbs * len(walk.space.micro_batches) <= block.size
            if sps:
                own = walk.bounds.floors.layout_mean_floor(lay, sps, cps, least, scheds)
                assert block.bound <= own * TIGHT, (lay, block.bound, own)
        for item in walk.walk.unblocked(block):
            assert item.bound >= block.bound
    # m / pp: dp = N / (tp pp cp) and m = B / (dp b), whatever pp
    n, batch = gpus, gbs
    for pp_ in (1, 2, 4):
        tp_, cp_, b = 2, 1, 1
        if n % (tp_ * pp_ * cp_) == 0:
            dp_ = n // (tp_ * pp_ * cp_)
            if batch % (dp_ * b) == 0:
                assert (batch // (dp_ * b)) / pp_ == pytest.approx(batch * tp_ * cp_ / (n * b))


def test_a_blocks_fill_holds_for_every_layout_that_runs():
    """DeepSeek-V3 (61 layers: no interleaving, no V below 62 stages) on 262,144 H100: at
    each micro-batch a block's layouts run with flat one-chunk schedules alone, the block
    counts the fill any split pays at its least pipeline degree (search.layout_floor.
    LayoutFloors.block_floor), which grows with the degree at m / pp fixed: it holds for each layout's
    own bound (every micro-batch it runs), and it lifts some blocks above the mean."""
    model = resolve_model("deepseek-v3")
    walk = _Search(model, with_gpus(resolve_cluster("dgx-h100"), 262144),
                   Job(global_batch=15360, seq_len=4096), load_space("default"), top_k=1)
    least = walk.ctx.least
    lifted = 0
    for block in walk.walk.blocks():
        base, (_, _, sps, cps, _, _) = block.layouts[0]
        mean = walk.bounds.floors.block_floor(base, sps or (False,), cps, least)  # no layouts: mean
        assert block.bound >= mean
        lifted += block.bound > mean * 1.2
        for item in walk.walk.unblocked(block):  # the layouts passing the layout rules
            _, (scheds, _, sps, cps, _, _) = next(x for x in block.layouts if x[0] == item.base)
            own = walk.bounds.floors.layout_mean_floor(item.base, sps, cps, least, scheds)
            assert block.bound <= own * TIGHT, (item.base, block.bound, own)
    assert lifted >= 50
    # the fill at m = c p grows with p (c = 0.5, share 1 and 0.4)
    for share in (1.0, 0.4):
        floors = [split_chain_floor(1.0, share, 0.5 * p, p) for p in (2, 4, 8, 16, 32, 64)]
        assert floors == sorted(floors)


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[5]], ids=lambda c: f"{c[0]}-{c[5]}")
def test_a_layouts_shared_bound_holds_for_its_every_zero_and_recompute_group(case):
    """A bundle comes up at its layout's bound at its least recompute, and each of its
    groups at its own recompute's (search.bound.TimeBounds._layout_bound, for ZeRO-3 or every stage
    below, shifted by their offload), computing its own only then: neither may exceed
    the group's own bound. (The compute floor they enter the queue at may: it is held to
    the members' steps in ``test_a_layouts_compute_floor_never_exceeds_a_members_step``.)"""
    name, cluster, gpus, gbs, seq, space_name, every = case
    walk = _Search(_model(name), with_gpus(resolve_cluster(cluster), gpus),
                   Job(global_batch=gbs, seq_len=seq), load_space(space_name), top_k=1)
    seen = set()
    # every bundle, but for the largest cases' (every other of DeepSeek's, its module sets
    # and EP overlap bundles among them)
    for bundle in itertools.islice(walk.walk.groups(), 0, None, 1 + (every > 30)):
        for group in walk.walk.unbundled(walk.bounds.fully_laid(bundle)):
            group = walk.bounds.fully_laid(group)
            own = walk.bounds.group_bound(group.plan, group.runnable, group.cp_comms)
            plan = group.plan
            below = max((z for z in zero_stages(plan.layout, walk.space) if z < 3), default=0)
            stand_ins = ([below] if plan.zero < 3
                         else [ZeroStage.PARAMETERS] + ([below] if below >= 1 else []))
            # at its recompute, and at its bundle's least (``TimeBounds.bound_choice``: an EP
            # overlap bundle reads no shared bound, search.bound.TimeBounds.with_layout_bound)
            ofs = [group] + ([] if plan.ep_overlap else [dataclasses.replace(
                group, recomputes=bundle.recomputes)])
            for zero in stand_ins:  # every stand-in it may be bounded by
                for of in ofs:
                    shared = walk.bounds.shared_layout_bound(of, zero)
                    assert walk.bounds.offloaded(shared, plan) <= own * TIGHT, (plan, zero)
            seen.add((plan.recompute, plan.zero))
    assert len(seen) >= 6  # every recompute with two ZeRO stages at least


@pytest.mark.parametrize("schedule", list(Schedule))
def test_the_critical_chain_is_the_makespan_of_equal_stages(schedule):
    """With the durations it was found at, the chain is the simulated critical path;
    with others it is one dependency chain, so at most the makespan."""
    from autoplan.schedules.simulator import critical_chain, simulate_exact

    v = 2 if schedule.v_shape or schedule is Schedule.INTERLEAVED else 1
    p, m = 4, 8
    chain = critical_chain(schedule, p, m, v)
    ones = (1.0,) * p
    assert chain.length(ones, ones, ones) == simulate_exact(schedule, ones, ones, ones, m, v).makespan
    uneven = (1.0, 1.3, 0.7, 2.0), (2.0, 1.1, 1.9, 2.5), (0.5, 1.0, 0.9, 1.6)
    assert chain.length(*uneven) <= simulate_exact(schedule, *uneven, m, v).makespan * TIGHT
    # every virtual stage runs on the stage the schedule places it
    assert sorted(set(chain.home)) == list(range(p))


@pytest.mark.slow  # more than about 3 s on 2 cores
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[5], CASES[7]],
                         ids=lambda c: f"{c[0]}-{c[5]}")
def test_a_groups_memory_floor_never_exceeds_a_members_peak(case):
    """A group whose floor exceeds the device is dropped whole, and the floor's
    allocator pressure raises the bound of every member (search.floors.MemoryFloors.memory_floor):
    it must not exceed the peak ``evaluate`` finds for any member, and it is that peak
    where the member holding the least is the fullest (a lone 1F1B member, pp = 1)."""
    name, cluster, gpus, gbs, seq, space_name, every = case
    walk = _Search(_model(name), with_gpus(resolve_cluster(cluster), gpus),
                   Job(global_batch=gbs, seq_len=seq), load_space(space_name), top_k=1)
    checked = exact = 0
    for group in _every_group(walk, every):
        floor = walk.floors.memory_floor(group)
        if floor is None:
            continue
        peaks = [evaluate(plan).memory.peak for plan, _ in walk.walk.schedule_plans(group)]
        if not peaks:
            continue
        assert floor.peak <= min(peaks) * TIGHT, group.plan
        checked += 1
        exact += floor.peak == pytest.approx(min(peaks), rel=1e-12)
    assert checked >= 10
    assert exact >= 1


@pytest.mark.slow  # more than about 3 s on 2 cores
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[5], CASES[6]],
                         ids=lambda c: f"{c[0]}-{c[5]}")
def test_a_groups_bounds_never_exceed_a_members_step(case):
    """A group's own bound (with the gradient sync no drain hides) and the bound each
    candidate enters the queue with when the group is expanded hold for every member:
    every schedule, chunk count and context-parallel exchange of the group."""
    name, cluster, gpus, gbs, seq, space_name, every = case
    walk = _Search(_model(name), with_gpus(resolve_cluster(cluster), gpus),
                   Job(global_batch=gbs, seq_len=seq), load_space(space_name), top_k=1)
    checked = 0
    for group in _every_group(walk, every):
        own = walk.bounds.group_bound(group.plan, group.runnable, group.cp_comms)
        group = dataclasses.replace(group, bound=own, unpressured_bound=own, exact=True, memory_floored=True)
        steps = {plan: evaluate(plan).step_time_s
                 for plan, split in walk.walk.schedule_plans(group) if not split}
        for plan, step in steps.items():
            assert own <= step * TIGHT, plan
        for cand in walk.frontier.expand(group):  # no threshold yet: nothing is pruned
            if isinstance(cand, _Candidate):
                assert cand.bound <= steps[cand.plan] * TIGHT, cand.plan
                checked += 1
    assert checked >= 20


@pytest.mark.slow  # more than about 3 s on 2 cores
@pytest.mark.parametrize("case", [CASES[0], CASES[5]], ids=lambda c: f"{c[0]}-{c[5]}")
def test_a_bundles_synced_bound_never_exceeds_a_members_step(case):
    """A bundle below ZeRO-3 has its layout bound counted at its least recompute's group bound with the
    gradient sync but not the drained one (search.bound.TimeBounds.bundle_bound): it holds
    for every member of every recompute it stands for, and it is at most the own bound
    of its first group (which counts the drained sync too)."""
    name, cluster, gpus, gbs, seq, space_name, every = case
    walk = _Search(_model(name), with_gpus(resolve_cluster(cluster), gpus),
                   Job(global_batch=gbs, seq_len=seq), load_space(space_name), top_k=1)
    checked = 0
    # (an EP overlap bundle's layout bound is not counted at its least recompute:
    # search.bound.TimeBounds.with_layout_bound)
    bundles = [b for b in walk.walk.groups()
               if b.recomputes and b.plan.zero < 3 and not b.plan.ep_overlap]
    for bundle in bundles[::max(1, every // 2)]:
        bound = walk.bounds.offloaded(walk.bounds.bundle_bound(bundle), bundle.plan)
        groups = walk.walk.unbundled(bundle)
        first = groups[0]
        assert bound <= walk.bounds.group_bound(first.plan, first.runnable,
                                                first.cp_comms) * TIGHT
        for group in groups:
            for plan, split in walk.walk.schedule_plans(group):
                if not split:
                    assert bound <= evaluate(plan).step_time_s * TIGHT, plan
                    checked += 1
    assert checked >= 20


@pytest.mark.parametrize("kind", ["dense", "moe", "offload", "zb"])
def test_zero_2_runs_zero_1s_step_its_bounds_are_memoized_on(kind):
    """ZeRO-2 differs from ZeRO-1 in memory alone (dp.time_twin): the evaluated step and
    every step-time bound of the search are the same, so the search's memos of group and
    exact bounds key on ZeRO-1 for both; the memory is not."""
    args: dict = dict(model="llama3-8b", gpus=64, dp=8, tp=2, pp=4, global_batch=128)
    if kind == "moe":
        args = dict(model="mixtral-8x7b", gpus=64, dp=8, tp=2, pp=4, ep=4, etp=1,
                    global_batch=128, sequence_parallel=True)
    if kind == "offload":
        args["offload"] = Offload(optimizer=True, activations=0.5)
    if kind == "zb":
        args["schedule"] = Schedule.ZB_H1
    one, two = (make_plan(zero=z, **args) for z in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS))
    assert dp.time_twin(ZeroStage.GRADIENTS) is ZeroStage.OPTIMIZER
    assert all(dp.time_twin(z) is z for z in ZeroStage if z is not ZeroStage.GRADIENTS)
    a, b = evaluate(one), evaluate(two)
    assert a.step_time_s == b.step_time_s
    assert a.memory.peak > b.memory.peak  # ZeRO-2 shards the gradients too
    assert step_time_lower_bound(one, stage_work(one)) == step_time_lower_bound(two, stage_work(two))
    walk = _Search(one.model, one.cluster, one.job, load_space("default"), top_k=1)
    scheds = ((one.schedule, 1, False),)
    for sync in (True, False):
        assert (walk.bounds._group_bound(one, scheds, (one.cp_comm,), sync)
                == walk.bounds._group_bound(two, scheds, (two.cp_comm,), sync))


def test_the_least_sync_is_the_floor_where_the_forward_is_known():
    """dp.grad_sync_least at one chunk with the stage's own forward is grad_sync_floor;
    with the forward unknown the overlapped gather counts only its slowed share."""
    plan = make_plan(model="llama3-8b", gpus=16, dp=4, tp=2, pp=2, global_batch=64,
                     zero=ZeroStage.OPTIMIZER)
    works, groups = stage_work(plan), mesh.groups(plan)
    heavy = max(works, key=lambda w: w.params)
    floor = grad_sync_floor(plan, groups, works)
    assert floor > 0
    assert grad_sync_least(plan, groups, heavy.params, 0.0, heavy.backward, heavy.forward,
                           1) == pytest.approx(floor, rel=1e-12)
    reduce_s, gather_s = _sync_seconds(plan.zero, plan.job.dtype, heavy.params, 0.0,
                                       groups[Axis.DP], groups[Axis.EDP])
    slow = plan.stack.comm_compute_slowdown
    assert grad_sync_least(plan, groups, heavy.params, 0.0, heavy.backward, None, 4) == (
        pytest.approx(slow * min(reduce_s, heavy.backward / 4) + slow * gather_s, rel=1e-12))
    assert grad_sync_least(plan, groups, heavy.params, 0.0, heavy.backward, None, 4) <= floor


def test_the_sync_bound_charges_the_drainless_stage_where_the_reduction_outlasts_the_backward():
    """The stage that ends the step has no drain: of a reduction r longer than its last
    backward b (per chunk), r - b stays exposed and slow * b overlaps (Megatron-LM
    --overlap-grad-reduce), which no drain can hide; ``grad_sync_bound`` charges the least
    of that over stages, here by hand, and never more than the evaluated exposure."""
    plan = make_plan(model="llama3-8b", gpus=64, dp=16, tp=2, pp=2, global_batch=64,
                     seq_len=1024, zero=ZeroStage.OPTIMIZER)
    works, groups = stage_work(plan), mesh.groups(plan)
    slow = plan.stack.comm_compute_slowdown
    drainless = []
    for w in works:
        r, g = _sync_seconds(plan.zero, plan.job.dtype, w.params, w.expert_params,
                             groups[Axis.DP], groups[Axis.EDP])
        assert r > w.backward  # the case this bound is for
        gather = max(0.0, g - w.forward) + slow * min(g, w.forward)
        drainless.append(r - w.backward + slow * w.backward + gather)
    bound = grad_sync_bound(plan, groups, works)
    assert bound == pytest.approx(min(drainless), rel=1e-12)
    assert bound > grad_sync_floor(plan, groups, works)
    sim_step = evaluate(plan)
    exposed = sim_step.breakdown.dp_comm  # no ZeRO-3 gathers: all of it is the sync
    assert bound <= exposed * TIGHT


def test_the_drained_sync_bound_is_the_least_stage_at_its_longest_backward():
    """dp.grad_sync_drained_least by hand: per stage, with no drain, the reduction r
    beyond a backward per chunk x stays exposed and slow * min(r, x) overlaps; the gather
    counts at least its slowed share; the least over stages. A longer backward exposes
    less (so a bound read at the longest holds for shorter ones)."""
    plan = make_plan(model="llama3-8b", gpus=64, dp=16, tp=2, pp=2, global_batch=64,
                     seq_len=1024, zero=ZeroStage.OPTIMIZER)
    works, groups = stage_work(plan), mesh.groups(plan)
    slow = plan.stack.comm_compute_slowdown
    stages = [(w.params, w.expert_params, w.backward * 1.5) for w in works]
    by_hand = []
    for params, expert, x in stages:
        r, g = _sync_seconds(plan.zero, plan.job.dtype, params, expert, groups[Axis.DP],
                             groups[Axis.EDP])
        by_hand.append(max(0.0, r - x) + slow * min(r, x) + slow * g)
    assert grad_sync_drained_least(plan, groups, stages) == pytest.approx(min(by_hand), rel=1e-12)
    shorter = [(p, e, x / 2) for p, e, x in stages]
    assert grad_sync_drained_least(plan, groups, shorter) >= grad_sync_drained_least(
        plan, groups, stages)
    assert grad_sync_drained_least(plan, groups, [(w.params, w.expert_params, w.backward)
                                                  for w in works]) <= grad_sync_bound(
        plan, groups, works) * TIGHT


# the fill counts only where every schedule runs uniform stages: the default space's
MOE_UNIFORM = ("deepseek-v3-mini", "dgx-h100", 32, 256, 4096, "default", 49)


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[5], MOE_UNIFORM],
                         ids=lambda c: f"{c[0]}-{c[5]}")
def test_a_layouts_compute_floor_never_exceeds_a_members_step(case):
    """Groups start in the queue at their layout's compute floor (search.layout_floor.
    LayoutFloors.layout_floor), their layout's bound worked out only if they come up: the floor must
    not exceed the step of any member, uniform or split, of any recompute, ZeRO stage,
    exchange or offload, nor, at a group's own recompute (and ZeRO-3's passes, where it
    is one), the step of any member of that group. Where no member is a split variant
    it counts the pipeline's fill, and that raises it above the mean's for some
    layout."""
    name, cluster, gpus, gbs, seq, space_name, every = case
    space = load_space(space_name)
    walk = _Search(_model(name), with_gpus(resolve_cluster(cluster), gpus),
                   Job(global_batch=gbs, seq_len=seq), space, top_k=1)
    checked = filled = zero3 = 0
    for i, bundle in enumerate(walk.walk.groups()):
        assert not bundle.layout_bounded
        # with a split variant (at the fewest chunks of its own: a stage holds a layer a
        # chunk whatever the split) the fill is not counted
        fewest = min(v for _, v, _ in bundle.runnable)
        mean = walk.bounds.floors.layout_floor(bundle.plan, bundle.cp_comms,
                                        bundle.runnable + ((Schedule.ONE_F_ONE_B, fewest, True),))
        assert mean <= bundle.bound
        filled += mean < bundle.bound
        if i % every and not (mean < bundle.bound and filled <= 3):
            continue  # every so many, and the first three the fill raises
        for group in walk.walk.unbundled(bundle):
            # its own: at its recompute, and ZeRO-3's where it is one (``_laid``)
            own = walk.bounds.floors.layout_floor(group.plan, group.cp_comms, group.runnable)
            for plan, split in walk.walk.schedule_plans(group, count=False):
                if split:
                    plan = with_best_stages(plan, space.stage_shape)
                    if plan is None:
                        continue
                step = evaluate(plan).step_time_s
                assert bundle.bound <= group.bound <= step * TIGHT, plan
                assert own <= step * TIGHT, plan
                checked += 1
                zero3 += plan.zero is ZeroStage.PARAMETERS
    assert checked >= 20
    assert filled >= 1 if space.stage_shape is StageShape.UNIFORM else filled == 0
    assert zero3 >= 1 if ZeroStage.PARAMETERS in space.zero else zero3 == 0
    assert checked >= 20


# -- the pipeline's fill at a layout's bound (search.bound: split_chain_floor, _uniform_chain)

def _worst_stage(split, a, c, m):
    """max over stages s of a * (layers before s) + m * c * (layers of s): terms 1 and 2 of
    ``step_time_lower_bound`` for per-layer chain work a and stage work c."""
    return max(a * sum(split[:s]) + m * c * n for s, n in enumerate(split))


@pytest.mark.parametrize("p,layers,m,share", [(2, 5, 1, 1.0), (3, 7, 4, 1.0), (4, 9, 3, 1 / 3),
                                              (3, 12, 8, 0.5), (5, 11, 2, 0.4)])
def test_the_split_chain_floor_holds_for_every_split_and_meets_its_closed_forms(p, layers, m, share):
    """T >= share C / (1 - (1 - share/m)^p) (cost.bounds.split_chain_floor) holds for every
    split of whole layers into p stages (brute force), lies between the mean m C / p and
    (share 1) the equal split's (m + p - 1) C / p, and is m C at one stage, C at one
    microbatch with share 1."""
    c = 3.0  # one layer's work; a = share * c on the chain
    floor = split_chain_floor(layers * c, share, m, p)
    least = min(_worst_stage(split, share * c, c, m)
                for split in itertools.product(range(layers + 1), repeat=p)
                if sum(split) == layers)
    assert floor <= least * TIGHT
    assert floor >= m * layers * c / p * (1 - 1e-12)
    if share == 1.0:
        assert floor <= (m + p - 1) * layers * c / p * TIGHT
    assert split_chain_floor(layers * c, share, m, 1) == pytest.approx(m * layers * c, rel=1e-12)
    assert split_chain_floor(layers * c, 1.0, 1, p) == pytest.approx(layers * c, rel=1e-12)


def test_the_split_chain_floor_at_32_stages_and_15_microbatches_is_2_4_times_the_mean():
    """The docstring's number: 1 / (1 - (14/15)^32) against 15 / 32."""
    ratio = split_chain_floor(1.0, 1.0, 15, 32) / (15 / 32)
    assert ratio == pytest.approx(1 / (1 - (14 / 15) ** 32) / (15 / 32), rel=1e-12)
    assert 2.39 < ratio < 2.41


def test_the_uniform_chain_of_equal_stages_is_the_fill_and_drain_by_hand():
    """Four equal stages of 2 dense layers (forward 1, B 2, W 1 each), m = 6: with B and W
    fused the last stage starts after 3 stages' forwards (3 x 2) and its last backward is
    followed by 3 stages' backwards (3 x 6), so (m + p - 1) x 8 = 72; apart, term 1 is
    6 + 6 x 8 = 54 and term 2 6 + 6 x 6 + 3 x 4 = 54 (B drains, W does not)."""
    unit = (1.0, 4.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # F, F+B+W, W; no MoE, no logits
    runs = ((4, 2, 0, 0),)
    assert _uniform_chain(unit, runs, 6, True, False) == pytest.approx(72.0)
    assert _uniform_chain(unit, runs, 6, False, True) == pytest.approx(54.0)
    # the same stages one run each: a run's last stage has the most before it
    assert _uniform_chain(unit, ((1, 2, 0, 0),) * 4, 6, True, False) == pytest.approx(72.0)
    assert _uniform_chain(unit, runs, 6, True, True) == pytest.approx(54.0)  # the least kind


def test_a_deep_pipelines_unopened_bound_counts_its_fill():
    """DeepSeek-V3 at pp 32 (61 layers, one-chunk schedules only): the layout enters the
    queue at its uniform split's fill, well above m microbatches of the mean stage, and
    below every group it opens into (``test_an_unopened_layouts_bound_holds_...``)."""
    from autoplan.plan import Layout

    walk = _Search(_model("deepseek-v3"), with_gpus(resolve_cluster("dgx-h100"), 262144),
                   Job(global_batch=15360, seq_len=4096), load_space("default"), top_k=1)
    base = Layout(dp=512, tp=2, pp=32, cp=8, ep=32)
    item = next(u for u in walk.walk.unopened() if u.base == base)
    groups = list(walk.walk.opened(item))
    assert groups and all(item.bound <= g.bound * TIGHT for g in groups)
    bounds = walk.bounds
    scheds, _, sps, cps, _, _ = item.choices
    assert bounds.floors.layout_mean_floor(base, sps, cps, walk.ctx.least, scheds) == item.bound
    mean = min(g.plan.num_microbatches * sum(w.forward + w.backward for w in stage_work(g.plan))
               / base.pp for g in groups)
    assert item.bound > 1.5 * mean
