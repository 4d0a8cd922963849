"""A layout's compute floor: a step time no plan of a layout (or of a block of layouts)
beats, whatever its schedule, read off one layer's costs and each schedule's critical chain
(``ScheduleSpec``), with the last stage's states and ZeRO-3's passes. The bounds above it
(a layout's for every ZeRO stage and recompute, a group's, a member's, a candidate's) are
``search/bound.py``'s; ``tests/unit/test_bounds.py`` holds every one to the evaluated steps
of the plans it stands for."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autoplan.caches import memo
from autoplan.cost.bounds import (
    dense_per_stage,
    split_chain_floor,
    stage_state_params,
    step_overhead,
)
from autoplan.cost.stage import (
    LayerCore,
    count_free,
    layer_core,
    module_recompute,
)
from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.model import Model
from autoplan.descriptors.stack import Stack
from autoplan.parallel import dp, ep, mesh, pp
from autoplan.plan import Layout, Plan
from autoplan.schedules import Schedule
from autoplan.schedules.registry import representative
from autoplan.search.context import Context
from autoplan.search.items import Choice, Sched
from autoplan.vocab import (
    NO_OFFLOAD,
    CpComm,
    MoeDispatch,
    Recompute,
    RecomputeModule,
    ZeroStage,
)

# the V schedule whose stage work stands for every V's in the bounds (the work of a
# stage reads only the spec's ``work_key``: cost.stage.cost_key)
V_WORK = representative(splits_backward=True, v_shape=True)


# (non-expert parameters, expert parameters, layers run) of a pipeline stage
_StageState = tuple[float, float, int]
# :meth:`LayoutFloors._last_stage_states`: the flat members' (one per chunk count), the V's
_LastStates = tuple[tuple[_StageState, ...], _StageState | None]


def layer_work(plan: Plan, cp_comm: CpComm, core: LayerCore, share: float | None = None
               ) -> tuple[float, float, float, float, float]:
    """One layer's work per microbatch as :meth:`LayoutFloors.layout_floor` counts it, read
    off its costs ``core`` on ``cp_comm``: (a dense layer's forward, an MoE layer's forward,
    a dense layer's forward and backward with its recompute, an MoE layer's, the logits).

    With EP overlap (``plan.ep_overlap``), an MoE layer's dispatch and combine each way at
    what :func:`overlap_ep` charges, and a dense layer's and the logits' backward less
    what of its stage's MoE dispatch their forward compute may hide (``share``: the most
    of a stage's passes EP overlap pairs, :func:`overlap_share` of the plan where None)."""
    lt, lt_moe = core.lt, core.lt_moe
    ep_f = ep_b = core.ep_layer
    overlapped = plan.ep_overlap and ep_f > 0
    hidden = 0.0
    if overlapped:
        s = overlap_share(plan) if share is None else share
        ep_f, ep_b = overlap_ep(plan, core, s)
        hidden = s * (1.0 - plan.stack.comm_compute_slowdown)
    forward = lt.forward + core.tp_dense.forward + core.cp_f
    forward_moe = lt_moe.forward + core.tp_moe.forward + core.cp_f + ep_f
    per_dense = forward + lt.backward_input + lt.backward_weight + core.cp_b - hidden * lt.forward
    per_moe = (forward_moe + lt_moe.backward_input + lt_moe.backward_weight + core.cp_b
               + ep_b)
    if plan.recompute is Recompute.FULL:
        per_dense, per_moe = per_dense + forward, per_moe + forward_moe
    elif plan.recompute is Recompute.SELECTIVE and plan.recompute_modules:
        own = plan if cp_comm is plan.cp_comm else plan.replace(cp_comm=cp_comm)
        dense_s, moe_s = module_recompute(own)
        per_dense += dense_s
        # (with EP overlap its dispatched again backward is not charged: the least exposed
        # of a pass overlapped never grows with its communication)
        per_moe += moe_s + (core.ep_layer if RecomputeModule.MOE in plan.recomputed
                            and not overlapped else 0)
    elif plan.recompute is Recompute.SELECTIVE:
        per_dense += lt.attention_forward
        per_moe += lt_moe.attention_forward
    return forward, forward_moe, per_dense, per_moe, sum(core.logits) - hidden * core.logits[0]


def overlap_share(plan: Plan) -> float:
    """The most of a rank's passes EP overlap pairs for any chunk count of ``plan``'s
    layout and microbatches: ``ep.overlapped_passes`` at one chunk, where the fewest
    passes go unpaired ((pp - 1) of m; with v chunks v pp - 1 of m v, no fewer in share)."""
    if plan.layout.vpp > 1:
        plan = plan.replace(layout=dataclasses.replace(plan.layout, vpp=1))
    return ep.overlapped_passes(plan)


