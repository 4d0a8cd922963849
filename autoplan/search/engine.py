"""The search: generate candidate plans over a SearchSpace, prune by rule, decide
memory before any pipeline simulation, then evaluate in order of a lower bound
on step time and stop once no remaining candidate can enter the top k
(branch and bound: the result equals brute-force evaluation of every candidate).

Where the space lets a launcher take uneven layer splits, each pipelined schedule
also has a split variant, kept in the queue with a bound valid for any split; the
partitioner (search/partition.py) runs only for the variants that reach the front.

Every item in the queue carries a bound valid for all it stands for, tightened in
steps, each only for the items that come up (back in line each time the bound rises):
a bundle of a group's recompute choices at its layout's compute floor (ZeRO-3's, with
its gathers, once it comes up); its layout's bound (every ZeRO stage below 3, or ZeRO-3;
its least recompute); each of its groups at its own recompute's compute floor, then
layout bound; the group's own bound; the group's memory
floor (dropped where no member fits, else charged the allocator's pressure); its
schedules as candidates at their busiest-stage bound; a candidate's own bound; its
memory; its schedule's critical chain; then ``evaluate``. The tests hold each bound
to the evaluated steps and memory of the plans it stands for, and the results to
brute force (``tests/unit/test_bounds.py``, ``test_search.py``).
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from autoplan import caches
from autoplan.cost.bounds import (
    StageWork,
    busiest_stage_bound,
    chain_bound,
    cost_key,
    dense_per_stage,
    memory_pressure,
    memory_shortfall,
    output_stage,
    stage_memory,
    stage_state_params,
    stage_work,
    state_bytes,
    step_overhead,
    step_time_lower_bound,
)
from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import (
    LayerCore,
    activation_bytes,
    held_activations,
    layer_core,
    memory_with,
)
from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.model import Model
from autoplan.descriptors.pipeline_layout import uniform_stages
from autoplan.descriptors.space import SearchSpace
from autoplan.parallel import cp, dp, ep, mesh, pp, tp
from autoplan.parallel.common import Scope
from autoplan.parallel.rules import BY_ID, first_broken
from autoplan.plan import Layout, Memory, Plan, Prediction
from autoplan.schedules import Schedule
from autoplan.schedules.memory import peak_inflight
from autoplan.schedules.registry import representative
from autoplan.search.partition import PartitionProblem
from autoplan.search.stages import (
    chunks_of,
    partition_problem,
    split_bound,
    split_bound_with_memory,
    with_best_stages,
)
from autoplan.vocab import NO_OFFLOAD, CpComm, Offload, Recompute, ZeroStage

BOUND_SLACK = 1e-9  # relative; keeps exact ties (broken by memory) in the top k
# schedules whose candidates are bounded by their schedule's critical chain before they
# are simulated: the V schedules. V-Half and V-Min hold microbatches back to save memory:
# their bubbles exceed the fill and drain of ``step_time_lower_bound`` (by 16-40% on GPT-3
# 175B / 1024 A100). ZB-V's, with its output layer on stage 0, by 1-3% there: its chain
# cuts the plans simulated from 92 to 74 (the flat schedules' chains cut none, at more
# cost than the simulations they would save: seven searches of the golden check). Every
# V-shaped schedule of the registry is chained (``Schedule.v_shape``).

# the V schedule whose stage work stands for every V's in the bounds (the work of a
# stage reads only whether its schedule is a V and splits the backward: cost.stage.cost_key)
V_WORK = representative(splits_backward=True, v_shape=True)


# (non-expert parameters, expert parameters, layers run) of a pipeline stage
_StageState = tuple[float, float, int]
# :meth:`_Search._last_stage_states`: the flat members' (one per chunk count), the V's
_LastStates = tuple[tuple[_StageState, ...], _StageState | None]


BOUND = "bound"
HOST_MEMORY = "offload exceeds the host's memory"
SPLIT_IS_UNIFORM = "split-is-uniform"
OUTSIDE_SPACE = "space"
SEARCH_PRUNING = {
    BOUND: "cannot enter the top k",
    SPLIT_IS_UNIFORM: "best layer split is the uniform one (evaluated as such)",
    OUTSIDE_SPACE: "outside the search space's launcher rules",
}
"""Pruning that is the search's own (not a rule of a valid plan), by id."""


def pruning_reason(rule_id: str) -> str:
    """What a pruned-by id in ``SearchStats.pruned`` means."""
    rule = BY_ID.get(rule_id)
    return rule.summary if rule is not None else SEARCH_PRUNING[rule_id]


def _fullest_stages(plan: Plan, works: tuple[StageWork, ...]) -> list[tuple[int, int]]:
    """(stage, in-flight count) of the stages that can hold the most memory: among stages
    with the same work and position class (first, middle, last), memory grows only with
    the in-flight count, so the first stage holding the most stands for them. In-flight
    counts need not fall with the stage index (V-Min), so every stage is looked at."""
    lay, m, out = plan.layout, plan.num_microbatches, output_stage(plan)
    best: dict[tuple[bool, bool, StageWork], tuple[int, int]] = {}
    for s, w in enumerate(works):
        n = peak_inflight(plan.schedule, lay.pp, m, lay.vpp, s)
        key = (s == 0, s == out, w)
        if key not in best or n > best[key][1]:
            best[key] = (s, n)
    return list(best.values())


@dataclass(frozen=True, slots=True)
class Ranked:
    plan: Plan
    prediction: Prediction


@dataclass(slots=True)
class SearchStats:
    generated: int = 0
    pruned: Counter = field(default_factory=Counter)  # rule id (see pruning_reason) -> candidates
    infeasible: Counter = field(default_factory=Counter)  # reason -> candidates
    evaluated: int = 0

    def to_dict(self) -> dict:
        return {"generated": self.generated, "pruned": dict(sorted(self.pruned.items())),
                "infeasible": dict(sorted(self.infeasible.items())), "evaluated": self.evaluated}


@dataclass(frozen=True, slots=True)
class SearchResult:
    plans: tuple[Ranked, ...]  # best first
    stats: SearchStats
    closest: tuple[Plan, int, Memory] | None  # lowest-memory candidate, its fullest stage

    def why_none(self) -> str:
        if self.closest is None:
            rules = "; ".join(f"{n} by {r} ('{pruning_reason(r)}')"
                              for r, n in self.stats.pruned.most_common())
            return f"no candidate passes the divisibility rules ({rules or 'no candidates'})"
        plan, stage, mem = self.closest
        lay = plan.layout
        return (f"no plan fits in memory: the smallest plan (dp{lay.dp} tp{lay.tp} pp{lay.pp} "
                f"cp{lay.cp}{f' ep{lay.ep}' if lay.ep > 1 else ''}, micro_batch {plan.micro_batch}, "
                f"recompute {plan.recompute.value}, "
                f"zero {int(plan.zero)}{_offload_words(plan)}) "
                + memory_shortfall(plan, stage, mem, plan.cluster.device.mem_bytes))


def _offload_words(plan: Plan) -> str:
    off = plan.offload
    if not off.any:
        return ""
    parts = (["optimizer"] if off.optimizer else []) + (
        [f"{off.activations:.0%} of activations"] if off.activations else [])
    return ", offloading " + " and ".join(parts)


def rank_key(plan: Plan, pred: Prediction) -> tuple:
    """Faster first; then less memory; then the simpler plan, deterministically."""
    return (round(pred.step_time_s, 12), round(pred.memory.peak), *rank_key_static(plan))


