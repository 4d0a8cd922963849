"""The knobs vendor recipes tune, searched (issue 48): selective recompute's module sets,
Megatron-Core's EP A2A overlap and bf16 gradients and Adam moments. The search equals
brute-force evaluation of every plan they make (enumerated here apart from the search,
the rules of a valid plan deciding which exist), and the bounds it prunes them by hold."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import layer_core, stage_work
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.space import SearchSpace, load_space, read_space
from autoplan.descriptors.strict import parse_yaml
from autoplan.errors import InputError
from autoplan.parallel import ep
from autoplan.parallel.common import divisors
from autoplan.parallel.rules import plan_problems
from autoplan.plan import Layout, Plan
from autoplan.schedules import Schedule
from autoplan.search.context import recompute_choices, state_jobs
from autoplan.search.engine import candidate_plans, rank_key, search
from autoplan.search.layout_floor import overlap_ep, overlap_share
from autoplan.vocab import Axis, MoeDispatch, Recompute, StateDtype, ZeroStage
from autoplan.vocab import RecomputeModule as M

# DeepSeek-V3's shape (MLA, a dense first layer, a shared expert), small enough to
# brute-force on eight GPUs; ``mtp_layers`` 0 so that EP overlap runs without pipelining
TINY_MOE = dataclasses.replace(
    resolve_model("deepseek-v3"), name="dsv3-tiny", layers=6, hidden=1024, heads=16,
    kv_heads=16, ffn_hidden=2816, vocab=32000, experts=16, top_k=4, moe_ffn_hidden=512,
    shared_experts=1, dense_layers=1, route_groups=0, route_group_topk=0, q_lora_rank=256,
    kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, mtp_layers=0)

SETS = ((), (M.CORE_ATTN, M.LAYERNORM, M.MLA_UP_PROJ, M.MOE_ACT), (M.LAYERNORM, M.MLA_UP_PROJ, M.MOE),
        (M.CORE_ATTN, M.LAYERNORM, M.MLP))

DIMS = SearchSpace(
    name="dims", launcher="any", tp_max=2, tp_within_nvlink=True, pp_max=2, cp_max=1, vpp_max=3,
    micro_batches=(1, 2), schedules=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED),
    recompute=tuple(Recompute), zero=(ZeroStage.NONE, ZeroStage.OPTIMIZER),
    zero_max_with_pp=ZeroStage.OPTIMIZER, sequence_parallel=(True,), ep_max=8, etp=("1",),
    moe_dispatch=(MoeDispatch.ALLTOALL,), recompute_module_sets=SETS, ep_overlap=(False, True))


def _small(cluster: str, gpus: int, gib: float | None = None):
    c = with_gpus(resolve_cluster(cluster), gpus)
    if gib is not None:  # a small device: recompute and expert parallelism pay
        c = dataclasses.replace(c, device=dataclasses.replace(c.device, mem_bytes=gib * 2**30))
    return c


def brute_force(model, cluster, job, space):
    """Every plan of the space, apart from the search: each layout (expert foldings by
    ``ep.foldings``, the dispatcher the search takes for it), schedule, recompute with
    each module set, ZeRO stage, EP overlap and gradient and moment precision, kept where
    the rules of a valid plan take it; evaluated and ranked."""
    n = cluster.gpus
    found = []
    for tp, pp, cp in itertools.product(divisors(n), repeat=3):
        if n % (tp * pp * cp) or tp > space.tp_max or pp > space.pp_max or cp > space.cp_max:
            continue
        dp = n // (tp * pp * cp)
        scheds = [(Schedule.ONE_F_ONE_B, 1)] if pp == 1 else [
            (s, v) for s in space.schedules
            for v in (range(2, space.vpp_max + 1) if s is Schedule.INTERLEAVED else [1])]
        recomputes = [(rc, mods) for rc in space.recompute
                      for mods in (space.module_sets if rc is Recompute.SELECTIVE else [()])]
        for lay in ep.foldings(model, Layout(dp=dp, tp=tp, pp=pp, cp=cp), space):
            dispatch = ep.dispatch_for(model, cluster, lay, space, job.seq_len)
            sps = space.sequence_parallel if tp > 1 else (False,)
            zeros = [z for z in space.zero if pp == 1 or z <= space.zero_max_with_pp]
            unsharded = lay.dp * lay.cp == 1 and lay.edp == 1
            seen: set = set()  # unsharded: a ZeRO stage is a lower one's plan again
            for zero in zeros:
                jobs = [jb for jb in _jobs(job, space, zero)
                        if not (unsharded and (jb.main_grads, jb.optimizer_states) in seen)]
                seen.update((jb.main_grads, jb.optimizer_states) for jb in jobs)
                for mbs, (sched, v), (rc, mods), sp, ov, jb in itertools.product(
                        space.micro_batches, scheds, recomputes, sps, space.ep_overlap, jobs):
                    if job.global_batch % (dp * mbs):
                        continue
                    plan = Plan(model=model, cluster=cluster, job=jb, stack=space.stack,
                                layout=dataclasses.replace(lay, vpp=v), micro_batch=mbs,
                                schedule=sched, recompute=rc, zero=zero, sequence_parallel=sp,
                                recompute_modules=mods, moe_dispatch=dispatch, ep_overlap=ov)
                    if plan_problems(plan):
                        continue
                    pred = evaluate(plan)
                    if pred.feasible:
                        found.append((rank_key(plan, pred), plan, pred))
    found.sort(key=lambda t: t[0])
    return found


def _jobs(job, space, zero):
    """The job, and where the space tries bf16 states its bf16 gradients and (in the
    distributed optimizer: zero >= 1) bf16 moments."""
    if not space.bf16_states:
        return [job]
    # the job's own (None: the stack's, fp32 here), then bf16
    grads = [job.main_grads, StateDtype.BF16]
    moments = [job.optimizer_states] + ([StateDtype.BF16] if zero >= ZeroStage.OPTIMIZER else [])
    return [dataclasses.replace(job, main_grads=g, optimizer_states=o) for g in grads for o in moments]


def _equal_to_brute_force(model, cluster, job, space, top_k):
    expected = brute_force(model, cluster, job, space)
    result = search(model, cluster, job, space, top_k=top_k)
    assert len(expected) >= top_k
    assert [r.plan for r in result.plans] == [p for _, p, _ in expected[:top_k]]
    assert [r.prediction for r in result.plans] == [q for _, _, q in expected[:top_k]]
    # the search generates every plan the brute force evaluates (and no other)
    assert {p for _, p, _ in expected} <= set(candidate_plans(model, cluster, job, space))
    return [p for _, p, _ in expected[:top_k]]


@pytest.mark.parametrize(("recompute", "sets"), [
    (tuple(Recompute), SETS), ((Recompute.SELECTIVE, Recompute.FULL), SETS),
    ((Recompute.SELECTIVE, Recompute.FULL), (SETS[1], SETS[3]))], ids=["all", "no-none", "common"])
def test_module_sets_and_ep_overlap_of_a_small_deepseek_are_searched_as_brute_force_finds(
        recompute, sets):
    """Tiny DeepSeek on eight 6.5 GiB GPUs: plans with EP overlap and with module sets
    lead; the search finds the brute force's top 8, in order. Without ``none`` a bundle's
    bounds are read at what its module sets have in common (nothing, or core_attn and
    layernorm: ``search.context.least_choice``), below each."""
    space = dataclasses.replace(DIMS, recompute=recompute, recompute_module_sets=sets)
    top = _equal_to_brute_force(TINY_MOE, _small("dgx-h100", 8, 6.5),
                                Job(global_batch=32, seq_len=4096), space, 8)
    assert any(p.ep_overlap for p in top)
    assert len({p.recompute_modules for p in top if p.recompute is Recompute.SELECTIVE}) >= 2


def test_ep_overlap_with_interleaving_and_an_mtp_layer_is_searched_as_brute_force_finds():
    """With its MTP layer, EP overlap needs pipelining with two chunks or more (the rule
    ep-overlap): on 16 GPUs the search's groups with EP overlap run interleaved only, and
    it still finds the brute force's top 6."""
    model = dataclasses.replace(TINY_MOE, mtp_layers=1)
    space = dataclasses.replace(DIMS, tp_max=1)
    cluster, job = _small("dgx-h100", 16, 6.5), Job(global_batch=64, seq_len=4096)
    _equal_to_brute_force(model, cluster, job, space, 6)
    overlapping = [p for p in candidate_plans(model, cluster, job, space) if p.ep_overlap]
    assert overlapping and all(p.layout.pp > 1 and p.layout.vpp > 1 for p in overlapping)