def overlap_ep(plan: Plan, core: LayerCore, share: float) -> tuple[float, float]:
    """(forward, backward) dispatch and combine of one MoE layer under EP overlap, summing
    over a stage's layers to at most what ``ep.overlap_exposed`` leaves exposed of its n
    MoE layers' E = n e each way: of the share s of passes paired, E runs beside the
    paired pass's compute C, exposing ``dp.overlapped``(E, C), the rest (1 - s) keeps E.

    Forward: C is the paired backward's (B, W, recompute, the dense layers' and heads'),
    at least n (b + w) of the MoE layers: ``overlapped`` >= slow min(E, C) >= n slow
    min(e, b + w), the SMs' slowdown per layer, whatever the recompute. Backward: C is
    the paired forward's compute, n f of the MoE layers and X of the dense layers' and
    the logits': ``overlapped``(E, n f + X) >= n ``overlapped``(e, f) - (1 - slow) X (it
    is homogeneous, and falls at most (1 - slow) per second of C), the X term charged
    to those layers (:func:`layer_work`). Both fall as s grows (``overlapped`` is at
    most E), so the most share bounds every member."""
    e, lt = core.ep_layer, core.lt_moe
    slow = plan.stack.comm_compute_slowdown
    keep = (1.0 - share) * e
    return (keep + share * slow * min(e, lt.backward_input + lt.backward_weight),
            keep + share * dp.overlapped(e, lt.forward, slow))


# :func:`_chain_parts`: (a microbatch's work over every layer and the logits, the same
# without the weight gradients, the least share of a layer's work that is its forward)
_ChainParts = tuple[float, float, float]


def _chain_parts(layers: int, moe: int, core: LayerCore,
                 work: tuple[float, float, float, float, float]) -> _ChainParts:
    """What :func:`_pipeline_floor` reads off one layer's ``work`` (:func:`layer_work`, on
    ``core``) for a model of ``layers`` layers, ``moe`` of them MoE: C, the work of one
    microbatch through every layer and the logits; C', the same without the weight
    gradients (W), which zero-bubble schedules run off the drain; and a share of any
    layer's work (and the logits') that is its forward at this recompute or any above it:
    f / (c + f), as recompute runs at most the forward again (``cost.stage._stage``). (The
    floor grows with C and with the share, so it holds for every recompute above.)"""
    forward, forward_moe, per_dense, per_moe, logits = work
    dense = layers - moe
    lf, _, lw = core.logits
    total = dense * per_dense + moe * per_moe + logits
    no_w = total - dense * core.lt.backward_weight - moe * core.lt_moe.backward_weight - lw
    shares = [f / (c + f) for n, f, c in ((dense, forward, per_dense),
                                          (moe, forward_moe, per_moe), (1, lf, logits))
              if n and c > 0]
    return total, no_w, min(shares, default=1.0)


def _pipeline_floor(parts: _ChainParts, m: float, p: int, fused: bool, split: bool) -> float:
    """A step no one-chunk flat schedule (``fused``: one running B and W as one backward;
    ``split``: one running them apart) beats on any layer split over ``p`` stages
    (``cost.bounds.split_chain_floor``): with B and W fused every stage's whole work is on
    the chain; apart, its forward is (term 1 of ``step_time_lower_bound``), and its
    forward and B are with B's share of the stage (term 2). The least over the kinds
    given; infinite for none."""
    total, no_w, share = parts
    least = float("inf")
    if fused:
        least = split_chain_floor(total, 1.0, m, p)
    if split:
        least = min(least, max(split_chain_floor(total, share, m, p),
                               split_chain_floor(no_w, 1.0, m, p)))
    return least


# one layer's work per microbatch by kind, as :func:`_uniform_chain` reads it (off
# :func:`layer_work`): a dense layer's forward, whole work and W; an MoE layer's; the logits'
_Unit = tuple[float, float, float, float, float, float, float, float, float]
# a run of equal stages of the uniform one-chunk split: (stages, dense layers, MoE layers
# (MTP modules included), heads: the logits it computes, the output layer's and each MTP's)
_Run = tuple[int, int, int, int]


def _unit(core: LayerCore, work: tuple[float, float, float, float, float]) -> _Unit:
    forward, forward_moe, per_dense, per_moe, logits = work
    lf, _, lw = core.logits
    return (forward, per_dense, core.lt.backward_weight, forward_moe, per_moe,
            core.lt_moe.backward_weight, lf, logits, lw)