@dataclass(frozen=True, slots=True)
class _Group:
    bound: float
    key: tuple
    plan: Plan  # the group's 1F1B, vpp = 1 member
    schedules: tuple[tuple[Schedule, int, bool], ...]  # (schedule, vpp, split)
    cp_comms: tuple[CpComm, ...] = (CpComm.RING,)  # context-parallel exchanges to try
    exact: bool = False  # the bound is the group's own, not its layout's (:meth:`_Search._laid`)
    runnable: tuple[tuple[Schedule, int, bool], ...] = ()  # those passing the schedule rules
    # once exact: its own bound without the allocator's pressure, which ``bound`` charges
    # at the group's memory floor (:meth:`_Search.memory_floor`)
    bare: float = 0.0
    floored: bool = False  # past the memory floor: ``bound`` charges its pressure
    # a bundle: the groups of ``plan`` at each of these recompute choices, one bound for
    # all, ``plan`` at the first (the least in rank, so the bundle comes up when its first
    # group would); opened only if it comes up (:meth:`_Search.unbundled`)
    recomputes: tuple[Recompute, ...] = ()
    # ``bound`` counts its layout's bound (else its compute floor, :meth:`_Search._laid`)
    laid: bool = True
    # ZeRO-3, before it is laid: ``bound`` counts its own compute floor (1; else its
    # layout's below ZeRO-3), then (2) the layout bound of the stages below 3
    steps: int = 0

    @property
    def size(self) -> int:
        return len(self.schedules) * len(self.cp_comms) * max(1, len(self.recomputes))


@dataclass(frozen=True, slots=True)
class _Candidate:
    bound: float
    key: tuple
    plan: Plan
    fits: bool = False  # its memory is checked (and its bound charges the pressure)
    chained: bool = False  # its bound counts its schedule's critical chain
    # its bound is its group's busiest-stage bound: its own stage works, exact bound and
    # memory are yet to be worked out
    pending: bool = False
    # the bound without the allocator's pressure, where ``bound`` charges one already
    # (its group's memory floor's, before its own memory is known); None: ``bound``
    bare: float | None = None

    @property
    def unpressured(self) -> float:
        """A step time the plan cannot beat before the allocator's pressure."""
        return self.bound if self.bare is None else self.bare


@dataclass(frozen=True, slots=True)
class _Split:
    """A plan whose best uneven layer split is yet to be found (only if it can win)."""

    bound: float  # valid for every split, tightened in turn (:meth:`_Search.realize`)
    key: tuple
    plan: Plan  # with the uniform split
    filled: bool = False  # the bound is its own schedule's, with the pipeline fill
    problem: PartitionProblem | None = None  # set once its bound accounts for memory