def test_a_dense_models_module_sets_are_searched_as_brute_force_finds():
    """Llama 3 8B at 16K tokens on data and tensor parallelism: the dense set (core_attn,
    mlp, layernorm) leads; the MoE and MLA sets are not tried on a dense model."""
    space = dataclasses.replace(DIMS, tp_max=2, pp_max=1)
    model, cluster = resolve_model("llama3-8b"), _small("dgx-a100", 8)
    top = _equal_to_brute_force(model, cluster, Job(global_batch=16, seq_len=16384), space, 6)
    assert any(p.recompute_modules == SETS[3] for p in top)
    assert {mods for _, mods in recompute_choices(model, space)} == {(), SETS[3]}
    assert not any(p.ep_overlap for p in candidate_plans(model, cluster, Job(
        global_batch=16, seq_len=16384), space))


@pytest.mark.parametrize("name", ["llama3-8b", "tiny-moe"])
def test_bf16_states_where_the_space_allows_them_are_searched_as_brute_force_finds(name):
    """bf16 gradients and moments (``bf16_states: true``, what ``--allow-bf16-states``
    sets): bf16 moments only with the distributed optimizer (zero >= 1); the best plans
    use them, and name them in the plan file."""
    if name == "tiny-moe":
        model, cluster = TINY_MOE, _small("dgx-h100", 8, 6.5)
        space, job = dataclasses.replace(DIMS, bf16_states=True), Job(global_batch=32, seq_len=4096)
    else:
        model, cluster = resolve_model("llama3-8b"), _small("dgx-a100", 8)
        space = dataclasses.replace(DIMS, bf16_states=True, tp_max=2, pp_max=2,
                                    recompute_module_sets=((),))
        job = Job(global_batch=16, seq_len=4096)
    top = _equal_to_brute_force(model, cluster, job, space, 6)
    best = top[0]
    assert (best.job.main_grads, best.job.optimizer_states) == (StateDtype.BF16, StateDtype.BF16)
    assert best.to_dict()["job"]["main_grads"] == "bf16"
    assert best.to_dict()["job"]["optimizer_states"] == "bf16"
    for plan in candidate_plans(model, cluster, job, space):
        if plan.job.optimizer_states is StateDtype.BF16:
            assert plan.zero >= ZeroStage.OPTIMIZER


