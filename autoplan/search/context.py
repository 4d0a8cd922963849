"""What one search is asked (model, cluster, job, space, the memory a plan may take) and
what every part of it reads off that alone: probe plans for the rules, layouts at a
chunk count, and the schedule rules' verdict on each (pp, microbatches, schedule,
chunks, split), asked once each; the recompute choices (selective recompute's module
sets among them), the jobs of each ZeRO stage (bf16 states) and the schedules EP overlap
runs on that the space tries."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.model import Model
from autoplan.descriptors.pipeline_layout import uniform_stages
from autoplan.descriptors.precision import StatePrecision
from autoplan.descriptors.space import SearchSpace
from autoplan.parallel import ep
from autoplan.parallel.common import Scope
from autoplan.parallel.rules import BY_ID, first_broken, recompute_modules_problem
from autoplan.plan import Layout, Plan
from autoplan.schedules import Schedule
from autoplan.search.items import Choice, Sched
from autoplan.search.results import module_rank
from autoplan.search.stages import chunks_of
from autoplan.vocab import (
    CpComm,
    Dtype,
    MoeDispatch,
    Recompute,
    RecomputeModule,
    StateDtype,
    ZeroStage,
)

NO_RECOMPUTE: Choice = (Recompute.NONE, ())
_EP_OVERLAP = BY_ID["ep-overlap"]


def recompute_choices(model: Model, space: SearchSpace) -> tuple[Choice, ...]:
    """The space's recompute choices for ``model``, in rank (``results.rank_key_static``):
    none, selective with each module set the model has every module of
    (``space.module_sets``, filtered by ``parallel.rules.recompute_modules_problem``: the
    MoE modules for MoE models, mla_up_proj for multi-head latent attention, mlp where a
    layer has a dense MLP), full. Where no set is left, selective recomputes the
    attention core. (A space's one ``recompute_modules`` set the model lacks is refused
    where the request is built, ``autoplan.commands.request``.)"""
    out: list[Choice] = []
    for rc in sorted(space.recompute, key=lambda r: r.level):
        if rc is not Recompute.SELECTIVE:
            out.append((rc, ()))
            continue
        sets = [s for s in space.module_sets
                if not s or recompute_modules_problem(model, s) is None] or [()]
        out.extend((rc, s) for s in sorted(dict.fromkeys(sets), key=module_rank))
    return tuple(out)


def least_choice(choices: tuple[Choice, ...]) -> Choice:
    """A recompute choice whose layer costs are at most every one of ``choices``': the
    least where it is none; else selective with the modules common to every selective
    set (none in common: no recompute), which each set recomputes and more (and full
    recompute runs each module's forward and more); full where it is all."""
    if any(rc is Recompute.NONE for rc, _ in choices):
        return NO_RECOMPUTE
    sets = [set(mods or (RecomputeModule.CORE_ATTN,)) for rc, mods in choices
            if rc is Recompute.SELECTIVE]
    if not sets:
        return choices[0]
    common = set.intersection(*sets)
    if not common:
        return NO_RECOMPUTE
    mods = tuple(m for m in RecomputeModule if m in common)
    return (Recompute.SELECTIVE, () if mods == (RecomputeModule.CORE_ATTN,) else mods)


def state_jobs(job: Job, space: SearchSpace, zero: ZeroStage) -> tuple[Job, ...]:
    """The jobs a plan at ``zero`` is searched with: the job itself, and where the space
    tries bf16 states (``SearchSpace.bf16_states``) its bf16 gradient reduction (not in fp16
    training: ``descriptors.job.read_job``) and bf16 Adam moments, which Megatron-LM's
    precision-aware optimizer keeps inside the distributed optimizer (zero >= 1;
    megatron/training/arguments.py, as ``autoplan.export`` refuses them below it): every
    combination, the job's own first."""
    if not space.bf16_states:
        return (job,)
    grads = [job.main_grads] + ([StateDtype.BF16] if job.dtype is not Dtype.FP16 else [])
    moments = [job.optimizer_states] + ([StateDtype.BF16] if zero >= ZeroStage.OPTIMIZER else [])
    out = [job]
    seen = {job.states_at(space.stack.states, zero)}  # a state the job leaves to the stack too
    for g in dict.fromkeys(grads):
        for o in dict.fromkeys(moments):
            other = dataclasses.replace(job, main_grads=g, optimizer_states=o)
            states = other.states_at(space.stack.states, zero)
            if states not in seen:
                seen.add(states)
                out.append(other)
    return tuple(out)


class Context:
    """The search's inputs, and the memos every part shares."""

    def __init__(self, model: Model, cluster: Cluster, job: Job, space: SearchSpace,
                 min_headroom_bytes: float = 0.0):
        self.model, self.cluster, self.job, self.space = model, cluster, job, space
        # the recompute choices in rank (a bundle's), the least of their layer costs (what
        # a bound standing for all of them reads), and those EP overlap runs with (not full
        # recompute, not the moe module: the rule ep-overlap), where the space tries it on an
        # MoE model
        self.choices = recompute_choices(model, space)
        self.least = least_choice(self.choices)
        self.overlap_choices = tuple(
            c for c in self.choices if c[0] is not Recompute.FULL and RecomputeModule.MOE not in c[1]) \
            if model.is_moe and True in space.ep_overlap else ()
        self.overlap_least = least_choice(self.overlap_choices) if self.overlap_choices else NO_RECOMPUTE
        # the jobs of each ZeRO stage (bf16 states), and the one with the fewest bytes of
        # state to reduce and step, whose step no other job's beats: the probes' (every
        # bound standing for several jobs reads it), the job itself without bf16 states
        self._jobs = {z: state_jobs(job, space, z) for z in ZeroStage}
        self.bound_job = min((j for js in self._jobs.values() for j in js), key=self._heavier)
        # :meth:`overlap_schedules`: (the schedules keyed on, kept alive; those overlapping)
        self._overlap_scheds: dict[tuple[int, int, int],
                                   tuple[Sequence[Sched], tuple[Sched, ...]]] = {}
        self.capacity = cluster.device.mem_bytes  # the allocator's pressure is relative to it
        self.limit = self.capacity - min_headroom_bytes  # what a plan's peak may reach
        # (pp, microbatches, schedule, vpp, split) -> the schedule rule it breaks ("": none)
        self.schedule_rule: dict[tuple[int, int, Schedule, int, bool], str] = {}
        self._vpp_layouts: dict[tuple[Layout, int], Layout] = {}
        self._dispatch: dict[Layout, MoeDispatch] = {}  # :meth:`dispatch`
        # :meth:`probe`: by its arguments; each layout's first, the others made from it
        self._probes: dict[tuple[Layout, int, bool, ZeroStage, CpComm, Choice, bool], Plan] = {}
        self._first_probes: dict[Layout, Plan] = {}

    def states(self, job: Job, zero: ZeroStage) -> StatePrecision:
        """The states a plan of ``job`` at ``zero`` keeps on the space's stack."""
        return job.states_at(self.space.stack.states, zero)

    def _heavier(self, job: Job) -> int:
        """How many of the gradients and moments ``job`` keeps in fp32 (at the distributed
        optimizer, where every state the search tries is allowed)."""
        states = self.states(job, ZeroStage.OPTIMIZER)
        return ((states.main_grads is not StateDtype.BF16)
                + (states.optimizer_states is not StateDtype.BF16))

    def probe(self, lay: Layout, mbs: int = 1, sp: bool = False,
              zero: ZeroStage = ZeroStage.NONE, cp_comm: CpComm = CpComm.RING,
              recompute: Choice = NO_RECOMPUTE, ep_overlap: bool = False) -> Plan:
        """A plan of the layout whose later choices are not read by the rules asked; made
        once (a search asks for tens of thousands, a third of them again), each from the
        layout's first. Its job is ``bound_job``."""
        key = (lay, mbs, sp, zero, cp_comm, recompute, ep_overlap)
        plan = self._probes.get(key)
        if plan is None:
            base = self._first_probes.get(lay)
            if base is None:
                base = self._first_probes[lay] = Plan(
                    model=self.model, cluster=self.cluster, job=self.bound_job,
                    stack=self.space.stack, layout=lay, micro_batch=1,
                    schedule=Schedule.ONE_F_ONE_B, recompute=Recompute.NONE,
                    zero=ZeroStage.NONE, sequence_parallel=False, moe_dispatch=self.dispatch(lay))
            plan = self._probes[key] = base.replace(
                micro_batch=mbs, sequence_parallel=sp, zero=zero, cp_comm=cp_comm,
                recompute=recompute[0], recompute_modules=recompute[1], ep_overlap=ep_overlap)
        return plan

    def jobs(self, zero: ZeroStage) -> tuple[Job, ...]:
        """The jobs a plan at ``zero`` is searched with (:func:`state_jobs`)."""
        return self._jobs[zero]

    def overlap_schedules(self, base: Layout, scheds: Sequence[Sched]) -> tuple[Sched, ...]:
        """Those of ``scheds`` (the layout's pipeline degree's) a plan of ``base`` runs with
        EP overlap: by the rule ep-overlap (which reads ep, pp, the chunks and the model's
        MTP layers; its recompute is the group's: never full), and by the schedule rules
        at some micro-batch of the space (``runnable``'s verdicts); () where the space
        tries none. One tuple per (pp, dp, ``scheds``): its identity keys memos."""
        if not self.overlap_choices or base.ep < 2:
            return ()
        key = (base.pp, base.dp, id(scheds))
        hit = self._overlap_scheds.get(key)
        if hit is None:
            # the rule ep-overlap reads no dp: once per pipeline degree
            by_rule = self._overlap_scheds.get((base.pp, 0, id(scheds)))
            if by_rule is None:
                probe = self.probe(base).replace(ep_overlap=True)
                by_rule = self._overlap_scheds[(base.pp, 0, id(scheds))] = (scheds, tuple(
                    x for x in scheds if _EP_OVERLAP.broken(self.scheduled(probe, *x)) is None))
            runs: set[Sched] = set()
            batch, memo = self.job.global_batch, self.schedule_rule
            for mbs in self.space.micro_batches:
                if not by_rule[1] or batch % (base.dp * mbs):
                    continue
                m = batch // (base.dp * mbs)
                # the verdicts ``runnable`` keeps, asked (a probe made) only where not yet
                keys = [((base.pp, m, *x), x) for x in by_rule[1]]
                if any(k not in memo for k, _ in keys):
                    runs.update(self.runnable(base, mbs, False, by_rule[1], strict=True))
                else:
                    runs.update(x for k, x in keys if not memo[k])
            hit = self._overlap_scheds[key] = (scheds, tuple(x for x in by_rule[1] if x in runs))
        return hit[1]

    def dispatch(self, lay: Layout) -> MoeDispatch:
        """``ep.dispatch_for`` the layout, once per layout (every probe asks it)."""
        found = self._dispatch.get(lay)
        if found is None:
            found = self._dispatch[lay] = ep.dispatch_for(self.model, self.cluster, lay, self.space,
                                                          self.job.seq_len)
        return found

    @staticmethod
    def recomputed(plan: Plan, recompute: Choice) -> Plan:
        """``plan`` at the recompute choice (its modules where selective)."""
        return plan.replace(recompute=recompute[0], recompute_modules=recompute[1])

    def at_vpp(self, lay: Layout, vpp: int) -> Layout:
        """``lay`` at ``vpp`` chunks, built once per (layout, vpp)."""
        if lay.vpp == vpp:
            return lay
        out = self._vpp_layouts.get((lay, vpp))
        if out is None:
            out = self._vpp_layouts[(lay, vpp)] = dataclasses.replace(lay, vpp=vpp)
        return out

    def scheduled(self, plan: Plan, sched: Schedule, v: int, split: bool) -> Plan:
        """``plan`` (vpp = 1) run by ``sched`` on ``v`` chunks, as the schedule rules see it."""
        base, layers = plan.layout, self.model.layers
        out = plan.replace(layout=self.at_vpp(base, v), schedule=sched)
        if split and v > 1 and layers >= base.pp * v:
            # a per-chunk layout needs no pp*vpp | layers: the rules see one (its
            # near-uniform stand-in until the partitioner picks the split)
            out = out.replace(chunks=chunks_of(out, uniform_stages(layers, base.pp)))
        return out

    def runnable(self, base: Layout, mbs: int, sp: bool, scheds: Sequence[Sched],
                 strict: bool = False) -> tuple[Sched, ...]:
        """The schedules passing the schedule rules, which read the layout, the chunks and
        the microbatch count only (not ZeRO, recompute or the exchange): the bounds of
        the layout's groups need count no other. All of them where none passes (their
        groups then end in the rules' count). Each verdict is kept in ``schedule_rule``,
        where the rest of the search reads it. ``strict``: none where none passes."""
        probe = self.probe(base, mbs, sp)
        m, memo = probe.num_microbatches, self.schedule_rule
        out = []
        for x in scheds:
            key = (base.pp, m, *x)
            broken = memo.get(key)
            if broken is None:
                rule = first_broken(self.scheduled(probe, *x), Scope.SCHEDULE)
                broken = memo[key] = rule.id if rule else ""
            if not broken:
                out.append(x)
        return tuple(out) if out or strict else tuple(scheds)
