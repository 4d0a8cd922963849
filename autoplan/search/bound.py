"""Lower bounds on step time, each valid for all a queue item stands for (search/items.py),
above a layout's compute floor (search/layout_floor.py): a layout's bound, for every ZeRO
stage below 3 (or ZeRO-3) and every recompute from its own up; a group's own bound, over
its schedules and exchanges; the busiest-stage bound of a member at its own chunk count;
a candidate's exact bound; each moved by an offload. Each docstring says why its bound
holds; ``tests/unit/test_bounds.py`` holds them to the evaluated steps of the plans they
stand for. Memoized per search: one ``TimeBounds`` a search."""

from __future__ import annotations

from collections.abc import Sequence

from autoplan.cost.bounds import (
    StageWork,
    busiest_stage_bound,
    cost_key,
    stage_work,
    step_time_lower_bound,
)
from autoplan.cost.stage import activation_bytes
from autoplan.parallel import dp, mesh, pp
from autoplan.plan import Layout, Plan
from autoplan.schedules import Schedule
from autoplan.search.context import Context
from autoplan.search.items import Choice, Group, Sched, evolve_group
from autoplan.search.layout_floor import V_WORK, LayoutFloors
from autoplan.search.stages import split_bound
from autoplan.vocab import NO_OFFLOAD, CpComm, Offload, Recompute, ZeroStage

# the schedule gathering ZeRO-3 once a step whose stage work stands for every such one's
# (``ScheduleSpec.gathers_once_a_step``: ``cost.stage``); None where none is registered
BF_WORK = next((s for s in Schedule if s.spec.gathers_once_a_step), None)