def test_bf16_states_are_off_unless_the_space_turns_them_on():
    job = Job(global_batch=16, seq_len=4096)
    for name in ("default", "megatron"):
        space = load_space(name)
        assert space.bf16_states is False
        assert state_jobs(job, space, ZeroStage.OPTIMIZER) == (job,)
        on = dataclasses.replace(space, bf16_states=True)
        assert len(state_jobs(job, on, ZeroStage.OPTIMIZER)) == 4
        assert len(state_jobs(job, on, ZeroStage.NONE)) == 2  # no bf16 moments below zero 1


def test_the_launcher_spaces_search_the_recipe_module_sets_and_ep_overlap():
    """searchspace/megatron.yaml and default.yaml list the module sets of vendor MoE
    recipes and EP overlap; each set is tried only where the model has its modules."""
    for name in ("default", "megatron"):
        space = load_space(name)
        assert set(space.module_sets) == set(SETS) and space.ep_overlap == (False, True)
        sets = {mods for rc, mods in recompute_choices(resolve_model("deepseek-v3"), space)
                if rc is Recompute.SELECTIVE}
        assert sets == set(SETS)  # DeepSeek-V3 has MoE, MLA and dense first layers
        assert {mods for rc, mods in recompute_choices(resolve_model("mixtral-8x7b"), space)
                if rc is Recompute.SELECTIVE} == {()}  # no MLA, no dense MLP
        assert {mods for rc, mods in recompute_choices(resolve_model("llama3-70b"), space)
                if rc is Recompute.SELECTIVE} == {(), SETS[3]}
    for name in ("deepspeed", "torchtitan", "fsdp"):  # no module-level recompute there
        space = load_space(name)
        assert space.module_sets == ((),) and space.ep_overlap == (False,)


SPACE_TEXT = """\
searchspace:
  name: s
  tp: {max: 8}
  pp_max: 1
  cp_max: 1
  vpp_max: 1
  micro_batch: [1]
  schedules: [1f1b]
  recompute: [selective]
  zero: [1]
  sequence_parallel: [true]
"""