def _output_stage(model: Model, unit: _Unit, p: int, scheds: Sequence[Sched]) -> float:
    """A microbatch's work on the stage holding the output layer (p - 1; a V's stage 0),
    whatever the split, the least over the kinds of ``scheds``, read off one layer's
    ``unit``: a layer a chunk, the logits and each MTP module (a layer of the last kind,
    its own logits). Every chunk holds a layer, so a flat schedule's stage p - 1 holds
    layers p - 1 on (MoE ones past the dense first layers), a V's stage 0 layer 0 and a
    layer from 2p - 1 on."""
    _, c_d, _, _, c_m, _, _, lc, _ = unit
    dense = model.layers - model.moe_layers if model.is_moe else model.layers
    light = c_m if not dense else c_d if dense == model.layers else min(c_d, c_m)

    def layer(first: int) -> float:  # the least layer from index ``first`` on
        return light if first < dense else c_m

    heads = (1 + model.mtp_layers) * lc + model.mtp_layers * (c_m if model.is_moe else c_d)
    least = float("inf")
    flat = [v for sched, v, _ in scheds if sched.spec.looping]
    if flat:
        least = min(flat) * layer(p - 1)
    if len(flat) < len(scheds):
        least = min(least, layer(0) + layer(2 * p - 1))
    return (0.0 if least == float("inf") else least) + heads


