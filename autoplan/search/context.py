"""What one search is asked (model, cluster, job, space, the memory a plan may take) and
what every part of it reads off that alone: probe plans for the rules, layouts at a
chunk count, and the schedule rules' verdict on each (pp, microbatches, schedule,
chunks, split), asked once each."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.model import Model
from autoplan.descriptors.pipeline_layout import uniform_stages
from autoplan.descriptors.space import SearchSpace
from autoplan.parallel import ep
from autoplan.parallel.common import Scope
from autoplan.parallel.rules import first_broken
from autoplan.plan import Layout, Plan
from autoplan.schedules import Schedule
from autoplan.search.items import Sched
from autoplan.search.stages import chunks_of
from autoplan.vocab import CpComm, MoeDispatch, Recompute, RecomputeModule, ZeroStage


class Context:
    """The search's inputs, and the memos every part shares."""

    def __init__(self, model: Model, cluster: Cluster, job: Job, space: SearchSpace,
                 min_headroom_bytes: float = 0.0):
        self.model, self.cluster, self.job, self.space = model, cluster, job, space
        self.capacity = cluster.device.mem_bytes  # the allocator's pressure is relative to it
        self.limit = self.capacity - min_headroom_bytes  # what a plan's peak may reach
        # (pp, microbatches, schedule, vpp, split) -> the schedule rule it breaks ("": none)
        self.schedule_rule: dict[tuple[int, int, Schedule, int, bool], str] = {}
        self._vpp_layouts: dict[tuple[Layout, int], Layout] = {}
        self._dispatch: dict[Layout, MoeDispatch] = {}  # :meth:`dispatch`
        # :meth:`probe`: by its arguments; each layout's first, the others made from it
        self._probes: dict[tuple[Layout, int, bool, ZeroStage, CpComm, Recompute], Plan] = {}
        self._first_probes: dict[Layout, Plan] = {}

    def probe(self, lay: Layout, mbs: int = 1, sp: bool = False,
              zero: ZeroStage = ZeroStage.NONE, cp_comm: CpComm = CpComm.RING,
              recompute: Recompute = Recompute.NONE) -> Plan:
        """A plan of the layout whose later choices are not read by the rules asked; made
        once (a search asks for tens of thousands, a third of them again), each from the
        layout's first."""
        key = (lay, mbs, sp, zero, cp_comm, recompute)
        plan = self._probes.get(key)
        if plan is None:
            base = self._first_probes.get(lay)
            if base is None:
                base = self._first_probes[lay] = Plan(
                    model=self.model, cluster=self.cluster, job=self.job, stack=self.space.stack,
                    layout=lay, micro_batch=1, schedule=Schedule.ONE_F_ONE_B,
                    recompute=Recompute.NONE, zero=ZeroStage.NONE, sequence_parallel=False,
                    moe_dispatch=self.dispatch(lay))
            plan = self._probes[key] = base.replace(
                micro_batch=mbs, sequence_parallel=sp, zero=zero, cp_comm=cp_comm,
                recompute=recompute, recompute_modules=self.modules(recompute))
        return plan

    def dispatch(self, lay: Layout) -> MoeDispatch:
        """``ep.dispatch_for`` the layout, once per layout (every probe asks it)."""
        found = self._dispatch.get(lay)
        if found is None:
            found = self._dispatch[lay] = ep.dispatch_for(self.model, self.cluster, lay, self.space,
                                                          self.job.seq_len)
        return found

    def modules(self, recompute: Recompute) -> tuple[RecomputeModule, ...]:
        """What a plan at ``recompute`` recomputes by module: the space's, with selective."""
        return self.space.recompute_modules if recompute is Recompute.SELECTIVE else ()

    def recomputed(self, plan: Plan, recompute: Recompute) -> Plan:
        """``plan`` at ``recompute``, with the space's modules where selective."""
        return plan.replace(recompute=recompute, recompute_modules=self.modules(recompute))

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

    def runnable(self, base: Layout, mbs: int, sp: bool, scheds: Sequence[Sched]) -> tuple[Sched, ...]:
        """The schedules passing the schedule rules, which read the layout, the chunks and
        the microbatch count only (not ZeRO, recompute or the exchange): the bounds of
        the layout's groups need count no other. All of them where none passes (their
        groups then end in the rules' count). Each verdict is kept in ``schedule_rule``,
        where the rest of the search reads it."""
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
        return tuple(out) or tuple(scheds)