class _Search:
    def __init__(self, model: Model, cluster: Cluster, job: Job, space: SearchSpace, top_k: int,
                 min_headroom_bytes: float = 0.0):
        self.model, self.cluster, self.job, self.space, self.top_k = model, cluster, job, space, top_k
        self.stats = SearchStats()
        self.capacity = cluster.device.mem_bytes  # the allocator's pressure is relative to it
        self.limit = self.capacity - min_headroom_bytes  # what a plan's peak may reach
        self.closest: tuple[float, tuple, Plan, int, Memory] | None = None
        self.threshold = float("inf")  # the k-th best step time found so far
        self._fullest_states: dict[tuple[Layout, ZeroStage, bool], tuple[float, int, Memory]] = {}
        # (pp, microbatches, schedule, vpp, split) -> the schedule rule it breaks ("": none)
        self._schedule_rule: dict[tuple[int, int, Schedule, int, bool], str] = {}
        # groups no member of which fits (their memory floor, their order): the 'smallest
        # plan' message looks into them only if nothing fits (:meth:`_note_dropped`)
        self._dropped: list[tuple[float, int, _Group]] = []
        self._fewest_memo: dict[tuple, tuple[tuple[int, int, int, Schedule], ...]] = {}
        self._vpp_layouts: dict[tuple[Layout, int], Layout] = {}
        self._fullest_memo: dict[tuple, tuple[tuple[StageWork, ...], list[tuple[int, int]]]] = {}
        # (what a group's members' activations depend on) -> (stage, work, activations,
        # moved to host) of the members holding the least activations on stages 0 and
        # last, of each kind (:meth:`memory_floor`)
        self._floor_members: dict[tuple, tuple[tuple[int, StageWork, float, float], ...]] = {}
        self._exact_bounds: dict[tuple, float] = {}  # :meth:`_candidate`
        # (layout, micro-batch, SP, ZeRO stand-in, recompute) -> :meth:`_layout_bound`
        self._layout_bounds: dict[tuple[Layout, int, bool, ZeroStage, Recompute], float] = {}
        self._cores: dict[tuple[Layout, int, bool, CpComm], LayerCore] = {}  # :meth:`_core`
        self._zero3_memo: dict[tuple, tuple[float, float]] = {}  # :meth:`_zero3_passes`
        # :meth:`_last_stage_states`
        self._last_states: dict[tuple[Layout, frozenset[int]], _LastStates] = {}

    # -- generation ------------------------------------------------------------------
    def layouts(self) -> Iterator[Layout]:
        """Every layout of the axes' degrees, expert foldings included."""
        n, space = self.cluster.gpus, self.space
        for t in tp.degrees(self.cluster, space):
            for p in pp.degrees(n // t, space):
                for c in cp.degrees(n // (t * p), space):
                    yield from ep.foldings(self.model, Layout(dp=n // (t * p * c), tp=t, pp=p, cp=c),
                                           space)

    def _probe(self, lay: Layout, mbs: int = 1, sp: bool = False,
               zero: ZeroStage = ZeroStage.NONE, cp_comm: CpComm = CpComm.RING,
               recompute: Recompute = Recompute.NONE) -> Plan:
        """A plan of the layout whose later choices are not read by the rules asked."""
        return Plan(model=self.model, cluster=self.cluster, job=self.job, stack=self.space.stack, layout=lay,
                    micro_batch=mbs, schedule=Schedule.ONE_F_ONE_B, recompute=recompute,
                    zero=zero, sequence_parallel=sp, cp_comm=cp_comm)

    # -- the walk ----------------------------------------------------------------------
    def groups(self) -> Iterator[_Group]:
        """Candidates grouped by everything but the schedule, after the rules of a valid
        plan (``parallel.rules``, decided as each choice is fixed) and the model-state
        check; each group carries a bound valid for all its schedules."""
        space, stats = self.space, self.stats
        # each group's recompute choices, in rank (a bundle stands for them: ``_Group``)
        recomputes = tuple(sorted(space.recompute, key=lambda rc: rc.level))
        for base in self.layouts():
            scheds = pp.schedule_choices(base, space)
            zeros = dp.zero_stages(base, space)
            sps = tp.sequence_parallel_choices(self.model, base, space)
            cps = cp.exchanges(self.model, base, self.job.seq_len, space)
            per_zero = len(scheds) * len(space.recompute) * len(cps)
            per_mbs = per_zero * len(zeros) * max(1, len(sps))
            stats.generated += per_mbs * len(space.micro_batches)
            probe = self._probe(base)
            rule = first_broken(probe, Scope.JOB) or first_broken(probe, Scope.LAYOUT)
            if rule is None and not sps:  # MoE with tp > 1 in a space without SP
                rule = BY_ID["moe-tp-needs-sp"]
            if rule:
                stats.pruned[rule.id] += per_mbs * len(space.micro_batches)
                continue
            for mbs in space.micro_batches:
                rule = first_broken(self._probe(base, mbs), Scope.MICRO_BATCH)
                if rule:
                    stats.pruned[rule.id] += per_mbs
                    continue
                for sp in sps:
                    rule = first_broken(self._probe(base, mbs, sp), Scope.SEQUENCE_PARALLEL)
                    if rule:
                        stats.pruned[rule.id] += per_mbs // len(sps)
                        continue
                    # the bounds read only the schedules that pass the schedule rules
                    runnable = self._runnable(base, mbs, sp, scheds)
                    # every group here starts at the layout's compute floor (a ZeRO-3
                    # group's own only if no other ZeRO stage has one): its ZeRO-3 floor
                    # and layout bound are worked out only if it comes up
                    floors: dict[bool, float] = {}
                    for zero in zeros:
                        zero3 = zero is ZeroStage.PARAMETERS and not floors
                        if not self._states_exceed_memory(base, zero, NO_OFFLOAD, mbs, sp):
                            probe = self._probe(base, mbs, sp, zero, cps[-1], recomputes[0])
                            if zero3 not in floors:
                                floors[zero3] = self._layout_floor(probe, cps, runnable)
                            yield self._group(probe, floors[zero3], scheds, cps, runnable,
                                              recomputes, steps=int(zero3))
                            continue
                        stats.infeasible["model states exceed memory"] += per_zero
                        # no member fits as it is: each offload the space allows is tried
                        for off in dp.offload_choices(base, zero, self.cluster, space)[1:]:
                            stats.generated += per_zero
                            if self._states_exceed_memory(base, zero, off, mbs, sp):
                                stats.infeasible["model states exceed memory"] += per_zero
                                continue
                            probe = self._probe(base, mbs, sp, zero, cps[-1], recomputes[0])
                            if zero3 not in floors:
                                floors[zero3] = self._layout_floor(probe, cps, runnable)
                            yield self._group(probe.replace(offload=off), floors[zero3], scheds,
                                              cps, runnable, recomputes, steps=int(zero3))

    def _group(self, plan: Plan, bound: float, scheds: Sequence[tuple[Schedule, int, bool]],
               cps: Sequence[CpComm], runnable: tuple[tuple[Schedule, int, bool], ...],
               recomputes: tuple[Recompute, ...] = (), steps: int = 0) -> _Group:
        return _Group(bound, rank_key_static(plan), plan, tuple(scheds), tuple(cps),
                      runnable=runnable, recomputes=recomputes if len(recomputes) > 1 else (),
                      laid=False, steps=steps)

    def _layout_floor(self, plan: Plan, cps: Sequence[CpComm],
                      scheds: Sequence[tuple[Schedule, int, bool]]) -> float:
        """A step time no plan of ``plan``'s layout, micro-batch, sequence parallelism and
        recompute (or more) beats, whatever its schedule of ``scheds`` (those passing the
        schedule rules), layer split, ZeRO stage (ZeRO-3 only where ``plan``'s is: its
        passes then count), offload or exchange of ``cps``, read off one layer's costs
        alone (``cost.stage.layer_core``): per layer, its forward, input- and
        weight-gradient compute, its forward TP collectives, its exposed CP exchange both
        ways, its MoE dispatch and combine both ways and what its recompute runs again
        (the attention's forward; or the whole forward with its TP, CP and MoE
        collectives: ``cost.stage._stage``); a forward alone: all but the gradients'
        compute, CP and recompute; and the output layer's logits' compute, once per
        microbatch on the stage holding it. The least over the exchanges (and over a
        dense and an MoE layer for a stage's layers) of the more of:

        - the mean: some stage runs at least the mean of the stages' work, and m
          microbatches of it one after another (``busiest_stage_bound``); the layers' and
          the logits' work is part of the stages' whatever the split;
        - where every schedule runs uniform stages (no split variant), the least over
          its kinds, flat and V, of: stage p - 1, holding at least floor(L/p) layers (and
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
        sends, ZeRO-3 elsewhere, offload) only adds to it."""
        model = plan.model
        p, m, layers = plan.layout.pp, plan.num_microbatches, model.layers
        moe = model.moe_layers if model.is_moe else 0
        uniform = p > 1 and not any(split for *_, split in scheds)
        flat = [layers // (p * v) if v > 1 else layers // p
                for sched, v, _ in scheds if not sched.v_shape]
        v_shaped = any(sched.v_shape for sched, _, _ in scheds)
        zero3 = uniform and plan.zero is ZeroStage.PARAMETERS
        states = self._last_stage_states(plan, scheds) if zero3 else ((), None)
        least = float("inf")
        for cp_comm in cps:
            core = self._core(plan, cp_comm)
            lt, lt_moe = core.lt, core.lt_moe
            forward = lt.forward + core.tp_layer + core.cp_f
            forward_moe = forward - lt.forward + lt_moe.forward + core.ep_layer
            per_dense = forward + lt.backward_input + lt.backward_weight + core.cp_b
            per_moe = (forward_moe + lt_moe.backward_input + lt_moe.backward_weight + core.cp_b
                       + core.ep_layer)
            if plan.recompute is Recompute.FULL:
                per_dense, per_moe = per_dense + forward, per_moe + forward_moe
            elif plan.recompute is Recompute.SELECTIVE:
                per_dense += lt.attention_forward
                per_moe += lt_moe.attention_forward
            logits = sum(core.logits)
            floor = m * ((layers - moe) * per_dense + moe * per_moe + logits) / p
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
                kinds = []
                if flat:
                    kinds.append((p - 1) * min(flat) * forward + stage + m * (logits + z_flat))
                if v_shaped:
                    kinds.append(max((p - 1) * (layers // (2 * p)) * forward + stage + m * z_v,
                                     stage + m * logits))
                floor = max(floor, min(kinds))
            least = min(least, floor)
        return least

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
        """ZeRO-3's exposed passes per microbatch on stage p - 1 (:meth:`_layout_floor`) at
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

    def _last_stage_states(self, plan: Plan, scheds: Sequence[tuple[Schedule, int, bool]]
                           ) -> _LastStates:
        """(non-expert parameters, expert parameters, layers run) of stage p - 1 of the
        uniform members of ``scheds``: of the flat ones, per chunk count (the stage holds
        the output layer and the MTP modules, and its own dense layers:
        ``pp.dense_per_stage``), and of the V ones (virtual stages p - 1 and p), None
        without; what ZeRO-3 gathers there (:meth:`_layout_floor`). Per layout and chunk
        counts."""
        vs = frozenset(0 if sched.v_shape else v for sched, v, _ in scheds)  # V: 0
        key = (plan.layout, vs)
        hit = self._last_states.get(key)
        if hit is not None:
            return hit
        model, lay = self.model, plan.layout
        last = lay.pp - 1
        flat: list[_StageState] = []
        for v in sorted(vs - {0}):
            member = plan.replace(layout=self._at_vpp(lay, v), schedule=(
                Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B))
            layers = member.stage_layers[last]
            flat.append((*stage_state_params(model, lay, False, True, layers,
                                             dense_per_stage(member)[last]),
                         layers + model.mtp_layers))
        v_state: _StageState | None = None
        if 0 in vs:
            member = plan.replace(layout=self._at_vpp(lay, 2), schedule=V_WORK)
            layers = member.stage_layers[last]
            v_state = (*stage_state_params(model, lay, False, False, layers,
                                           dense_per_stage(member)[last], 0), layers)
        out = self._last_states[key] = (tuple(dict.fromkeys(flat)), v_state)
        return out

    def _laid(self, group: _Group) -> _Group:
        """The group with its layout's bound (:meth:`_layout_bound`, for every ZeRO stage
        below 3, or ZeRO-3, as the group's, and for its recompute and every recompute above
        it (a bundle's recompute is its least); shifted by its offload,
        ``_offloaded_bound``) where that passes its floor: worked out once for each
        layout, micro-batch, sequence parallelism, kind of ZeRO and recompute that comes
        up. A ZeRO-3 group first takes its own compute floor (:meth:`_layout_floor`,
        with ZeRO-3's passes), then the bound of the stages below 3, where one of them
        shards the optimizer as ZeRO-3 does (ZeRO-3 only adds gathers to their work):
        where one raises its bound it comes back (``steps``), laid only when it comes up
        again (most do not; ZeRO-3's bound needs stage works of its own)."""
        plan = group.plan
        zeros = dp.zero_stages(plan.layout, self.space)
        below: ZeroStage | None = max(
            (z for z in zeros if z is not ZeroStage.PARAMETERS), default=None)
        if plan.zero is ZeroStage.PARAMETERS:
            if group.steps < 1:
                floor = self._layout_floor(plan, group.cp_comms, group.runnable)
                group = dataclasses.replace(group, steps=1)
                if floor > group.bound:
                    return dataclasses.replace(group, bound=floor)
            if group.steps < 2:
                group = dataclasses.replace(group, steps=2)
                if below is not None and below >= ZeroStage.OPTIMIZER:
                    shared = self._offloaded(self._shared_layout_bound(group, below), plan)
                    if shared > group.bound:
                        return dataclasses.replace(group, bound=shared)
            below = ZeroStage.PARAMETERS
        assert below is not None
        own = self._offloaded(self._shared_layout_bound(group, below), plan)
        return dataclasses.replace(group, bound=max(group.bound, own), laid=True)

    def _fully_laid(self, group: _Group) -> _Group:
        """:meth:`_laid` until it is (for tests and tools)."""
        while not group.laid:
            group = self._laid(group)
        return group

    def _shared_layout_bound(self, group: _Group, zero: ZeroStage) -> float:
        """:meth:`_layout_bound` of the group's layout, micro-batch, sequence parallelism
        and recompute at ``zero``, memoized."""
        plan = group.plan
        key = (plan.layout, plan.micro_batch, plan.sequence_parallel, zero, plan.recompute)
        shared = self._layout_bounds.get(key)
        if shared is None:
            shared = self._layout_bounds[key] = self._layout_bound(
                plan.layout, plan.micro_batch, plan.sequence_parallel, zero, plan.recompute,
                group.cp_comms, group.runnable)
        return shared

    def _offloaded(self, bound: float, plan: Plan) -> float:
        """``bound``, of the plan's layout without offload, for the plan's offload."""
        return self._offloaded_bound(bound, plan, plan.offload) if plan.offload.any else bound

    def unbundled(self, group: _Group) -> list[_Group]:
        """The groups a bundle stands for (the group itself if it is none), in rank: the
        first, at the bundle's recompute, with the bundle's bound; the others with their
        own recompute's layout compute floor if more, to be laid at their own
        recompute's layout bound when they come up."""
        if not group.recomputes:
            return [group]
        out = []
        for i, rc in enumerate(group.recomputes):
            plan = group.plan.replace(recompute=rc)
            bound = group.bound if i == 0 else max(
                group.bound, self._layout_floor(plan, group.cp_comms, group.runnable))
            # (a ZeRO-3 group's floor at its recompute is its own ZeRO-3 floor)
            out.append(dataclasses.replace(
                self._group(plan, bound, group.schedules, group.cp_comms, group.runnable),
                laid=group.laid and i == 0,
                steps=group.steps if i == 0 else int(plan.zero is ZeroStage.PARAMETERS)))
        return out

    def each_group(self) -> Iterator[_Group]:
        """:meth:`groups`, bundles opened, each with its layout's bound (for tests and
        tools)."""
        for group in self.groups():
            for each in self.unbundled(self._fully_laid(group)):
                yield self._fully_laid(each)

    def wants_offload(self, group: _Group, floor: Memory | None) -> bool:
        """Whether the search tries the group's offload variants: it keeps nothing in host
        memory, and no member of its uniform layer splits fits as it is (the group's memory
        floor, ``floor``, over them passes the limit). The search offloads what does not fit
        without it; a group whose model states alone do not fit is offloaded at generation
        (``groups``)."""
        if group.plan.offload.any or len(self.space.offload) == 1:
            return False
        if floor is None:  # split variants: their uniform members' floor decides
            uniform = tuple(x for x in group.schedules if not x[2])
            if not uniform:
                return False
            floor = self.memory_floor(dataclasses.replace(group, schedules=uniform))
        return floor is not None and floor.peak > self.limit

    def offloaded(self, group: _Group) -> list[_Group]:
        """The group's offload variants, where the space and the plan's rules allow them
        (each offload choice passing ``dp.offload_choices``), each bounded from the group's
        own bound (exact: asked once it is), shifted by ``_offloaded_bound``. Asked only for
        a group none of whose members fits: the search offloads what does not fit as it is
        (module doc)."""
        plan = group.plan
        out = []
        for off in dp.offload_choices(plan.layout, plan.zero, self.cluster, self.space)[1:]:
            # the group's own bound, as ``_group_bound`` would find it for the variant but
            # for its optimizer term (``_offloaded_bound``): nothing else in it moves
            bound = self._offloaded_bound(group.bound, plan, off)
            out.append(dataclasses.replace(group, plan=plan.replace(offload=off), bound=bound,
                                           key=rank_key_static(plan.replace(offload=off)),
                                           bare=bound, floored=False))
        self.stats.generated += sum(g.size for g in out)
        return out

    def _offloaded_bound(self, bound: float, plan: Plan, off: Offload) -> float:
        """``bound``, valid for ``plan``'s group without offload (or for every group of its
        layout), made valid for the group offloading as ``off``.

        A group's bounds charge the optimizer step as c x p: seconds per parameter
        (``dp.optimizer_seconds_per_param``, c_gpu on the GPU, c_off offloaded) times the
        parameters of the fullest rank's shard, p, which no layer split or chunking brings
        below the mean over stages, p_mean (the stages' parameters add up to the model's).
        Everything else in them is the same with and without offload (activation offload
        only adds time, and memory is charged later, at the group's own floor). So the
        group's own bound is at least its non-offloaded twin's, at least ``bound``, plus
        (c_off - c_gpu) x p_mean where c_off >= c_gpu; where c_off < c_gpu, minus
        (c_gpu - c_off) x the whole model's per-rank parameters (p is at most that)."""
        if not off.optimizer:
            return bound
        plan = plan.replace(recompute=Recompute.NONE, offload=NO_OFFLOAD)
        works = stage_work(plan)
        c_gpu = dp.optimizer_seconds_per_param(plan)
        c_off = dp.optimizer_seconds_per_param(plan.replace(offload=off))
        shards = [dp.optimizer_params(plan, w.params, w.expert_params) for w in works]
        if c_off >= c_gpu:
            return bound + (c_off - c_gpu) * sum(shards) / len(shards)
        return bound - (c_gpu - c_off) * sum(shards)

    def _states_exceed_memory(self, lay: Layout, zero: ZeroStage, off: Offload, mbs: int,
                              sp: bool) -> bool:
        """Weights, grads and optimizer states of the fullest stage (no activations) plus
        the reserve already exceed the device: no micro-batch or recompute can help.
        Such a candidate still counts for the 'smallest plan needs ...' message. The
        states depend on the layout, ZeRO and the optimizer's offload only: worked out
        once for every micro-batch and sequence-parallel choice."""
        key = (lay, zero, off.optimizer)
        worst = self._fullest_states.get(key)
        if worst is not None and worst[0] <= self.limit:
            return False
        if worst is not None and self.closest is not None and worst[0] > self.closest[0]:
            return True  # the 'smallest plan' already noted holds less
        plan = Plan(model=self.model, cluster=self.cluster, job=self.job, stack=self.space.stack, layout=lay,
                    micro_batch=mbs, schedule=Schedule.ONE_F_ONE_B, recompute=Recompute.FULL,
                    zero=zero, sequence_parallel=sp, offload=off)
        if worst is None:
            worst = self._fullest_states[key] = self._fullest_state(plan)
        if worst[0] <= self.limit:
            return False
        self._note_closest(plan, worst[1], worst[2])
        return True

    def _fullest_state(self, plan: Plan) -> tuple[float, int, Memory]:
        """(peak, stage, memory) of the stage holding the most model state."""
        lay = plan.layout
        layers, dense = plan.stage_layers, dense_per_stage(plan)
        reserve = self.cluster.device.reserve_bytes
        last = lay.pp - 1
        worst: tuple[float, int, Memory] | None = None
        # the stage with the most MoE layers (then the most layers) holds the most state
        heaviest = max(range(lay.pp), key=lambda i: (layers[i] - dense[i], layers[i]))
        for s in sorted({0, last, heaviest}):
            st = state_bytes(plan, *stage_state_params(self.model, lay, s == 0, s == last,
                                                       layers[s], dense[s]))
            mem = Memory(weights=st.weights, grads=st.grads, optimizer=st.optimizer,
                         activations=0.0, other=reserve)
            if worst is None or mem.peak > worst[0]:
                worst = (mem.peak, s, mem)
        assert worst is not None
        return worst

    def _note_closest(self, plan: Plan, stage: int, mem: Memory) -> None:
        key = (mem.peak, rank_key_static(plan))
        if self.closest is None or key < self.closest[:2]:
            self.closest = (mem.peak, key[1], plan, stage, mem)

    def _layout_bound(self, base: Layout, mbs: int, sp: bool, zero: ZeroStage,
                      recompute: Recompute, cps: Sequence[CpComm],
                      scheds: Sequence[tuple[Schedule, int, bool]]) -> float:
        """A bound valid for the groups of a layout, micro-batch and sequence parallelism
        at ``recompute`` or any recompute above it, and at ``zero``: ZeRO-3, or standing in
        for every stage below 3, so that a group's own bound is computed only if the group
        comes up. It is the group bound (:meth:`_group_bound`) of the member at
        ``recompute`` (more recompute only adds forward time to the backward) and
        ``zero``, without the gradient sync, which differs by ZeRO stage: stages 0-2 run
        the same per-stage work and 1 and 2 step a shard of the optimizer (less time
        than 0), so the highest below 3 in the space stands for them. The schedules are
        those that pass the schedule rules (``_runnable``)."""
        return self._group_bound(
            Plan(model=self.model, cluster=self.cluster, job=self.job, stack=self.space.stack,
                 layout=base, micro_batch=mbs, schedule=Schedule.ONE_F_ONE_B,
                 recompute=recompute, zero=zero, sequence_parallel=sp, cp_comm=cps[-1]),
            scheds, cps, sync=False)

    def _group_bound(self, plan: Plan, scheds: Sequence[tuple[Schedule, int, bool]],
                     cps: Sequence[CpComm] = (), sync: bool = True) -> float:
        """A step time no schedule of ``scheds`` on any exchange of ``cps`` (the plan's own
        where none are given) beats: the least over the exchanges of the busiest stage's
        with the pipeline's fill and drain (``cost.bounds.busiest_stage_bound``), itself
        the least of the one read off the stage works of the group's 1F1B, vpp = 1 member
        on that exchange, at the most chunks any of its flat schedules runs (its drain
        their whole backward where none splits it), and, where it has V schedules, the one
        read off the V's own works (its output layer on stage 0,
        two chunks). Where the group has split variants, the least bottleneck any split
        can reach (``stages.split_bound`` without the fill, which differs by schedule) if
        lower. ``sync``: the uniform splits' bounds count the gradient sync of the plan's
        ZeRO stage that no drain hides, or the one the stage ending the step exposes if
        more (:meth:`_drained_sync`); not where the bound stands for other ZeRO stages."""
        cps = tuple(cps) or (plan.cp_comm,)
        split = any(s for *_, s in scheds)
        flat = [v for sched, v, _ in scheds if not sched.v_shape]
        fused = not any(sched.splits_backward for sched, _, _ in scheds if not sched.v_shape)
        v_base = plan.replace(layout=self._at_vpp(plan.layout, 2), schedule=V_WORK)
        drained = (self._drained_sync(plan, stage_work(plan), v_base, scheds, cps)
                   if sync else 0.0)
        bound = float("inf")
        for cp_comm in cps:
            own = plan if cp_comm is plan.cp_comm else plan.replace(cp_comm=cp_comm)
            works = stage_work(own)
            if flat:
                most = max(flat)
                bound = min(bound, busiest_stage_bound(own, works, most, sync, most == 1,
                                                       drained, fused))
            if len(flat) < len(scheds):
                v_plan = (v_base if own is plan
                          else own.replace(layout=v_base.layout, schedule=V_WORK))
                bound = min(bound, busiest_stage_bound(v_plan, stage_work(v_plan), 2,
                                                       sync, True, drained))
            if split:
                bound = min(bound, split_bound(own, works, fill=False))
        return bound

    def _drained_sync(self, plan: Plan, works: tuple[StageWork, ...], v_plan: Plan,
                      scheds: Sequence[tuple[Schedule, int, bool]],
                      cps: Sequence[CpComm]) -> float:
        """A gradient sync every uniform-split member of the group exposes, its schedule
        and chunks of ``scheds``, its exchange of ``cps`` (``dp.grad_sync_drained_least``,
        with each stage's longest backward per chunk of any member); 0 where none is one.

        ``works``: the 1F1B, one-chunk works at ``plan``'s exchange. A flat member on
        exchange c runs the layers of the 1F1B works at c but that, splitting the
        backward, it exposes its backward TP collectives in full, which those hide
        behind W up to its length (``tp.exposed_backward``): its backward is at most
        theirs plus W's compute. On v > 1 chunks it sends at most v gradients back
        where those works send at least none (``pp.sends``): its backward per chunk is
        at most theirs over v plus one send. A V member runs the V's own works at c
        (``cost_key``: every V schedule the same), two chunks. Split variants, whose
        layers move, are bounded apart (``split_bound``)."""
        if plan.zero is ZeroStage.PARAMETERS:
            return 0.0
        exchanges = [plan.cp_comm, *(c for c in cps if c is not plan.cp_comm)]
        flat = [(sched.splits_backward, v) for sched, v, split in scheds
                if not split and not sched.v_shape]
        least = float("inf")
        if flat:
            send = (pp.send_seconds(plan, activation_bytes(plan))
                    if any(v > 1 for _, v in flat) else 0.0)
            splits = any(b for b, _ in flat)
            sets = [works, *(stage_work(plan.replace(cp_comm=c)) for c in exchanges[1:])]
            least = self._drained_of(plan, self._drain_stages(sets, splits), send, 1)
        if any(sched.v_shape and not split for sched, _, split in scheds):
            sets = [stage_work(v_plan), *(stage_work(v_plan.replace(cp_comm=c))
                                          for c in exchanges[1:])]
            least = min(least, self._drained_of(plan, self._drain_stages(sets, False), 0.0, 2))
        return 0.0 if least == float("inf") else least

    @staticmethod
    def _drained_of(plan: Plan, stages: list[tuple[float, float, float]], send: float,
                    chunks: int) -> float:
        """``dp.grad_sync_drained_least`` of ``stages`` (:meth:`_drain_stages`), each
        stage's longest backward per chunk its longest backward over ``chunks``, plus
        ``send``."""
        return dp.grad_sync_drained_least(plan, mesh.groups(plan), [
            (params, experts, longest / chunks + send) for params, experts, longest in stages])

    @staticmethod
    def _drain_stages(sets: list[tuple[StageWork, ...]], with_w: bool
                      ) -> list[tuple[float, float, float]]:
        """Per stage of ``sets`` (stage works holding the same layers and parameters per
        stage): its parameters, expert parameters and longest backward (plus W's compute
        where ``with_w``) of any set; a run of equal stages once."""
        stages = []
        previous = None
        for s, w in enumerate(sets[0]):
            if w is previous and len(sets) == 1:
                continue
            previous = w
            longest = max(ws[s].backward + (ws[s].compute_w if with_w else 0.0) for ws in sets)
            stages.append((w.params, w.expert_params, longest))
        return stages

    def schedule_plans(self, group: _Group, count: bool = True) -> Iterator[tuple[Plan, bool]]:
        """The group's plans, one per (schedule, vpp, split) and exchange, that pass the
        schedule rules, with whether the split is still to be searched; ``count``: those
        that break one are counted by the rule. The schedule rules read neither the
        exchange nor the split: asked once a schedule."""
        cps, lay = group.cp_comms, group.plan.layout
        m, memo = group.plan.num_microbatches, self._schedule_rule
        for sched, v, split in group.schedules:
            rule = memo[(lay.pp, m, sched, v, split)]  # asked by ``_runnable``
            if rule:
                if count:
                    self.stats.pruned[rule] += len(cps)
                continue
            first = self._scheduled(group.plan.replace(cp_comm=cps[0]), sched, v, split)
            for cp_comm in cps:
                yield (first if cp_comm is cps[0] else first.replace(cp_comm=cp_comm)), split

    def _scheduled(self, plan: Plan, sched: Schedule, v: int, split: bool) -> Plan:
        """``plan`` (vpp = 1) run by ``sched`` on ``v`` chunks, as the schedule rules see it."""
        base, layers = plan.layout, self.model.layers
        out = plan.replace(layout=self._at_vpp(base, v), schedule=sched)
        if split and v > 1 and layers >= base.pp * v:
            # a per-chunk layout needs no pp*vpp | layers: the rules see one (its
            # near-uniform stand-in until the partitioner picks the split)
            out = out.replace(chunks=chunks_of(out, uniform_stages(layers, base.pp)))
        return out

    def _runnable(self, base: Layout, mbs: int, sp: bool,
                  scheds: Sequence[tuple[Schedule, int, bool]]) -> tuple[tuple[Schedule, int, bool], ...]:
        """The schedules passing the schedule rules, which read the layout, the chunks and
        the microbatch count only (not ZeRO, recompute or the exchange): the bounds of
        the layout's groups need count no other. All of them where none passes (their
        groups then end in the rules' count)."""
        probe = self._probe(base, mbs, sp)
        m, memo = probe.num_microbatches, self._schedule_rule
        out = []
        for x in scheds:
            key = (base.pp, m, *x)
            broken = memo.get(key)
            if broken is None:
                rule = first_broken(self._scheduled(probe, *x), Scope.SCHEDULE)
                broken = memo[key] = rule.id if rule else ""
            if not broken:
                out.append(x)
        return tuple(out) or tuple(scheds)

    def expand(self, group: _Group) -> list[_Candidate | _Split]:
        """The group's schedules: uniform splits that fit in memory as candidates with
        their own bound; split variants deferred with the group's bound, valid for any
        split of any of its schedules (tightened only for those that come up)."""
        out: list[_Candidate | _Split] = []
        limit = self.threshold * (1 + BOUND_SLACK)
        # (exchange, vpp, B and W fused) -> the busiest-stage bound off the group's works
        # on that exchange (vpp 0: off its V works, as ``_group_bound`` reads them)
        busiest: dict[tuple[CpComm, int, bool], float] = {}
        # (exchange, B and W fused) -> its flat :meth:`_drain_stages`, for every chunk count
        drains: dict[tuple[CpComm, bool], list[tuple[float, float, float]]] = {}
        for plan, split in self.schedule_plans(group):
            if split:
                out.append(_Split(group.bound, rank_key_static(plan), plan))
                continue
            v = 0 if plan.schedule.v_shape else plan.layout.vpp
            fused = not plan.schedule.splits_backward
            bare = busiest.get((plan.cp_comm, v, fused))
            if bare is None:
                own = (group.plan if plan.cp_comm is group.plan.cp_comm
                       else group.plan.replace(cp_comm=plan.cp_comm))
                # with the gradient sync its own chunks expose where its stage ends the
                # step (as :meth:`_drained_sync` bounds it for the group's every member)
                if v:  # the busiest-stage bound at its own chunk count
                    works = stage_work(own)
                    send = (pp.send_seconds(own, activation_bytes(own)) if v > 1 else 0.0)
                    stages = drains.get((plan.cp_comm, fused))
                    if stages is None:
                        stages = drains[(plan.cp_comm, fused)] = self._drain_stages(
                            [works], not fused)
                    drained = self._drained_of(own, stages, send, v)
                    bare = busiest_stage_bound(own, works, v, True, v == 1, drained, fused)
                else:  # its works place the output layer on stage 0: the V works'
                    v_plan = own.replace(layout=self._at_vpp(own.layout, 2),
                                         schedule=V_WORK)
                    works = stage_work(v_plan)
                    drained = self._drained_of(own, self._drain_stages([works], False), 0.0, 2)
                    bare = busiest_stage_bound(v_plan, works, 2, True, True, drained)
                busiest[(plan.cp_comm, v, fused)] = bare
            # the group's bounds hold for it: the pressure-free one, and the one that
            # charges the group's memory floor (its own peak is no lower)
            bare = max(bare, group.bare)
            bound = max(bare, group.bound)
            if bound > limit:
                self.stats.pruned[BOUND] += 1
                continue
            # its own works, bound and memory wait until it comes up (:meth:`run`)
            out.append(_Candidate(bound, rank_key_static(plan), plan, pending=True, bare=bare))
        return out

    def _candidate(self, plan: Plan) -> _Candidate | None:
        """The plan as a candidate with its exact lower bound, or None (and counted) when
        that bound already cannot beat the k-th best step time found. Its memory is
        checked only when it comes up (:meth:`checked`): most candidates never do.

        The bound reads the plan's stage works (``cost_key`` and the layer split), ZeRO
        stage and offload, and its schedule only through the works but for offloaded
        activations' copies: plans alike in those (GPipe and 1F1B; ZB-H1 and ZB-H2; the
        V schedules) share one."""
        key = (cost_key(plan), plan.stages, plan.chunks, plan.zero, plan.offload,
               plan.schedule if plan.offload.activations else None)
        bound = self._exact_bounds.get(key)
        if bound is None:
            bound = self._exact_bounds[key] = step_time_lower_bound(plan, stage_work(plan))
        if bound > self.threshold * (1 + BOUND_SLACK):
            self.stats.pruned[BOUND] += 1
            return None
        return _Candidate(bound, rank_key_static(plan), plan)

    def checked(self, item: _Candidate) -> _Candidate | None:
        """The candidate with its memory checked: None (and counted) when it does not fit,
        else its bound with the allocator's pressure, which grows with the step and the
        peak (charged without the stack's fixed overhead, as evaluate charges it)."""
        worst = self._fitting_memory(item.plan, stage_work(item.plan))
        return None if worst is None else self._fitted(item, worst)

    def _fitted(self, item: _Candidate, worst: Memory) -> _Candidate:
        """The candidate known to fit, its pressure-free bound charged the pressure of its
        peak (at least what its group's floor charged: the peak is no lower)."""
        bare = item.unpressured
        pressure = memory_pressure(bare - step_overhead(item.plan), worst.peak, self.capacity)
        return _Candidate(max(item.bound, bare + pressure), item.key, item.plan, fits=True,
                          chained=item.chained)

    def _fitting_memory(self, plan: Plan, works: tuple[StageWork, ...]) -> Memory | None:
        """The memory of the plan's fullest stage, or None (counted, and noted for the
        'smallest plan' message) when it exceeds the device. ``works`` need only hold the
        plan's per-stage layers and parameters: those of any schedule of its layout but
        a V (which moves the output layer to stage 0), at any vpp."""
        stage, worst, host = self._fullest_and_host(plan, works)
        if worst.peak > self.limit:
            self.stats.infeasible[self._why_not(worst)] += 1
            self._note_closest(plan, stage, worst)
            return None
        capacity = self.cluster.host_mem_bytes
        if capacity is not None and self.cluster.gpus_per_node * host > capacity:
            # the host memory an offloading plan takes per node (every GPU of a node as
            # the fullest stage's, as ``evaluate`` counts it) does not fit the cluster's
            self.stats.infeasible[HOST_MEMORY] += 1
            return None
        return worst

    def _why_not(self, mem: Memory) -> str:
        """Why ``mem``, past the limit, does not fit: its model states alone, or with them
        its activations."""
        static = mem.weights + mem.grads + mem.optimizer + mem.other
        return "model states exceed memory" if static > self.limit else "activations exceed memory"

    def memory_floor(self, group: _Group) -> Memory | None:
        """Memory no member of the group needs less than (None where this does not say:
        a group with split variants, whose layer splits move memory between stages).

        A member's peak is its fullest stage's, so at least what it holds on any one
        stage s; so the most, over s in {0, last}, of the least any member holds on s
        bounds every member's peak from below. On s, a member of v equal chunks holding
        n microbatch-chunks in flight (``peak_inflight``) holds its weights, gradients and
        optimizer states (the same for every schedule but a V, whose stage 0 holds the
        output layer), n/v of the stage's activations per microbatch and, on the first
        and output stage, ceil(n/v) microbatches' embedding output and logits
        (``stage_memory``): all growing with n/v, so the member with the fewest
        microbatches in flight, n/v, holds the least of the flat schedules, and the one
        with the fewest chunks in flight of the V schedules (``stage_memory`` of that
        member is then the least on s). Schedules that break a schedule rule are no
        members. ``test_bounds`` checks the floor against every member's evaluated peak."""
        lay = group.plan.layout
        if group.plan.offload.activations:
            # offloaded activations keep 1 + (n - 1)(1 - a) chunks of n: the fewest in
            # flight need not hold the least, so every member is asked
            fewest = self._every_inflight(lay, group.plan.num_microbatches, group.schedules)
        else:
            fewest = self._fewest_inflight(lay, group.plan.num_microbatches, group.schedules)
        if not fewest:
            return None
        # Members of one kind (flat, or V) hold the same model states on a stage, whatever
        # their ZeRO stage or optimizer offload: the one holding the least activations
        # there holds the least. Which one that is, and what activations it holds, depend
        # on neither: found once for the groups alike but for them, whose floor then adds
        # only their own states (``memory_with``).
        plan = group.plan
        alike = (lay, plan.micro_batch, plan.sequence_parallel, plan.recompute, plan.cp_comm,
                 plan.offload.activations, group.schedules)
        known = self._floor_members.get(alike)
        least: dict[int, Memory] = {}  # stage -> the least any member holds there
        if known is not None:
            for s, work, held, moved in known:
                mem = memory_with(plan, work, held, moved)
                if s not in least or mem.peak < least[s].peak:
                    least[s] = mem
            return max(least.values(), key=lambda mem: mem.peak)
        flat = stage_work(plan)
        # (stage, V) -> the least activations of a member, and what the floor keeps of it
        fewest_act: dict[tuple[int, bool], tuple[float, int]] = {}
        asked = []
        for i, (s, n, v, sched) in enumerate(fewest):
            at = plan.replace(layout=self._at_vpp(lay, v), schedule=sched)
            work = (stage_work(at) if sched.v_shape else flat)[s]
            held, moved = held_activations(at, s, work, n)
            asked.append((s, work, held, moved))
            mem = memory_with(plan, work, held, moved)  # stage_memory(at, s, work, n)
            if s not in least or mem.peak < least[s].peak:
                least[s] = mem
            kind = (s, sched.v_shape)
            if kind not in fewest_act or held < fewest_act[kind][0]:
                fewest_act[kind] = (held, i)
        chosen = sorted(i for _, i in fewest_act.values())
        self._floor_members[alike] = tuple(asked[i] for i in chosen)
        return max(least.values(), key=lambda mem: mem.peak)

    def _every_inflight(self, lay: Layout, m: int, schedules: tuple[tuple[Schedule, int, bool], ...]
                        ) -> tuple[tuple[int, int, int, Schedule], ...]:
        """(stage, in flight, vpp, schedule) of every member passing the schedule rules on
        stages 0 and last, the first of those alike in all ``stage_memory`` reads of them
        (stage, in flight, vpp and whether a V places the output layer); empty where a
        member is a split variant."""
        if any(split for *_, split in schedules):
            return ()
        memo = self._schedule_rule
        out: dict[tuple[int, int, int, bool], tuple[int, int, int, Schedule]] = {}
        for sched, v, split in schedules:
            if memo[(lay.pp, m, sched, v, split)]:
                continue
            for s in sorted({0, lay.pp - 1}):
                n = peak_inflight(sched, lay.pp, m, v, s)
                out.setdefault((s, n, v, sched.v_shape), (s, n, v, sched))
        return tuple(out.values())

    def _fewest_inflight(self, lay: Layout, m: int, schedules: tuple[tuple[Schedule, int, bool], ...]
                         ) -> tuple[tuple[int, int, int, Schedule], ...]:
        """(stage, in flight, vpp, schedule) per stage in {0, last} and kind (flat first,
        then V) of the member holding the fewest microbatches in flight there (n/vpp);
        empty where a member is a split variant or none passes the schedule rules.
        Memoized: every ZeRO and recompute group of a layout and micro-batch asks it."""
        key = (lay.pp, m, schedules)
        out = self._fewest_memo.get(key)
        if out is not None:
            return out
        memo = self._schedule_rule
        fewest: dict[tuple[int, bool], tuple[int, int, Schedule]] = {}  # (stage, V) -> (n, v, sched)
        stages = sorted({0, lay.pp - 1})
        for sched, v, split in schedules:
            if split:
                fewest.clear()
                break
            if memo[(lay.pp, m, sched, v, split)]:
                continue
            for s in stages:
                n = peak_inflight(sched, lay.pp, m, v, s)
                held = fewest.get((s, sched.v_shape))
                if held is None or n * held[1] < held[0] * v:
                    fewest[(s, sched.v_shape)] = (n, v, sched)
        out = self._fewest_memo[key] = tuple((s, *fewest[(s, vs)]) for s, vs in sorted(fewest))
        return out

    def _at_vpp(self, lay: Layout, vpp: int) -> Layout:
        """``lay`` at ``vpp`` chunks, built once per (layout, vpp)."""
        if lay.vpp == vpp:
            return lay
        out = self._vpp_layouts.get((lay, vpp))
        if out is None:
            out = self._vpp_layouts[(lay, vpp)] = dataclasses.replace(lay, vpp=vpp)
        return out

    def _drop(self, group: _Group, floor: Memory, order: int) -> None:
        """Count a group no member of which fits: its schedules that break a schedule
        rule by that rule, the others as not fitting, and keep it for the 'smallest plan'
        message."""
        lay, m = group.plan.layout, group.plan.num_microbatches
        reason = self._why_not(floor)
        for sched, v, split in group.schedules:
            rule = self._schedule_rule[(lay.pp, m, sched, v, split)]
            if rule:
                self.stats.pruned[rule] += len(group.cp_comms)
            else:
                self.stats.infeasible[reason] += len(group.cp_comms)
        self._dropped.append((floor.peak, order, group))

    def _note_dropped(self) -> None:
        """Where nothing fits, the 'smallest plan' message names the member needing the
        least memory: the dropped groups are looked into, least floor first, while one
        could still hold a member below the smallest noted so far."""
        for floor, _, group in sorted(self._dropped, key=lambda d: d[:2]):
            if self.closest is not None and floor > self.closest[0]:
                break
            for plan, _ in self.schedule_plans(group, count=False):  # counted when dropped
                stage, mem = self._fullest(plan, stage_work(plan))
                self._note_closest(plan, stage, mem)

    def _fullest(self, plan: Plan, works: tuple[StageWork, ...]) -> tuple[int, Memory]:
        """(stage, memory) of the plan's fullest stage, the first of equals (as
        ``evaluate``)."""
        stage, worst, _ = self._fullest_and_host(plan, works)
        return stage, worst

    def _fullest_and_host(self, plan: Plan, works: tuple[StageWork, ...]
                          ) -> tuple[int, Memory, float]:
        """(stage, memory) of the plan's fullest stage, the first of equals (as
        ``evaluate``), and the most any stage keeps in host memory. The stages that can be
        fullest (``_fullest_stages``) depend on the schedule, the microbatch count and the
        works only: found once for each (the memo keeps the works it was keyed on alive, so
        their id is not reused). What a stage keeps on the host grows, within a class of
        equal stages, with its parameters and microbatches in flight as its device memory
        does: those stages hold the most on the host too."""
        lay = plan.layout
        key = (plan.schedule, lay.pp, plan.num_microbatches, lay.vpp, id(works))
        hit = self._fullest_memo.get(key)
        if hit is None:
            hit = self._fullest_memo[key] = (works, _fullest_stages(plan, works))
        mems = [(s, stage_memory(plan, s, works[s], n)) for s, n in hit[1]]
        stage, worst = max(mems, key=lambda sm: (sm[1].peak, -sm[0]))
        return stage, worst, max(m.host for _, m in mems)

    def realize(self, item: _Split) -> _Candidate | _Split | None:
        """Tighten the split variant's bound, first with its schedule's pipeline fill,
        then with each stage's memory (back to the queue each time that raises it), then
        find its best layer split: the partitioner runs only for splits that can still
        enter the top k, and each tightening only for variants that come up."""
        if not item.filled:
            bound = split_bound(item.plan, self._group_works(item.plan))
            if bound > item.bound:
                return _Split(bound, item.key, item.plan, filled=True)
        problem = item.problem
        if problem is None:
            problem = partition_problem(item.plan, self.space.stage_shape)
            capped = split_bound_with_memory(item.plan, problem, self._group_works(item.plan))
            if capped is None:
                self.stats.infeasible["no layer split the launcher can express fits memory"] += 1
                return None
            if capped > item.bound:
                return _Split(capped, item.key, item.plan, True, problem)
        plan = with_best_stages(item.plan, self.space.stage_shape, problem)
        if plan is None:
            self.stats.infeasible["no layer split the launcher can express fits memory"] += 1
            return None
        if plan.stages is None and plan.chunks is None:
            self.stats.pruned[SPLIT_IS_UNIFORM] += 1
            return None
        return self._candidate(plan)

    def _group_works(self, plan: Plan) -> tuple[StageWork, ...]:
        """Per-stage work of the plan's uniform 1F1B, vpp = 1 form: what the split
        bounds read of it (parameters per stage) whatever the schedule and chunks."""
        return stage_work(dataclasses.replace(
            plan, layout=dataclasses.replace(plan.layout, vpp=1), schedule=Schedule.ONE_F_ONE_B,
            stages=None, chunks=None))

    def run(self) -> SearchResult:
        """Best-first: pop the lowest bound; expand groups, evaluate candidates; stop when
        the lowest remaining bound cannot beat the k-th best step time."""
        heap: list[tuple[float, tuple, int, _Group | _Candidate | _Split]] = []
        for i, group in enumerate(self.groups()):
            heap.append((group.bound, group.key, i, group))
        heapq.heapify(heap)
        seq = len(heap)
        best: list[tuple[_neg, int, Ranked]] = []  # the k best so far, worst on top
        threshold = self.threshold = float("inf")
        while heap:
            bound, _, _, item = heap[0]
            # the bound and a simulated time of a tie may differ in the last bits
            if bound > threshold * (1 + BOUND_SLACK):
                self.stats.pruned[BOUND] += sum(
                    it.size if isinstance(it, _Group) else 1 for *_, it in heap)
                break
            heapq.heappop(heap)
            if isinstance(item, _Candidate) and item.pending:
                # its own bound first: most candidates that come up this far end above
                # the k-th best once it is known, and need their memory checked only if
                # they come up again (``checked``)
                exact = self._candidate(item.plan)
                if exact is not None:  # back in line at its own bound
                    exact = dataclasses.replace(exact, bound=max(bound, exact.bound),
                                                bare=max(item.unpressured, exact.bound))
                    heapq.heappush(heap, (exact.bound, exact.key, seq, exact))
                    seq += 1
                continue
            if isinstance(item, _Candidate) and not item.chained and item.plan.schedule.v_shape:
                tight = chain_bound(item.plan, stage_work(item.plan))
                item = _Candidate(max(bound, tight), item.key, item.plan, item.fits, True,
                                  bare=None if item.fits else max(item.unpressured, tight))
                if tight > bound:  # back in line at the chain's bound
                    heapq.heappush(heap, (item.bound, item.key, seq, item))
                    seq += 1
                    continue
            if isinstance(item, _Candidate) and not item.fits:
                fit = self.checked(item)
                if fit is not None:  # back in line: its bound may have grown
                    heapq.heappush(heap, (fit.bound, fit.key, seq, fit))
                    seq += 1
                continue
            if isinstance(item, _Group) and not item.laid:
                item = self._laid(item)
                if item.bound > bound:  # back in line at its layout's bound
                    heapq.heappush(heap, (item.bound, item.key, seq, item))
                    seq += 1
                    continue
            if isinstance(item, _Group) and item.recomputes:  # a bundle: its groups
                for group in self.unbundled(item):
                    heapq.heappush(heap, (group.bound, group.key, seq, group))
                    seq += 1
                continue
            if isinstance(item, _Group) and not item.exact:
                own = self._group_bound(item.plan, item.runnable, item.cp_comms)
                item = dataclasses.replace(item, bound=max(own, bound), exact=True,
                                           bare=max(own, bound))
                if own > bound:  # back in line at its own bound
                    heapq.heappush(heap, (own, item.key, seq, item))
                    seq += 1
                    continue
            if isinstance(item, _Group) and not item.floored:
                floor = self.memory_floor(item)
                if self.wants_offload(item, floor):
                    for variant in self.offloaded(item):
                        heapq.heappush(heap, (variant.bound, variant.key, seq, variant))
                        seq += 1
                if floor is not None and floor.peak > self.limit:
                    self._drop(item, floor, seq)
                    continue
                item = dataclasses.replace(item, floored=True)
                if floor is not None:
                    own = bound + memory_pressure(bound - step_overhead(item.plan), floor.peak,
                                                  self.capacity)
                    if own > bound:
                        item = dataclasses.replace(item, bound=own)
                        heapq.heappush(heap, (own, item.key, seq, item))
                        seq += 1
                        continue
            if isinstance(item, _Group | _Split):
                found = self.expand(item) if isinstance(item, _Group) else [self.realize(item)]
                for new in found:
                    if new is not None:
                        heapq.heappush(heap, (new.bound, new.key, seq, new))
                        seq += 1
                continue
            pred = evaluate(item.plan)
            self.stats.evaluated += 1
            heapq.heappush(best, (_neg(rank_key(item.plan, pred)), seq, Ranked(item.plan, pred)))
            seq += 1
            if len(best) > self.top_k:
                heapq.heappop(best)
            if len(best) == self.top_k:
                threshold = self.threshold = best[0][2].prediction.step_time_s
        top = sorted((r for _, _, r in best), key=lambda r: rank_key(r.plan, r.prediction))
        if not top:
            self._note_dropped()
        closest = None if top or self.closest is None else self.closest[2:]
        return SearchResult(tuple(top), self.stats, closest)


def rank_key_static(plan: Plan) -> tuple:
    lay = plan.layout
    return (lay.tp, lay.pp, lay.cp, lay.vpp, plan.schedule.rank,
            plan.recompute.level, int(plan.zero), not plan.sequence_parallel, plan.micro_batch,
            lay.ep, lay.etp, _CP_COMM_ORDER[plan.cp_comm], plan.offload.optimizer,
            plan.offload.activations)


_CP_COMM_ORDER = {c: i for i, c in enumerate(CpComm)}


class _neg:
    """Reverses the order of a key so heapq's min-heap keeps the worst on top."""

    __slots__ = ("key",)

    def __init__(self, key: tuple):
        self.key = key

    def __lt__(self, other: _neg) -> bool:
        return self.key > other.key


def search(model: Model, cluster: Cluster, job: Job, space: SearchSpace,
           top_k: int = 10, min_headroom_bytes: float = 0.0) -> SearchResult:
    """The top_k plans by predicted tokens/s over ``space``; see module doc. A plan fits
    where every stage's peak leaves ``min_headroom_bytes`` of the device free. Runs in
    a cost scope (``autoplan.caches``): its candidates share their layers' costs.

    The cyclic garbage collector is paused while it runs (and restored after): the
    walk builds millions of short-lived acyclic plans that reference counting frees,
    and the collector's passes over them cost tenths of a second a search."""
    assert top_k >= 1
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with caches.scope():
            return _Search(model, cluster, job, space, top_k, min_headroom_bytes).run()
    finally:
        if was_enabled:
            gc.enable()


def candidate_plans(model: Model, cluster: Cluster, job: Job, space: SearchSpace) -> Iterator[Plan]:
    """Every plan the search generates past the rules and the model-state check, before
    memory and bounds decide (split variants with the uniform split they start from), with
    the offload variants of the groups that do not fit without them (module doc).
    For tests and tools: each must pass ``parallel.rules.plan_problems`` and the space."""
    walk = _Search(model, cluster, job, space, top_k=1)
    for group in walk.each_group():
        groups = [group]
        if walk.wants_offload(group, walk.memory_floor(group)):
            groups += walk.offloaded(group)
        for g in groups:
            for plan, _ in walk.schedule_plans(g):
                yield plan