class TimeBounds:
    """The step-time bounds of one search's items, with their memos; a layout's compute
    floors are its ``floors``' (:class:`~autoplan.search.layout_floor.LayoutFloors`)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.floors = LayoutFloors(ctx)  # where groups enter the queue
        self._exact_bounds: dict[tuple, float] = {}  # :meth:`exact_bound`
        # (layout, micro-batch, SP, ZeRO stand-in, recompute, EP overlap) -> :meth:`_layout_bound`
        self._layout_bounds: dict[tuple[Layout, int, bool, ZeroStage, Choice, bool], float] = {}
        self._group_bounds: dict[tuple, float] = {}  # :meth:`group_bound`
        self._time_twins: dict[Plan, Plan] = {}  # :meth:`_time_twin`
        self._member_bounds: dict[tuple, float] = {}  # :meth:`member_bound`
        self._offload_shifts: dict[tuple, float] = {}  # :meth:`offloaded_bound`
        self._split_floors: dict[tuple, float] = {}  # :meth:`split_floor`

    # -- a layout's bound, shared by its groups ------------------------------------------
    def with_layout_bound(self, group: Group) -> Group:
        """The group with its layout's bound (:meth:`_layout_bound`, for every ZeRO stage
        below 3, or ZeRO-3, as the group's, and for every job; for its recompute, or for a
        bundle's least, :meth:`bound_choice`, and every recompute above it; shifted by its
        offload, ``offloaded_bound``) where that passes its floor: worked out once for each
        layout, micro-batch, sequence parallelism, kind of ZeRO, recompute and EP overlap
        that comes up. A ZeRO-3 group first takes its own compute floor (:meth:`LayoutFloors.layout_floor`,
        with ZeRO-3's passes), then the bound of the stages below 3, where one of them
        shards the optimizer as ZeRO-3 does (ZeRO-3 only adds gathers to their work):
        where one raises its bound it comes back (``steps``), its layout bound counted only when it comes up
        again (most do not; ZeRO-3's bound needs stage works of its own)."""
        plan = group.plan
        if group.recomputes and plan.ep_overlap:
            # its groups' bounds are their own (``Enumeration.unbundled``): under EP overlap
            # more recompute shortens the forward, so no bound read at its least holds
            return evolve_group(group, layout_bounded=True)
        zeros = dp.zero_stages(plan.layout, self.ctx.space)
        below: ZeroStage | None = max(
            (z for z in zeros if z is not ZeroStage.PARAMETERS), default=None)
        if plan.zero is ZeroStage.PARAMETERS:
            if group.steps < 1:
                least = self.bound_choice(group)
                at = (plan if least == (plan.recompute, plan.recompute_modules)
                      else self.ctx.recomputed(plan, least))
                floor = self.floors.layout_floor(at, group.cp_comms, group.runnable)
                group = evolve_group(group, steps=1)
                if floor > group.bound:
                    return evolve_group(group, bound=floor)
            if group.steps < 2:
                group = evolve_group(group, steps=2)
                if below is not None and below >= ZeroStage.OPTIMIZER:
                    shared = self.offloaded(self.shared_layout_bound(group, below), plan)
                    if shared > group.bound:
                        return evolve_group(group, bound=shared)
            below = ZeroStage.PARAMETERS
        assert below is not None
        own = self.offloaded(self.shared_layout_bound(group, below), plan)
        if group.recomputes and plan.zero is not ZeroStage.PARAMETERS:
            own = max(own, self.offloaded(self.bundle_bound(group), plan))
        return evolve_group(group, bound=max(group.bound, own), layout_bounded=True)

    def bundle_bound(self, group: Group) -> float:
        """A bound valid for every group of a bundle below ZeRO-3 (its ZeRO stage, each
        of its recomputes): :meth:`group_bound` at its least recompute with the gradient
        sync but not the drained one (``_drained_sync`` reads the members' longest
        backward, which more recompute lengthens). Each term it counts only grows with the
        recompute: the makespan's, and of the sync the overlapped reduction, which grows
        with the backward's floor and the stage's end (``dp.grad_sync_after_least``,
        ``dp.grad_sync_least``)."""
        plan = group.plan
        least = self.bound_choice(group)
        if plan.offload.any or least != (plan.recompute, plan.recompute_modules):
            plan = plan.replace(offload=NO_OFFLOAD, recompute=least[0], recompute_modules=least[1])
        return self.group_bound(plan, group.runnable, group.cp_comms, drained=False)

    def bound_choice(self, group: Group) -> Choice:
        """The recompute choice the group's shared bounds are read at: its own; a bundle's
        least (``Context.least``, below each of its choices: no choice of a bundle of
        several module sets need hold another's modules). (An EP overlap bundle reads none:
        :meth:`with_layout_bound`.)"""
        if group.recomputes:
            return self.ctx.least
        return group.plan.recompute, group.plan.recompute_modules

    def fully_laid(self, group: Group) -> Group:
        """:meth:`with_layout_bound` until it is (for tests and tools)."""
        while not group.layout_bounded:
            group = self.with_layout_bound(group)
        return group

    def shared_layout_bound(self, group: Group, zero: ZeroStage) -> float:
        """:meth:`_layout_bound` of the group's layout, micro-batch, sequence parallelism,
        recompute (:meth:`bound_choice`) and EP overlap at ``zero``, memoized."""
        plan = group.plan
        choice = self.bound_choice(group)
        key = (plan.layout, plan.micro_batch, plan.sequence_parallel, zero, choice,
               plan.ep_overlap)
        shared = self._layout_bounds.get(key)
        if shared is None:
            shared = self._layout_bounds[key] = self._layout_bound(
                plan.layout, plan.micro_batch, plan.sequence_parallel, zero, choice,
                group.cp_comms, group.runnable, plan.ep_overlap)
        return shared

    def _layout_bound(self, base: Layout, mbs: int, sp: bool, zero: ZeroStage,
                      recompute: Choice, cps: Sequence[CpComm],
                      scheds: Sequence[Sched], ep_overlap: bool = False) -> float:
        """A bound valid for the groups of a layout, micro-batch and sequence parallelism
        at ``recompute`` (without EP overlap: or any recompute above it), EP overlap or
        not, every job and ``zero``: ZeRO-3, or standing in for every stage below 3, so
        that a group's own bound is computed only if the group comes up. It is the group
        bound (:meth:`group_bound`) of the member at ``recompute`` (more recompute only
        adds forward time to the backward), ``zero`` and the probes' job (its states the
        least to reduce and step: ``Context.bound_job``), without the gradient sync, which
        differs by ZeRO stage: stages 0-2 run the same per-stage work and 1 and 2 step a
        shard of the optimizer (less time than 0), so the highest below 3 in the space
        stands for them. The schedules are those that pass the schedule rules
        (``Context.runnable``)."""
        return self.group_bound(self.ctx.probe(base, mbs, sp, zero, cps[-1], recompute, ep_overlap),
                                scheds, cps, sync=False)

    # -- offload ------------------------------------------------------------------------
    def offloaded(self, bound: float, plan: Plan) -> float:
        """``bound``, of the plan's layout without offload, for the plan's offload."""
        return self.offloaded_bound(bound, plan, plan.offload) if plan.offload.any else bound

    def offloaded_bound(self, bound: float, plan: Plan, off: Offload) -> float:
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
        # it reads the stages' parameters and the optimizer's rates: the layout and ZeRO
        # stage's, the same for every micro-batch, SP, recompute and activation offload
        key = (plan.layout, plan.zero, plan.stages, plan.chunks, plan.states)
        shift = self._offload_shifts.get(key)
        if shift is None:
            plan = plan.replace(recompute=Recompute.NONE, offload=NO_OFFLOAD)
            works = stage_work(plan)
            c_gpu = dp.optimizer_seconds_per_param(plan)
            c_off = dp.optimizer_seconds_per_param(plan.replace(offload=Offload(optimizer=True)))
            shards = [dp.optimizer_params(plan, w.params, w.expert_params) for w in works]
            shift = self._offload_shifts[key] = (
                (c_off - c_gpu) * sum(shards) / len(shards) if c_off >= c_gpu
                else -(c_gpu - c_off) * sum(shards))
        return bound + shift

    # -- a group's own bound, and its members' ------------------------------------------
    def group_bound(self, plan: Plan, scheds: Sequence[Sched],
                    cps: Sequence[CpComm] = (), sync: bool = True, drained: bool = True) -> float:
        """A step time no schedule of ``scheds`` on any exchange of ``cps`` (the plan's own
        where none are given) beats: the least over the exchanges of the busiest stage's
        with the pipeline's fill and drain (``cost.bounds.busiest_stage_bound``), itself
        the least of the one read off the stage works of the group's 1F1B, vpp = 1 member
        on that exchange, at the most chunks any of its flat schedules runs (its drain
        their whole backward where none splits it), and, where it has V schedules, the one
        read off the V's own works (its output layer on stage 0, two chunks). Where the
        group has split variants, the least bottleneck any split can reach
        (``stages.split_bound`` without the fill, which differs by schedule, at their
        fewest chunks: each more chunk sends more, ``pp.sends``) if lower. ``sync``: the
        uniform splits' bounds count the gradient sync of the plan's ZeRO stage that no
        drain hides, or the one the stage ending the step exposes if more
        (:meth:`_drained_sync`); not where the bound stands for other ZeRO stages."""
        cps = tuple(cps) or (plan.cp_comm,)
        # it reads no activation offload (a candidate's own bound counts the copies): the
        # variants of a group offloading more or less of them share one; ZeRO-2's groups
        # share ZeRO-1's (``dp.time_twin``)
        plan = self._time_twin(plan)
        key = (plan, tuple(scheds), cps, sync, drained)
        bound = self._group_bounds.get(key)
        if bound is None:
            bound = self._group_bounds[key] = self._group_bound(key[0], scheds, cps, sync,
                                                                drained)
        return bound

    def _time_twin(self, plan: Plan) -> Plan:
        """The plan whose group and member bounds ``plan``'s are (:meth:`group_bound`,
        :meth:`member_bound`): without activation offload, at its ZeRO stage's time twin
        (``plan`` itself where it is that). Made once per plan."""
        if not plan.offload.activations and plan.zero is not ZeroStage.GRADIENTS:
            return plan
        twin = self._time_twins.get(plan)
        if twin is None:
            twin = self._time_twins[plan] = plan.replace(
                zero=dp.time_twin(plan.zero), offload=Offload(optimizer=plan.offload.optimizer))
        return twin

    def _group_bound(self, plan: Plan, scheds: Sequence[Sched], cps: tuple[CpComm, ...],
                     sync: bool, with_drained: bool = True) -> float:
        splits = tuple(v for _, v, s in scheds if s)  # the split variants' chunks
        split = bool(splits)
        flat = [v for sched, v, _ in scheds if sched.spec.looping]
        # the most chunks a member gathering ZeRO-3 once a step runs, where its passes
        # differ (0: none)
        breadth_first = max((v for sched, v, _ in scheds if sched.spec.gathers_once_a_step),
                            default=0) if plan.zero is ZeroStage.PARAMETERS else 0
        fused = all(sched.spec.drain_counts_w for sched, _, _ in scheds if sched.spec.looping)
        v_base = plan.replace(layout=self.ctx.at_vpp(plan.layout, 2), schedule=V_WORK)
        drained = (self._drained_sync(plan, stage_work(plan), v_base, scheds, cps)
                   if sync and with_drained else 0.0)
        bound = float("inf")
        for cp_comm in cps:
            own = plan if cp_comm is plan.cp_comm else plan.replace(cp_comm=cp_comm)
            works = stage_work(own)
            if flat:
                most = max(flat)
                bound = min(bound, busiest_stage_bound(own, works, most, sync, most == 1,
                                                       drained, fused))
            if breadth_first:  # ZeRO-3's passes once a step: their own works
                bf_plan = own.replace(layout=self.ctx.at_vpp(own.layout, breadth_first),
                                      schedule=BF_WORK)
                bound = min(bound, busiest_stage_bound(bf_plan, stage_work(bf_plan), breadth_first,
                                                       sync, breadth_first == 1, drained, True))
            if len(flat) < len(scheds):
                v_plan = (v_base if own is plan
                          else own.replace(layout=v_base.layout, schedule=V_WORK))
                bound = min(bound, busiest_stage_bound(v_plan, stage_work(v_plan), 2,
                                                       sync, True, drained))
            if split:  # at its split variants' fewest chunks: their fewest sends
                fewest = min(splits)
                at = own if fewest == 1 else own.replace(layout=self.ctx.at_vpp(own.layout, fewest))
                bound = min(bound, split_bound(at, works, fill=False))
        return bound

    def _drained_sync(self, plan: Plan, works: tuple[StageWork, ...], v_plan: Plan,
                      scheds: Sequence[Sched], cps: Sequence[CpComm]) -> float:
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
        flat = [(not sched.spec.hides_tp_behind_w, v) for sched, v, split in scheds
                if not split and sched.spec.looping]
        least = float("inf")
        if flat:
            send = (pp.send_seconds(plan, activation_bytes(plan))
                    if any(v > 1 for _, v in flat) else 0.0)
            splits = any(b for b, _ in flat)
            sets = [works, *(stage_work(plan.replace(cp_comm=c)) for c in exchanges[1:])]
            least = self._drained_of(plan, self._drain_stages(sets, splits), send, 1)
        if any(not sched.spec.looping and not split for sched, _, split in scheds):
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

    def member_bound(self, group_plan: Plan, cp_comm: CpComm, v: int, fused: bool,
                     drains: dict[tuple[CpComm, bool], list[tuple[float, float, float]]],
                     breadth_first: bool = False) -> float:
        """:meth:`_member_bound`, memoized: the groups of a plan's time twin (ZeRO-2's of
        ZeRO-1; offloading more or less of their activations) share it."""
        key = (self._time_twin(group_plan), cp_comm, v, fused, breadth_first)
        bound = self._member_bounds.get(key)
        if bound is None:
            bound = self._member_bounds[key] = self._member_bound(group_plan, cp_comm, v, fused,
                                                                  drains, breadth_first)
        return bound

    def _member_bound(self, group_plan: Plan, cp_comm: CpComm, v: int, fused: bool,
                      drains: dict[tuple[CpComm, bool], list[tuple[float, float, float]]],
                      breadth_first: bool = False) -> float:
        """The busiest-stage bound of the group's members on ``cp_comm`` at ``v`` chunks
        (0: the V schedules), their backward fused with W or not, read off the group's
        works on that exchange (as :meth:`group_bound` reads them), with the gradient sync
        its own chunks expose where its stage ends the step (as :meth:`_drained_sync`
        bounds it for the group's every member). ``drains``: the group's flat
        :meth:`_drain_stages` by (exchange, B and W fused), for every chunk count.
        ``breadth_first``: a breadth-first member, whose ZeRO-3 passes (once a step) its
        own works count."""
        own = group_plan if cp_comm is group_plan.cp_comm else group_plan.replace(cp_comm=cp_comm)
        if v and breadth_first and own.zero is ZeroStage.PARAMETERS:
            # its ZeRO-3 passes once a step (``cost.stage``): its own works
            own = own.replace(layout=self.ctx.at_vpp(own.layout, v), schedule=BF_WORK)
            works = stage_work(own)
            send = pp.send_seconds(own, activation_bytes(own)) if v > 1 else 0.0
            drained = self._drained_of(own, self._drain_stages([works], False), send, v)
            return busiest_stage_bound(own, works, v, True, v == 1, drained, True)
        if v:  # the busiest-stage bound at its own chunk count
            works = stage_work(own)
            send = (pp.send_seconds(own, activation_bytes(own)) if v > 1 else 0.0)
            stages = drains.get((cp_comm, fused))
            if stages is None:
                stages = drains[(cp_comm, fused)] = self._drain_stages([works], not fused)
            drained = self._drained_of(own, stages, send, v)
            return busiest_stage_bound(own, works, v, True, v == 1, drained, fused)
        # its works place the output layer on stage 0: the V works'
        v_plan = own.replace(layout=self.ctx.at_vpp(own.layout, 2), schedule=V_WORK)
        works = stage_work(v_plan)
        drained = self._drained_of(own, self._drain_stages([works], False), 0.0, 2)
        return busiest_stage_bound(v_plan, works, 2, True, True, drained)

    def split_floor(self, plan: Plan) -> float:
        """A step time no uneven split of the split variant ``plan`` beats, without the
        fill (``stages.split_bound``, at its own chunks' sends and its group's works:
        those of its 1F1B, one-chunk form, for the parameters), plus what the allocator's
        pressure and the sync leave out: memoized per cost key (its schedule's kind, its
        chunks) and the group's plan."""
        key = (cost_key(plan), plan.offload)
        hit = self._split_floors.get(key)
        if hit is None:
            base = plan.replace(layout=self.ctx.at_vpp(plan.layout, 1),
                                schedule=Schedule.ONE_F_ONE_B, stages=None, chunks=None)
            hit = self._split_floors[key] = split_bound(plan, stage_work(base), fill=False)
        return hit

    # -- a candidate's own bound --------------------------------------------------------
    def exact_bound(self, plan: Plan) -> float:
        """The plan's exact lower bound (``cost.bounds.step_time_lower_bound``).

        The bound reads the plan's stage works (``cost_key`` and the layer split), ZeRO
        stage (as its time twin: ``dp.time_twin``) and offload, and its schedule only
        through the works but for offloaded activations' copies: plans alike in those
        (GPipe and 1F1B; ZB-H1 and ZB-H2; the V schedules; ZeRO 1 and 2) share one."""
        key = (cost_key(plan), plan.stages, plan.chunks, dp.time_twin(plan.zero), plan.offload,
               plan.schedule if plan.offload.activations else None)
        bound = self._exact_bounds.get(key)
        if bound is None:
            bound = self._exact_bounds[key] = step_time_lower_bound(plan, stage_work(plan))
        return bound
