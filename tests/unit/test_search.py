"""Search invariants, determinism, and equality with brute-force enumeration."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.space import SearchSpace, load_space
from autoplan.parallel.common import divisors
from autoplan.parallel.rules import plan_problems
from autoplan.plan import Layout, Plan
from autoplan.schedules import Schedule
from autoplan.schedules.registry import Chunks
from autoplan.search.engine import candidate_plans, rank_key, rank_key_static, search
from autoplan.vocab import Dtype, Recompute, ZeroStage

SMALL = SearchSpace(
    name="small", launcher="any", tp_max=8, tp_within_nvlink=True, pp_max=8, cp_max=2,
    vpp_max=2, micro_batches=(1, 2), schedules=tuple(Schedule)[:3],
    recompute=tuple(Recompute), zero=(ZeroStage.NONE, ZeroStage.OPTIMIZER, ZeroStage.PARAMETERS),
    zero_max_with_pp=ZeroStage.OPTIMIZER, sequence_parallel=(True, False),
)


def brute_force(model, cluster, job, space):
    """Every plan the space allows, evaluated; no pruning, no bound."""
    n = cluster.gpus
    found = []
    for tp, pp, cp in itertools.product(divisors(n), repeat=3):
        if n % (tp * pp * cp) or tp > space.tp_max or pp > space.pp_max or cp > space.cp_max:
            continue
        if tp > min(cluster.nvlink_domain, n):
            continue
        dp = n // (tp * pp * cp)
        scheds = [(Schedule.ONE_F_ONE_B, 1)] if pp == 1 else [
            (s, v) for s in space.schedules
            for v in (range(2, space.vpp_max + 1) if s.spec.chunks is Chunks.LAYOUT
                      else [2] if s.v_shape else [1])]
        zeros = [z for z in space.zero if pp == 1 or z <= space.zero_max_with_pp]
        if dp * cp == 1:  # nothing to shard: every stage is the first's plan (zero-unsharded)
            zeros = zeros[:1]
        sps = space.sequence_parallel if tp > 1 else (False,)
        # HSDP where the space tries it: ZeRO over one node's dp ranks (zero >= 1)
        in_node = cluster.gpus_per_node // (tp * cp)
        shards = [dp] + ([in_node] if space.hybrid_shard and 1 < in_node < dp
                         and dp % in_node == 0 else [])
        exchanges = space.cp_comm if cp > 1 else space.cp_comm[:1]
        for mbs, (sched, v), rc, zero, sp, shard, cp_comm in itertools.product(
                space.micro_batches, scheds, space.recompute, zeros, sps, shards, exchanges):
            if job.global_batch % (dp * mbs) or (shard < dp and zero is ZeroStage.NONE):
                continue
            plan = Plan(model=model, cluster=cluster, job=job,
                        layout=Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=v, dp_shard=shard),
                        micro_batch=mbs,
                        schedule=sched, recompute=rc, zero=zero, sequence_parallel=sp,
                        cp_comm=cp_comm,
                        recompute_modules=space.recompute_modules
                        if rc is Recompute.SELECTIVE else ())
            if plan_problems(plan):
                continue
            pred = evaluate(plan)
            if pred.feasible:
                found.append((rank_key(plan, pred), plan, pred))
    found.sort(key=lambda t: t[0])
    return found


@pytest.mark.parametrize(("model", "gpus", "gbs", "seq"), [
    ("llama3-8b", 8, 16, 4096),
    ("llama2-13b", 16, 32, 4096),
    ("gpt-7.5b", 8, 8, 2048),
])
def test_the_engines_best_plans_equal_brute_force_enumeration(model, gpus, gbs, seq):
    m = resolve_model(model)
    c = with_gpus(resolve_cluster("dgx-a100"), gpus)
    job = Job(global_batch=gbs, seq_len=seq, dtype=Dtype.BF16)
    expected = brute_force(m, c, job, SMALL)
    result = search(m, c, job, SMALL, top_k=5)
    assert expected, "the brute force found nothing to compare with"
    assert [r.plan for r in result.plans] == [p for _, p, _ in expected[:5]]
    assert [r.prediction for r in result.plans] == [q for _, _, q in expected[:5]]


def test_a_spaces_recompute_modules_are_searched_with_sound_bounds():
    """Selective recompute by module (the space's, or ``search --recompute-modules``): its
    bound charges the modules' own recompute, so the search still equals brute force where
    such plans lead (long sequences on data and tensor parallelism alone)."""
    from autoplan.vocab import RecomputeModule
    space = dataclasses.replace(SMALL, name="modules", tp_max=2, pp_max=1, cp_max=1,
                                recompute_modules=(RecomputeModule.MLP, RecomputeModule.LAYERNORM))
    m, c = resolve_model("llama3-8b"), with_gpus(resolve_cluster("dgx-a100"), 8)
    job = Job(global_batch=16, seq_len=16384, dtype=Dtype.BF16)
    expected = brute_force(m, c, job, space)
    result = search(m, c, job, space, top_k=6)
    assert any(p.recompute_modules for _, p, _ in expected[:6])
    assert [r.plan for r in result.plans] == [p for _, p, _ in expected[:6]]


EVERY_SCHEDULE = dataclasses.replace(SMALL, name="every-schedule", schedules=tuple(Schedule))


@pytest.mark.parametrize(("model", "cluster", "gpus", "gbs", "seq"), [
    ("llama3-8b", "dgx-h100", 8, 16, 4096),
    ("llama2-13b", "dgx-h100", 16, 64, 4096),  # zero-bubble plans lead; the old bound lost them
    ("llama2-70b", "dgx-a100", 32, 64, 4096),
    ("gpt3-175b", "dgx-a100", 64, 64, 2048),
])
def test_the_best_plans_equal_brute_force_over_every_schedule(model, cluster, gpus, gbs, seq):
    """Zero-bubble and V-shape schedules too: their bound drains only input gradients
    (``cost.bounds.step_time_lower_bound``), so none of their plans is pruned wrongly."""
    m = resolve_model(model)
    c = with_gpus(resolve_cluster(cluster), gpus)
    job = Job(global_batch=gbs, seq_len=seq, dtype=Dtype.BF16)
    expected = brute_force(m, c, job, EVERY_SCHEDULE)
    result = search(m, c, job, EVERY_SCHEDULE, top_k=8)
    assert {p.schedule for _, p, _ in expected} == set(Schedule)
    assert [r.plan for r in result.plans] == [p for _, p, _ in expected[:8]]
    assert [r.prediction for r in result.plans] == [q for _, _, q in expected[:8]]


def test_search_reports_where_every_candidate_went():
    m = resolve_model("llama3-8b")
    c = with_gpus(resolve_cluster("dgx-h100"), 16)
    result = search(m, c, Job(global_batch=32, seq_len=4096), SMALL, top_k=3)
    s = result.stats
    assert s.generated == sum(s.pruned.values()) + sum(s.infeasible.values()) + s.evaluated
    assert s.evaluated >= 3


@settings(max_examples=5, deadline=None)
@given(model=st.sampled_from(["llama3-8b", "llama2-13b", "gpt-18b", "llama2-70b"]),
       gpus=st.sampled_from([8, 16, 32, 64]), gbs_per_gpu=st.sampled_from([1, 2, 4]),
       seq=st.sampled_from([2048, 4096]),
       space=st.sampled_from(["default", "megatron", "deepspeed", "torchtitan", "fsdp"]))
@pytest.mark.slow  # 1 to 5 s, with the examples hypothesis draws
def test_every_reported_plan_divides_fits_and_respects_its_space(model, gpus, gbs_per_gpu, seq,
                                                                 space):
    m = resolve_model(model)
    c = with_gpus(resolve_cluster("dgx-h100"), gpus)
    sp = load_space(space)
    job = Job(global_batch=gbs_per_gpu * gpus, seq_len=seq)
    result = search(m, c, job, sp, top_k=4)
    for r in result.plans:
        plan, pred = r.plan, r.prediction
        assert plan.layout.gpus == gpus
        assert plan_problems(plan) == []
        assert sum(plan.stage_layers) == m.layers
        assert pred.feasible and all(mem.peak <= c.device.mem_bytes for mem in pred.memory_per_stage)
        assert pred.breakdown.total == pytest.approx(pred.step_time_s, rel=1e-9)
        assert plan.schedule in sp.schedules or plan.layout.pp == 1
        assert plan.zero in (sp.zero_with_pp if plan.layout.pp > 1 and sp.zero_with_pp else sp.zero)
        assert plan.layout.tp <= sp.tp_max
        assert evaluate(plan) == pred  # a reported prediction is the evaluator's
    keys = [rank_key(r.plan, r.prediction) for r in result.plans]
    assert keys == sorted(keys)
    again = search(m, c, job, sp, top_k=4)
    assert again.plans == result.plans and again.stats.to_dict() == result.stats.to_dict()


def test_plans_are_distinct_objects_not_one_mutated_plan():
    m = resolve_model("llama3-8b")
    c = with_gpus(resolve_cluster("dgx-h100"), 16)
    result = search(m, c, Job(global_batch=64, seq_len=4096), load_space("default"), top_k=10)
    assert len({r.plan for r in result.plans}) == len(result.plans) == 10


def test_no_plan_fits_reports_the_smallest_need_with_numbers():
    m = resolve_model("llama3-405b")
    c = with_gpus(resolve_cluster("dgx-h100"), 8)
    result = search(m, c, Job(global_batch=8, seq_len=8192), load_space("default"))
    assert result.plans == ()
    why = result.why_none()
    assert "GiB per GPU on h100-sxm (80 GiB)" in why and "optimizer" in why


@pytest.mark.slow  # more than about 3 s on 2 cores
def test_where_activations_never_fit_the_smallest_plan_is_brute_forces():
    """Groups whose memory floor exceeds the device are dropped whole; the message
    still names the candidate needing the least memory of all, as brute force finds it."""
    m = resolve_model("llama3-8b")
    c = with_gpus(resolve_cluster("dgx-h100"), 8)
    job = Job(global_batch=8, seq_len=1048576)
    sp = load_space("default")
    result = search(m, c, job, sp)
    assert result.plans == () and result.closest is not None
    assert result.stats.infeasible["activations exceed memory"] > 1000
    peaks = [(evaluate(p).memory.peak, rank_key_static(p), p) for p in candidate_plans(m, c, job, sp)]
    peak, _, smallest = min(peaks, key=lambda x: x[:2])
    assert result.closest[0] == smallest
    assert result.closest[2].peak == pytest.approx(peak, rel=1e-12)
    assert f"needs {peak / 2**30:.1f} GiB" in result.why_none()


def test_more_memory_never_makes_the_best_plan_slower():
    m = resolve_model("llama2-13b")
    c = with_gpus(resolve_cluster("dgx-a100"), 16)
    job = Job(global_batch=32, seq_len=4096)
    small = dataclasses.replace(c, device=dataclasses.replace(c.device, mem_bytes=40 * 2**30))
    best_big = search(m, c, job, SMALL, top_k=1).plans[0].prediction.step_time_s
    best_small = search(m, small, job, SMALL, top_k=1).plans[0].prediction.step_time_s
    assert best_big <= best_small


@pytest.mark.parametrize(("layers", "pp", "expected"), [
    (80, 4, (20, 20, 20, 20)),
    (126, 4, (31, 32, 32, 31)),
    (126, 8, (15, 16, 16, 16, 16, 16, 16, 15)),
    (10, 4, (2, 3, 3, 2)),
    (7, 2, (4, 3)),
    (13, 3, (4, 5, 4)),
])
def test_uneven_layers_go_to_the_middle_stages_first(layers, pp, expected):
    from autoplan.descriptors.pipeline_layout import uniform_stages

    assert uniform_stages(layers, pp) == expected
    assert sum(expected) == layers


def test_a_plan_with_an_uneven_split_writes_its_stages():
    from tests.helpers import make_plan

    plan = make_plan(model="llama3-405b", gpus=64, dp=1, tp=8, pp=8, global_batch=16,
                     seq_len=8192)
    assert plan.to_dict()["stages"] == [15, 16, 16, 16, 16, 16, 16, 15]
    assert "stages" not in make_plan(pp=2, dp=4).to_dict()


def test_plan_replace_is_dataclasses_replace_with_a_fresh_hash():
    plan = Plan(
        model=resolve_model("llama3-8b"), cluster=with_gpus(resolve_cluster("dgx-h100"), 8),
        job=Job(global_batch=32, seq_len=4096), layout=Layout(dp=2, tp=1, pp=4), micro_batch=1,
        schedule=Schedule.ONE_F_ONE_B, recompute=Recompute.NONE, zero=ZeroStage.OPTIMIZER,
        sequence_parallel=False)
    hash(plan)  # remembered on the original
    for changes in [{}, {"schedule": Schedule.ZB_H1}, {"micro_batch": 2, "stages": (9, 9, 9, 5)},
                    {"layout": Layout(dp=2, tp=1, pp=4, vpp=2), "schedule": Schedule.INTERLEAVED}]:
        fast, slow = plan.replace(**changes), dataclasses.replace(plan, **changes)
        assert fast == slow and hash(fast) == hash(slow)
        assert (hash(fast) == hash(plan)) == (not changes)
    with pytest.raises(TypeError, match="vpp"):
        plan.replace(vpp=2)


def test_groups_whose_states_crowd_memory_are_dropped_on_their_floor_first_losing_no_plan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a group's model states alone take more than half the limit its memory floor is
    asked before its time bounds (search.frontier.Frontier._too_big), and a group none of
    whose members fits is dropped there, its offload variants queued; a bundle of recompute
    choices that offloads is dropped whole where none of its groups fits: the same plans as
    with the check last (Llama 3 70B on 16 H100: 449 of 601 groups and 34 bundles are so
    dropped)."""
    from autoplan.search import frontier

    args = (resolve_model("llama3-70b"), with_gpus(resolve_cluster("dgx-h100"), 16),
            Job(global_batch=64, seq_len=4096), load_space("default"), 3)
    dropped: dict[bool, list[bool]] = {False: [], True: []}  # bundle? -> dropped or not
    too_big = frontier.Frontier._too_big

    def counted(self: frontier.Frontier, item: Any) -> bool:
        dropped[bool(item.recomputes)].append(too_big(self, item))
        return dropped[bool(item.recomputes)][-1]

    monkeypatch.setattr(frontier.Frontier, "_too_big", counted)
    first = search(*args)
    groups, bundles = dropped[False], dropped[True]
    assert sum(groups) > len(groups) // 2 and sum(bundles) > 10
    monkeypatch.setattr(frontier, "MEMORY_FIRST", float("inf"))
    last = search(*args)
    assert [(r.plan, r.prediction.step_time_s) for r in first.plans] == \
        [(r.plan, r.prediction.step_time_s) for r in last.plans]
    s = first.stats
    assert s.generated == sum(s.pruned.values()) + sum(s.infeasible.values()) + s.evaluated


@given(st.integers(min_value=1, max_value=300_000))
@settings(max_examples=60, deadline=None)
def test_divisors_are_every_degree_that_divides_ascending(n: int) -> None:
    """``parallel.common.divisors`` pairs d with n / d up to sqrt(n): against the scan."""
    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