def test_a_space_file_names_its_module_sets_and_the_old_single_set_still_reads():
    sets = read_space(parse_yaml(SPACE_TEXT + "  recompute_module_sets: [[core_attn], [moe, "
                                 "layernorm], [layernorm, moe], [mlp]]\n", "s.yaml"), "s.yaml")
    assert sets.module_sets == ((), (M.LAYERNORM, M.MOE), (M.MLP,))  # [core_attn] is the default
    one = read_space(parse_yaml(SPACE_TEXT + "  recompute_modules: [moe_act]\n", "s.yaml"), "s.yaml")
    assert one.module_sets == ((M.MOE_ACT,),)
    # --recompute-modules (autoplan.commands.request) fixes one set in any space
    assert dataclasses.replace(load_space("megatron"), recompute_modules=(M.MLP,)).module_sets == (
        (M.MLP,),)
    # a space file's one set (a launcher's file with it added) is searched alone
    both = read_space(parse_yaml(SPACE_TEXT + "  recompute_modules: [mlp]\n  recompute_module_sets: "
                                 "[[moe], [layernorm]]\n", "s.yaml"), "s.yaml")
    assert both.module_sets == ((M.MLP,),)
    with pytest.raises(InputError) as bad:
        read_space(parse_yaml(SPACE_TEXT + "  recompute_module_sets: [[foo]]\n", "s.yaml"), "s.yaml")
    assert bad.value.problems[0].field == "searchspace.recompute_module_sets[0][0]"
    flags = read_space(parse_yaml(SPACE_TEXT + "  ep_overlap: [true, false]\n  bf16_states: true\n",
                                  "s.yaml"), "s.yaml")
    assert flags.ep_overlap == (False, True) and flags.bf16_states


def test_the_ep_overlap_charge_per_layer_is_at_least_the_slowdown_and_at_most_what_evaluate_exposes():
    """The bounds charge an MoE layer under EP overlap (search.layout_floor.overlap_ep) at least
    the SM-sharing slowdown of its paired share of passes, and summed over a stage's MoE
    layers (less what its dense layers' and logits' forward may hide) at most the
    dispatch and combine ``evaluate``'s stage works expose, each way, on every stage."""
    checked = 0
    for model, gpus, lay in [(TINY_MOE, 8, dict(dp=8, ep=8)),
                             (dataclasses.replace(TINY_MOE, mtp_layers=1), 16,
                              dict(dp=8, pp=2, ep=8, vpp=3)),
                             # DeepSeek-V3 at 64 layers, to interleave them evenly
                             (dataclasses.replace(resolve_model("deepseek-v3"), layers=64), 1024,
                              dict(dp=64, tp=2, pp=8, ep=32, vpp=2))]:
        for slow in (0.0, 0.25, 1.0):
            base = Plan(model=model, cluster=_small("dgx-h100", gpus), job=Job(
                global_batch=1024, seq_len=4096), layout=Layout(**{"tp": 1, "pp": 1, **lay}),
                micro_batch=1, schedule=Schedule.INTERLEAVED if lay.get("vpp", 1) > 1
                else Schedule.ONE_F_ONE_B, recompute=Recompute.NONE, zero=ZeroStage.OPTIMIZER,
                sequence_parallel=lay.get("tp", 1) > 1, ep_overlap=True)
            plan = dataclasses.replace(base, stack=dataclasses.replace(
                base.stack, comm_compute_slowdown=slow))
            assert not plan_problems(plan)
            core, share = layer_core(plan), overlap_share(plan)
            e, lt = core.ep_layer, core.lt_moe
            forward, backward = overlap_ep(plan, core, share)
            assert forward >= share * slow * min(e, lt.backward_input + lt.backward_weight)
            assert backward >= share * slow * min(e, lt.forward) > 0 or slow == 0
            hidden = share * (1 - slow)
            for work in stage_work(plan):
                moe = work.layers - work.dense + (work.mtp if model.is_moe else 0)
                ep_f, ep_b = work.comm[Axis.EP]
                heads_f = work.compute_f - work.dense * core.lt.forward - moe * lt.forward
                assert moe * forward <= ep_f * (1 + 1e-9) + 1e-15
                assert moe * backward - hidden * (work.dense * core.lt.forward + heads_f) <= (
                    ep_b * (1 + 1e-9) + 1e-15)
                checked += 1
    assert checked >= 20