def _fullest_stage(model: Model, unit: _Unit, p: int) -> float:
    """A microbatch's work on the stage holding the most layers, whatever the split: some
    stage holds ceil(L/p) of the model's layers, and some ceil(M/p) of its M MoE layers,
    read off one layer's ``unit`` (the least kind's, then the MoE one's)."""
    _, c_d, _, _, c_m, _, _, _, _ = unit
    moe = model.moe_layers if model.is_moe else 0
    light = c_m if moe == model.layers else c_d if not moe else min(c_d, c_m)
    return max(-(-model.layers // p) * light, -(-moe // p) * c_m)


def _uniform_chain(unit: _Unit, runs: Sequence[_Run], m: int, fused: bool, split: bool) -> float:
    """Terms 1 and 2 of ``cost.bounds.step_time_lower_bound`` over the stages of the
    uniform one-chunk split (``runs``), each stage's F, B and W read off one layer's
    ``unit`` work by kind (what it leaves out, the embedding, TP at the heads and in
    backward, sends, ZeRO-3, only adds): the least over the kinds given (``fused``: B and
    W one backward; ``split``: apart) of the most over stages. In a run of equal stages
    the last has the most fill and drain before it."""
    f_d, c_d, w_d, f_m, c_m, w_m, lf, lc, lw = unit
    fill = drain = drain_in = 0.0
    most_fused = most_split = 0.0
    for k, d, e, h in runs:
        f = d * f_d + e * f_m + h * lf
        c = d * c_d + e * c_m + h * lc
        w = d * w_d + e * w_m + h * lw
        before = k - 1
        x = fill + before * f + m * c
        if fused:
            most_fused = max(most_fused, x + drain + before * (c - f))
        if split:
            most_split = max(most_split, x, fill + before * f + m * (c - w) + drain_in
                             + before * (c - f - w))
        fill += k * f
        drain += k * (c - f)
        drain_in += k * (c - f - w)
    return min(most_fused if fused else float("inf"), most_split if split else float("inf"))


@memo(65536)
def _shard_parts(model: Model, cluster: Cluster, job: Job, stack: Stack, tp: int, cp: int,
                 ep: int, etp: int, dispatch: MoeDispatch, mbs: int, sp: bool,
                 recompute: Recompute, modules: tuple[RecomputeModule, ...],
                 cps: tuple[CpComm, ...], overlap: bool = False
                 ) -> tuple[tuple[_ChainParts, _Unit], ...]:
    """(:func:`_chain_parts`, :func:`_unit`) of one layer on each exchange of ``cps``, for a
    shard (tp, cp, ep, etp, its dispatch, micro-batch, sequence parallelism, recompute)
    on a ``count_free`` cluster: what a layer costs depends on neither dp nor pp nor the
    node count (``cost.stage.layer_core``), so the layouts of every count of a sweep
    sharing a shard read it once. The probe holds one expert fold (dp = ep etp).
    ``overlap``: its MoE layers' dispatch at EP overlap's least, every pass paired
    (:func:`overlap_ep` at share 1: at most what any member, overlapping or not, exposes)."""
    lay = Layout(dp=ep * etp, tp=tp, pp=1, cp=cp, ep=ep, etp=etp)
    moe = model.moe_layers if model.is_moe else 0
    out = []
    for cp_comm in cps:
        plan = Plan(model=model, cluster=cluster, job=job, stack=stack, layout=lay,
                    micro_batch=mbs, schedule=Schedule.ONE_F_ONE_B, recompute=recompute,
                    zero=ZeroStage.NONE, sequence_parallel=sp, cp_comm=cp_comm,
                    moe_dispatch=dispatch, recompute_modules=modules, ep_overlap=overlap)
        core = layer_core(plan)
        work = layer_work(plan, cp_comm, core, 1.0 if overlap else None)
        out.append((_chain_parts(model.layers, moe, core, work), _unit(core, work)))
    return tuple(out)


def _one_chunk_kinds(scheds: Sequence[Sched]) -> tuple[bool, bool] | None:
    """(whether any, whether any splits the backward) of ``scheds``, where every one is
    a flat one-chunk schedule (uniform or split: :func:`_pipeline_floor` holds for any
    split); None where some run more chunks or a V (their fill is bounded apart)."""
    fused = split = False
    for sched, v, _ in scheds:
        if v > 1 or not sched.spec.looping:
            return None
        if sched.spec.drain_counts_w:
            fused = True
        else:
            split = True
    return fused, split



class LayoutFloors:
    """A layout's compute floors, where its groups enter the queue (:meth:`layout_floor`,
    :meth:`layout_mean_floor`, :meth:`block_floor`), with their memos: one a search
    (``TimeBounds.floors``)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._cores: dict[tuple[Layout, int, bool, CpComm], LayerCore] = {}  # :meth:`_core`
        self._zero3_memo: dict[tuple, tuple[float, float]] = {}  # :meth:`_zero3_passes`
        self._runs: dict[int, tuple[_Run, ...]] = {}  # :meth:`_uniform_runs`
        self._overhead: float | None = None  # :meth:`layout_mean_floor`
        self._layout_floors: dict[tuple, float] = {}  # :meth:`layout_floor`
        # :meth:`_kinds`: (the schedules, their kinds) by (pp, m, the schedules' id)
        self._kinds_memo: dict[tuple[int, int, int],
                               tuple[Sequence[Sched], tuple[bool, bool, bool] | None]] = {}
        # :meth:`_last_stage_states`
        self._last_states: dict[tuple[Layout, frozenset[int]], _LastStates] = {}
    # -- a layout's compute floor (where groups enter the queue) ------------------------
    def layout_floor(self, plan: Plan, cps: Sequence[CpComm], scheds: Sequence[Sched]) -> float:
        """A step time no plan of ``plan``'s layout, micro-batch, sequence parallelism and
        recompute (or more) beats, whatever its schedule of ``scheds`` (those passing the
        schedule rules), layer split, ZeRO stage (ZeRO-3 only where ``plan``'s is: its
        passes then count), offload or exchange of ``cps``, read off one layer's costs
        alone (``cost.stage.layer_core``): per layer, its forward, input- and
        weight-gradient compute, its forward TP collectives, its exposed CP exchange both
        ways, its MoE dispatch and combine both ways (with EP overlap the least it
        exposes, :func:`overlap_ep`, whatever the recompute) and what its recompute runs
        again (the attention's forward, its modules' forwards; or the whole forward with
        its TP, CP and MoE collectives: ``cost.stage._stage``); a forward alone: all but
        the gradients' compute, CP and recompute; and the output layer's logits' compute,
        once per microbatch on the stage holding it. The least over the exchanges (and over a
        dense and an MoE layer for a stage's layers) of the more of:

        - the mean: some stage runs at least the mean of the stages' work, and m
          microbatches of it one after another (``busiest_stage_bound``); the layers' and
          the logits' work is part of the stages' whatever the split;
        - where every schedule of one chunk per stage is flat (no V), whatever the split:
          the fill every split pays (:func:`_pipeline_floor`, ``split_chain_floor``);
          where others split, it is not counted;
        - where every schedule runs uniform stages (no split variant), the least over
          its kinds, flat of one chunk, flat of more and V, of: of one chunk, the chain
          of the uniform split's stages (:func:`_uniform_chain`: terms 1 and 2 of
          ``step_time_lower_bound`` off one layer's costs by kind), or the more of that
          and the above; else stage p - 1, holding at least floor(L/p) layers (and
          the logits, flat), runs m microbatches of them after the first microbatch's
          forward has crossed a first chunk of each stage before it (term 1 of
          ``step_time_lower_bound``), at least floor(L/p) layers each with one chunk,
          L/(p v) with v (the rules make pp v divide L), L/(2p) for a V; a V's stage 0
          runs m microbatches of its L/p layers and the logits. With ZeRO-3, stage
          p - 1 also exposes its parameters' gathers and gradients' reduce-scatters
          (``dp.zero3_exposed``, of its own parameters and layers,
          :meth:`_last_stage_states`) at the least compute it runs: a pass's compute
          plus what of them it exposes grows with that compute (the overlap hides at
          most the compute it runs beside), so the least compute bounds it.

        Each part of a stage's work that this leaves out (the embedding, TP at the heads,
        sends, ZeRO-3 elsewhere, offload) only adds to it; the stack's per-step overhead,
        which ``evaluate`` adds to every plan, is added. Memoized on what it reads of the plan
        (its model, cluster and stack are the search's; its job's states are the probes',
        ``Context.bound_job``, whose gradients ZeRO-3 scatters the fastest): no offload, so
        a group's offload variants share one, and of ZeRO only whether it is ZeRO-3, so the
        groups of ZeRO 0-2 do."""
        key = (plan.layout, plan.micro_batch, plan.sequence_parallel,
               plan.zero is ZeroStage.PARAMETERS, plan.recompute, plan.recompute_modules,
               plan.moe_dispatch, plan.ep_overlap, plan.stages, tuple(cps), tuple(scheds))
        floor = self._layout_floors.get(key)
        if floor is None:
            if plan.offload.any or plan.job is not self.ctx.bound_job:
                plan = plan.replace(offload=NO_OFFLOAD, job=self.ctx.bound_job)
            floor = self._layout_floors[key] = self._layout_floor(plan, cps, scheds)
        return floor

    def _layout_floor(self, plan: Plan, cps: Sequence[CpComm], scheds: Sequence[Sched]) -> float:
        model = plan.model
        p, m, layers = plan.layout.pp, plan.num_microbatches, model.layers
        moe = model.moe_layers if model.is_moe else 0
        uniform = p > 1 and not any(split for *_, split in scheds)
        one_chunk = [x for x in scheds if x[1] == 1 and x[0].spec.looping]
        chain_kinds = _one_chunk_kinds(one_chunk) if one_chunk else None
        # the one-chunk members' fill for any split; where others split, theirs is not bounded
        if not uniform and len(one_chunk) < len(scheds):
            chain_kinds = None
        flat = [layers // (p * v) for sched, v, _ in scheds if sched.spec.looping and v > 1]
        v_shaped = any(not sched.spec.looping for sched, _, _ in scheds)
        zero3 = uniform and plan.zero is ZeroStage.PARAMETERS
        once = any(sched.spec.gathers_once_a_step for sched, _, _ in scheds)
        states = self._last_stage_states(plan, scheds) if zero3 else ((), None)
        least = float("inf")
        for cp_comm in cps:
            core = self._core(plan, cp_comm)
            lt, lt_moe = core.lt, core.lt_moe
            work = layer_work(plan, cp_comm, core)
            forward, forward_moe, per_dense, per_moe, logits = work
            floor = m * ((layers - moe) * per_dense + moe * per_moe + logits) / p
            if p > 1:
                unit = _unit(core, work)
                floor = max(floor, m * _output_stage(model, unit, p, scheds),
                            m * _fullest_stage(model, unit, p))
            kinds = []
            if chain_kinds is not None:
                kinds.append(_pipeline_floor(_chain_parts(layers, moe, core, work), m, p, *chain_kinds))
            if uniform:
                # stage p - 1's compute, forward and backward (ZeRO-3's gathers hide behind it)
                c_f = (layers // p) * min(lt.forward, lt_moe.forward)
                c_b = (layers // p) * min(lt.backward_input + lt.backward_weight,
                                          lt_moe.backward_input + lt_moe.backward_weight)
                if moe:
                    forward, per_dense = min(forward, forward_moe), min(per_dense, per_moe)
                stage = m * (layers // p) * per_dense  # m microbatches of a stage's layers
                z_flat, z_v = (self._zero3_passes(plan, cp_comm, states, core, c_f, c_b)
                               if zero3 else (0.0, 0.0))
                if once:  # its passes are once a step, not once a microbatch
                    z_flat = 0.0
                if one_chunk and chain_kinds is not None:
                    # the uniform split's chain, and the last stage's with ZeRO-3
                    last = (p - 1) * (layers // p) * forward + stage + m * (logits + z_flat)
                    kinds[0] = max(kinds[0], last, _uniform_chain(
                        _unit(core, work), self._uniform_runs(plan.layout), m, *chain_kinds))
                if flat:
                    kinds.append((p - 1) * min(flat) * forward + stage + m * (logits + z_flat))
                if v_shaped:
                    kinds.append(max((p - 1) * (layers // (2 * p)) * forward + stage + m * z_v,
                                     stage + m * logits))
            if kinds:
                floor = max(floor, min(kinds))
            least = min(least, floor)
        return least + step_overhead(plan)

    def layout_mean_floor(self, base: Layout, sps: Sequence[bool], cps: Sequence[CpComm],
                          recompute: Choice, scheds: Sequence[Sched]) -> float:
        """A step time no plan of the layout ``base`` beats, whatever its micro-batch (of
        the space's), sequence parallelism (of ``sps``), exchange (of ``cps``), recompute
        (``recompute`` or more: ``Context.least``), EP overlap (:meth:`_overlaps`), ZeRO
        stage, job, offload, schedule or split: the least over
        micro-batch, sequence parallelism and exchange of the mean term of
        :meth:`layout_floor` (m microbatches of the stages' mean work, which no stage runs
        less of) and, where the schedules passing the rules at that micro-batch
        (:meth:`_kinds`) are all flat with one chunk per stage, its fill terms (any
        split's; the uniform split's chain where none is a split variant), plus the
        stack's per-step overhead: at most every group's entry bound. The fill of a deep
        pipeline is most of its bound: without it a search of DeepSeek-V3 on 4,096 H100
        opened 524 of its 2,117 layouts, with it 187 (the same plans found). A
        microbatch's work is read off one layer's costs, which depend on the shard alone
        (tp, cp, ep, etp, the dispatch, micro-batch, sequence parallelism, exchange: not
        dp, pp or the node count), so it is worked out once per shard (:func:`_shard_parts`,
        across a sweep's counts too) and the layouts sharing one pay a multiplication
        (search/enumeration.py opens a layout's groups only once this bound comes up)."""
        model, ctx = self.ctx.model, self.ctx
        cluster, dispatch, cps = count_free(ctx.cluster), ctx.dispatch(base), tuple(cps)
        batch, p = ctx.job.global_batch, base.pp
        # (a step's mean work, microbatches, its work's parts) of each micro-batch,
        # sequence parallelism and exchange: the fill is worked out least mean first, while
        # the mean is below the least floor so far (the fill only adds to it)
        options: list[tuple[float, int, int, _ChainParts, _Unit]] = []
        overlap = self._overlaps(base, scheds)
        for mbs in ctx.space.micro_batches:
            if batch % (base.dp * mbs):
                continue  # no plan of this micro-batch (the rule dp-batch)
            m = batch // (base.dp * mbs)
            for sp in sps:
                parts = _shard_parts(model, cluster, ctx.job, ctx.space.stack, base.tp, base.cp,
                                     base.ep, base.etp, dispatch, mbs, sp, *recompute, cps,
                                     overlap)
                options.extend((m * part[0] / p, m, mbs, part, unit) for part, unit in parts)
        options.sort(key=lambda o: o[0])
        least = float("inf")
        for mean, m, mbs, part, unit in options:
            if mean >= least:
                break
            floor = mean
            if p > 1:
                floor = max(floor, m * _output_stage(model, unit, p, scheds),
                            m * _fullest_stage(model, unit, p))
                # its groups' schedules, where each is a flat one-chunk one: the fill any
                # split pays (:func:`_pipeline_floor`), and the uniform split's where none
                # is a split variant (:func:`_uniform_chain`)
                kinds = self._kinds(base, mbs, m, scheds)
                if kinds is not None:
                    fused, split, uniform = kinds
                    floor = max(floor, _pipeline_floor(part, m, p, fused, split))
                    if uniform:
                        floor = max(floor, _uniform_chain(unit, self._uniform_runs(base), m,
                                                          fused, split))
            least = min(least, floor)
        return least + self.overhead(base)

    def block_floor(self, base: Layout, sps: Sequence[bool], cps: Sequence[CpComm],
                    recompute: Choice,
                    layouts: Sequence[tuple[Layout, tuple]] = ()) -> float:
        """A step time no plan of a layout sharing ``base``'s shard (tp, cp, ep, etp: any
        pp, dp or hybrid sharding at this GPU count) beats: the least over the space's
        micro-batches, sequence parallelism (of ``sps``) and exchanges (of ``cps``) of the
        mean term of :meth:`layout_mean_floor`, m x a microbatch's work / pp, plus the
        step overhead. With dp = N / (tp pp cp) and m = B / (dp b), m / pp = B tp cp / (N b)
        whatever pp and dp are: one number for the block, over the micro-batches b some
        layout of the block runs (b x dp divides the batch).

        At a micro-batch b that every layout of the block running it (``layouts``, each
        with its schedule choices; b x dp divides the batch) runs with flat one-chunk
        schedules alone, the more of that and the fill any split pays
        (:func:`_pipeline_floor`, of either kind) at the least pipeline degree p of them:
        with m = c p (c = B tp cp / (N b)), that fill, share C / (1 - (1 - share/(c p))^p),
        grows with p ((1 - x/p)^p grows with p for p >= x, and c p = m >= 1 >= share), so
        the least degree's holds for every layout running b. (Layouts of more stages than
        layers run nothing: the rule pp-layers.) A search of DeepSeek-V3 on 262,144 H100
        (61 layers: no interleaving, no V) looks into 278 of its 378 blocks, against 358
        with the mean alone."""
        model, ctx = self.ctx.model, self.ctx
        cluster, dispatch, cps = count_free(ctx.cluster), ctx.dispatch(base), tuple(cps)
        per_b = ctx.job.global_batch * base.tp * base.cp / ctx.cluster.gpus
        batch, layers = ctx.job.global_batch, model.layers
        # per micro-batch: the least pipeline degree of the layouts running it (0: none
        # does; more stages than layers run nothing, the rule pp-layers), and whether each
        # runs flat one-chunk schedules alone there
        degrees = []
        for mbs in ctx.space.micro_batches:
            p, flat = 0, True
            for lay, choices in layouts:
                if batch % (lay.dp * mbs) == 0 and lay.pp <= layers:
                    p = lay.pp if not p else min(p, lay.pp)
                    flat = flat and self._kinds(lay, mbs, batch // (lay.dp * mbs),
                                                choices[0]) is not None
            degrees.append((mbs, p, flat))
        # (a block none of whose layouts runs any micro-batch is bounded as if all did: its
        # layouts' rules count their candidates when it comes up)
        runs_any = any(p for _, p, _ in degrees)
        # EP overlap where a layout of the block runs it (none given: where one might)
        overlap = (any(self._overlaps(lay, choices[0]) for lay, choices in layouts) if layouts
                   else bool(self.ctx.overlap_choices) and base.ep > 1)
        least = float("inf")
        for mbs, p, flat in degrees:
            if not p and runs_any:
                continue  # no layout of the block runs it: no candidate
            m = per_b * p / mbs  # the least degree's microbatches (a whole number)
            fill = flat and p > 1
            for sp in sps:
                parts = _shard_parts(model, cluster, ctx.job, ctx.space.stack, base.tp, base.cp,
                                     base.ep, base.etp, dispatch, mbs, sp, *recompute, cps,
                                     overlap)
                for part, _ in parts:
                    floor = part[0] * per_b / mbs
                    if fill:
                        floor = max(floor, _pipeline_floor(part, m, p, True, True))
                    least = min(least, floor)
        return least + self.overhead(base)

    def _overlaps(self, base: Layout, scheds: Sequence[Sched]) -> bool:
        """Whether a plan of ``base`` may run EP overlap: a schedule of ``scheds`` runs it
        (``Context.overlap_schedules``: the space tries it, on an MoE model, with ep > 1).
        Its bounds then charge the least EP overlap exposes, which no plan, overlapping or
        not, beats."""
        return bool(self.ctx.overlap_choices) and base.ep > 1 and bool(
            self.ctx.overlap_schedules(base, scheds))

    def overhead(self, base: Layout) -> float:
        """The stack's per-step overhead: the same for every plan of the search."""
        if self._overhead is None:
            self._overhead = step_overhead(self.ctx.probe(base))
        return self._overhead

    def _kinds(self, base: Layout, mbs: int, m: int, scheds: Sequence[Sched]
               ) -> tuple[bool, bool, bool] | None:
        """:func:`_one_chunk_kinds` of the schedules of ``scheds`` passing the schedule
        rules at ``m`` microbatches (``Context.runnable``, which reads no more than the
        pipeline degree, the chunks and m), and whether none is a split variant; None
        where some run more chunks or a V. Per (pp, m, schedules): keyed on the schedules'
        identity (the search's are one list per pipeline degree; the memo keeps each alive,
        so its id is not reused), which costs no hashing of them."""
        key = (base.pp, m, id(scheds))
        hit = self._kinds_memo.get(key)
        if hit is None:
            runnable = self.ctx.runnable(base, mbs, False, scheds)
            kinds = _one_chunk_kinds(runnable)
            hit = self._kinds_memo[key] = (scheds, None if kinds is None else (
                *kinds, not any(split for *_, split in runnable)))
        return hit[1]

    def _uniform_runs(self, base: Layout) -> tuple[_Run, ...]:
        """The stages of the layout's uniform one-chunk split (``uniform_stages``; the
        output layer and MTP modules on the last), as runs of equal ones (:data:`_Run`).
        Per pipeline degree."""
        p = base.pp
        runs = self._runs.get(p)
        if runs is None:
            model = self.ctx.model
            probe = self.ctx.probe(base)
            dense = pp.dense_per_stage(probe)
            out: list[_Run] = []
            for s, layers in enumerate(probe.stage_layers):
                mtp = model.mtp_layers if s == p - 1 else 0
                stage = ((dense[s], layers - dense[s] + mtp) if model.is_moe
                         else (layers + mtp, 0)) + (int(s == p - 1) + mtp,)
                if out and out[-1][1:] == stage:
                    out[-1] = (out[-1][0] + 1, *stage)
                else:
                    out.append((1, *stage))
            runs = self._runs[p] = tuple(out)
        return runs

    def _core(self, plan: Plan, cp_comm: CpComm) -> LayerCore:
        """``layer_core`` of the plan on ``cp_comm``: read off its layout, micro-batch and
        sequence parallelism (the same for each ZeRO stage, recompute and offload)."""
        key = (plan.layout, plan.micro_batch, plan.sequence_parallel, cp_comm)
        core = self._cores.get(key)
        if core is None:
            core = self._cores[key] = layer_core(
                plan if cp_comm is plan.cp_comm else plan.replace(cp_comm=cp_comm))
        return core

    def _zero3_passes(self, plan: Plan, cp_comm: CpComm, states: _LastStates, core: LayerCore,
                      c_f: float, c_b: float) -> tuple[float, float]:
        """ZeRO-3's exposed passes per microbatch on stage p - 1 (:meth:`layout_floor`) at
        its least compute, ``c_f`` and ``c_b`` (``core``'s, the logits' on a flat one):
        the least over the flat members' ``states``, and the V members'. Per layout,
        micro-batch, sequence parallelism and exchange (not recompute: the compute is
        without it)."""
        key = (plan.layout, plan.micro_batch, plan.sequence_parallel, cp_comm, states)
        hit = self._zero3_memo.get(key)
        if hit is None:
            groups, (lf, lb, lw) = mesh.groups(plan), core.logits
            flat = min((sum(dp.zero3_exposed(plan, groups, params, experts, c_f + lf,
                                             c_b + lb + lw, 0.0, n))
                        for params, experts, n in states[0]), default=0.0)
            v_state = states[1]
            v_shaped = 0.0 if v_state is None else sum(dp.zero3_exposed(
                plan, groups, v_state[0], v_state[1], c_f, c_b, 0.0, v_state[2]))
            hit = self._zero3_memo[key] = (flat, v_shaped)
        return hit

    def _last_stage_states(self, plan: Plan, scheds: Sequence[Sched]) -> _LastStates:
        """(non-expert parameters, expert parameters, layers run) of stage p - 1 of the
        uniform members of ``scheds``: of the flat ones, per chunk count (the stage holds
        the output layer and the MTP modules, and its own dense layers:
        ``pp.dense_per_stage``), and of the V ones (virtual stages p - 1 and p), None
        without; what ZeRO-3 gathers there (:meth:`layout_floor`). Per layout and chunk
        counts."""
        vs = frozenset(v if sched.spec.looping else 0 for sched, v, _ in scheds)  # V: 0
        key = (plan.layout, vs)
        hit = self._last_states.get(key)
        if hit is not None:
            return hit
        model, lay = self.ctx.model, plan.layout
        last = lay.pp - 1
        flat: list[_StageState] = []
        for v in sorted(vs - {0}):
            member = plan.replace(layout=self.ctx.at_vpp(lay, v), schedule=(
                Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B))
            layers = member.stage_layers[last]
            flat.append((*stage_state_params(model, lay, False, True, layers,
                                             dense_per_stage(member)[last]),
                         layers + model.mtp_layers))
        v_state: _StageState | None = None
        if 0 in vs:
            member = plan.replace(layout=self.ctx.at_vpp(lay, 2), schedule=V_WORK)
            layers = member.stage_layers[last]
            v_state = (*stage_state_params(model, lay, False, False, layers,
                                           dense_per_stage(member)[last], 0), layers)
        out = self._last_states[key] = (tuple(dict.fromkeys(flat)), v_state)
        return out