def test_the_recompute_modules_option_fixes_one_set_in_a_space_of_several():
    """``search --recompute-modules`` (autoplan.commands.request) searches its one set, in a space
    listing several; without it the space's sets are searched."""
    from autoplan.commands.request import build_request

    args = dict(model="deepseek-v3", cluster="dgx-h100", gpus=64, global_batch=64, seq_len=4096,
                space="megatron")
    fixed = build_request(None, recompute_modules=[M.MOE_ACT, M.LAYERNORM], **args)
    assert fixed.space.module_sets == ((M.MOE_ACT, M.LAYERNORM),)
    assert {mods for rc, mods in recompute_choices(fixed.model, fixed.space)
            if rc is Recompute.SELECTIVE} == {(M.MOE_ACT, M.LAYERNORM)}
    assert set(build_request(None, **args).space.module_sets) == set(SETS)


def test_the_bounds_of_module_set_and_ep_overlap_groups_never_exceed_a_members_step():
    """Tiny DeepSeek with its MTP layer on 16 GPUs, Megatron's uneven first and last
    stages (split variants, per-chunk layouts with EP overlap): every bound a bundle, a
    group and a split variant of each recompute choice and EP overlap enters the queue
    at or is tightened to holds for each member's evaluated step (its best split's), and
    the split variants' memory caps (``MemoryFloors.split_caps``) drop only variants no
    split of which fits."""
    from autoplan.descriptors.space import StageShape
    from autoplan.search.engine import _Search
    from autoplan.search.stages import with_best_stages

    model = dataclasses.replace(TINY_MOE, mtp_layers=1)
    space = dataclasses.replace(DIMS, tp_max=1, stage_shape=StageShape.FIRST_LAST)
    walk = _Search(model, _small("dgx-h100", 16, 6.5), Job(global_batch=64, seq_len=4096), space,
                   top_k=1)
    seen: dict[tuple, int] = {}
    dropped = 0
    for bundle in walk.walk.groups():
        entry = bundle.bound
        for group in walk.walk.unbundled(walk.bounds.fully_laid(bundle)):
            group = walk.bounds.fully_laid(group)
            own = walk.bounds.group_bound(group.plan, group.runnable, group.cp_comms)
            caps = walk.floors.split_caps(group)
            for plan, split in walk.walk.schedule_plans(group, count=False):
                floor = walk.bounds.split_floor(plan) if split else 0.0
                if split:
                    best = with_best_stages(plan, space.stage_shape)
                    if caps is not None and (sum(caps) < model.layers or min(caps) < plan.layout.vpp):
                        assert best is None, plan
                        dropped += 1
                    if best is None:
                        continue
                    plan = best
                step = evaluate(plan).step_time_s * (1 + 1e-9)
                assert entry <= step and group.bound <= step and own <= step and floor <= step, plan
                key = (plan.ep_overlap, plan.recompute, plan.recompute_modules)
                seen[key] = seen.get(key, 0) + 1
    assert {k[0] for k in seen} == {False, True}
    assert {k[2] for k in seen} == {(), SETS[1], SETS[2], SETS[3]}
    assert dropped >= 1


def test_a_chunked_plans_roomy_memory_is_at_least_its_evaluated_peak():
    """A plan of chunks of their own sizes that fits below the allocator's pressure at
    its stages' most chunks in flight of their heaviest chunk (``MemoryFloors._roomy``)
    is taken to fit without its chunks' order walked: that memory is at least the peak
    ``evaluate`` finds, so it fits and no pressure is charged."""
    from autoplan.cost.stage import stage_work as works_of
    from autoplan.descriptors.space import StageShape
    from autoplan.parallel.dp import PRESSURE_START
    from autoplan.search.engine import _Search
    from autoplan.search.stages import with_best_stages

    model = dataclasses.replace(TINY_MOE, mtp_layers=1)
    space = dataclasses.replace(DIMS, tp_max=1, stage_shape=StageShape.FIRST_LAST)
    cluster, job = _small("dgx-h100", 16, 16), Job(global_batch=64, seq_len=4096)
    walk = _Search(model, cluster, job, space, top_k=1)
    roomy = 0
    for plan in candidate_plans(model, cluster, job, space):
        if plan.layout.vpp == 1 or plan.layout.pp == 1:
            continue
        best = with_best_stages(plan, space.stage_shape)
        if best is None or best.chunks is None:
            continue
        mem = walk.floors._roomy(best, works_of(best))
        if mem is not None:
            peak = evaluate(best).memory.peak
            assert peak <= mem.peak * (1 + 1e-12) and mem.peak <= PRESSURE_START * cluster.device.mem_bytes
            roomy += 1
    assert roomy >= 5
