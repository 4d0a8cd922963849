"""What a search space yields: its layouts, past the rules of a valid plan (decided as
each choice is fixed) and the model-state check, grouped by everything but the schedule,
the exchange and the recompute (a bundle of groups, search/items.py), each group entering
the queue at its layout's compute floor; the groups a bundle stands for; the offload
variants of a group none of whose members fits as it is; and a group's plans, one per
schedule, chunk count and exchange passing the schedule rules."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from autoplan.descriptors.job import Job
from autoplan.descriptors.precision import StatePrecision
from autoplan.parallel import cp, dp, ep, pp, tp
from autoplan.parallel.common import Scope
from autoplan.parallel.rules import BY_ID, first_broken
from autoplan.plan import Layout, Memory, Plan
from autoplan.search.bound import TimeBounds
from autoplan.search.context import Context
from autoplan.search.floors import MemoryFloors, States
from autoplan.search.items import Block, Choice, Group, Sched, Unopened, evolve_group
from autoplan.search.results import ZERO_UNSHARDED, SearchStats, rank_key_static
from autoplan.vocab import NO_OFFLOAD, CpComm, Offload, ZeroStage

# :meth:`Enumeration.opened`'s per layout: the verdict on the model states of each (ZeRO
# stage, offload), and each ZeRO stage's offload choices
_Known = tuple[dict[tuple[ZeroStage, StatePrecision, Offload], States],
               dict[ZeroStage, list[Offload]]]


class Enumeration:
    """The groups and plans of one search's space; what the rules prune and what does not
    fit at generation is counted in ``stats``."""

    def __init__(self, ctx: Context, stats: SearchStats, bounds: TimeBounds, floors: MemoryFloors):
        self.ctx, self.stats, self.bounds, self.floors = ctx, stats, bounds, floors
        self._schedules: dict[int, tuple[Sched, ...]] = {}  # pp -> its schedule choices

    def layouts(self) -> Iterator[Layout]:
        """Every layout of the axes' degrees, expert foldings included, and where the space
        tries hybrid sharding each one's in-node ``dp_shard`` too."""
        cluster, space = self.ctx.cluster, self.ctx.space
        n = cluster.gpus
        for t in tp.degrees(cluster, space):
            for p in pp.degrees(n // t, space):
                for c in cp.degrees(n // (t * p), space):
                    for lay in ep.foldings(self.ctx.model, Layout(dp=n // (t * p * c), tp=t, pp=p, cp=c),
                                           space):
                        yield lay
                        for shard in dp.hybrid_shards(lay, cluster, space):  # HSDP
                            yield dataclasses.replace(lay, dp_shard=shard)

    def groups(self) -> Iterator[Group]:
        """Candidates grouped by everything but the schedule, after the rules of a valid
        plan (``parallel.rules``, decided as each choice is fixed) and the model-state
        check; each group carries a bound valid for all its schedules."""
        for item in self.unopened(bounded=False):
            yield from self.opened(item)

    def _layout_choices(self, base: Layout) -> tuple[Sequence[Sched], Sequence[ZeroStage],
                                                     Sequence[bool], Sequence[CpComm], int, int]:
        """The layout's schedules, ZeRO stages, sequence parallelism and exchanges, and its
        candidates per group (a ZeRO stage's job and offload: every recompute choice, and
        EP overlap's where it runs) and per micro-batch."""
        ctx, space = self.ctx, self.ctx.space
        scheds = self._schedules.get(base.pp)
        if scheds is None:  # they read the pipeline degree alone
            # one tuple per degree: every group of it holds this one (its id keys memos)
            scheds = self._schedules[base.pp] = tuple(pp.schedule_choices(base, space))
        zeros = dp.zero_stages(base, space)
        sps = tp.sequence_parallel_choices(ctx.model, base, space)
        cps = cp.exchanges(ctx.model, base, ctx.job.seq_len, space)
        overlap = ctx.overlap_schedules(base, scheds)
        per_group = (len(scheds) * len(ctx.choices)
                     + len(overlap) * len(ctx.overlap_choices)) * len(cps)
        per_mbs = per_group * sum(len(ctx.jobs(z)) for z in zeros) * max(1, len(sps))
        return scheds, zeros, sps, cps, per_group, per_mbs

    def blocks(self) -> list[Block]:
        """Every layout (:meth:`layouts`), in blocks of one shard (tp, cp, ep, etp), each
        at a bound valid for all its candidates (:meth:`LayoutFloors.block_floor`); its
        candidates counted as generated here. A block's layouts are bounded and their
        rules asked only if it comes up (:meth:`unblocked`): without the fill, which the
        layouts' own bounds count, most blocks never do."""
        ctx, space = self.ctx, self.ctx.space
        least = ctx.least
        by_shard: dict[tuple[int, int, int, int], list[tuple[Layout, tuple]]] = {}
        for base in self.layouts():
            by_shard.setdefault((base.tp, base.cp, base.ep, base.etp), []).append(
                (base, self._layout_choices(base)))
        out = []
        for layouts in by_shard.values():
            base, (_, _, sps, cps, _, _) = layouts[0]
            n = sum(c[-1] for _, c in layouts) * len(space.micro_batches)
            bound = self.bounds.floors.block_floor(base, sps or (False,), cps, least, layouts)
            out.append(Block(bound, rank_key_static(ctx.probe(base)), tuple(layouts), n))
        self.stats.generated += sum(b.size for b in out)
        return out

    def unblocked(self, block: Block, bounded: bool = True) -> Iterator[Unopened]:
        """The block's layouts that pass the rules of a valid plan that read the layout
        alone (``Scope.JOB``, ``Scope.LAYOUT``), unopened, each at a bound valid for all
        its candidates (:meth:`LayoutFloors.layout_mean_floor`, at least the block's; 0
        unless ``bounded``: to be opened at once); those the rules prune counted by the
        rule."""
        ctx, stats = self.ctx, self.stats
        space = ctx.space
        least = ctx.least
        for base, choices in block.layouts:
            scheds, _, sps, cps, _, per_mbs = choices
            size = per_mbs * len(space.micro_batches)
            probe = ctx.probe(base)
            rule = first_broken(probe, Scope.JOB) or first_broken(probe, Scope.LAYOUT)
            if rule is None and not sps:  # MoE with tp > 1 in a space without SP
                rule = BY_ID["moe-tp-needs-sp"]
            if rule:
                stats.pruned[rule.id] += size
                continue
            bound = max(block.bound, self.bounds.floors.layout_mean_floor(base, sps, cps, least, scheds)
                        ) if bounded else 0.0
            yield Unopened(bound, rank_key_static(probe), base, size, choices)

    def unopened(self, bounded: bool = True) -> Iterator[Unopened]:
        """Every layout of every block (:meth:`blocks`, :meth:`unblocked`)."""
        for block in self.blocks():
            yield from self.unblocked(block, bounded)

    def opened(self, item: Unopened) -> Iterator[Group]:
        """The groups of an unopened layout (:meth:`groups`), past the rules that read its
        micro-batch and sequence parallelism (each pruned candidate counted by its rule)."""
        ctx, stats = self.ctx, self.stats
        base, space = item.base, ctx.space
        scheds, zeros, sps, cps, per_zero, per_mbs = item.choices or self._layout_choices(base)
        # each group's recompute choices, in rank (a bundle stands for them: ``Group``)
        recomputes = ctx.choices
        # the layout's (ZeRO stage, offload) whose model states fit or not, and each ZeRO
        # stage's offloads: they read neither micro-batch nor SP (what does not fit is asked
        # again of each plan while it may be the 'smallest plan' noted)
        known: _Known = ({}, {})
        for mbs in space.micro_batches:
            rule = first_broken(ctx.probe(base, mbs), Scope.MICRO_BATCH)
            if rule:
                stats.pruned[rule.id] += per_mbs
                continue
            for sp in sps:
                rule = first_broken(ctx.probe(base, mbs, sp), Scope.SEQUENCE_PARALLEL)
                if rule:
                    stats.pruned[rule.id] += per_mbs // len(sps)
                    continue
                yield from self._zero_groups(base, mbs, sp, scheds, zeros, cps, recomputes,
                                             per_zero, known)

    def _zero_groups(self, base: Layout, mbs: int, sp: bool, scheds: Sequence[Sched],
                     zeros: Sequence[ZeroStage], cps: Sequence[CpComm],
                     recomputes: tuple[Choice, ...], per_zero: int,
                     known: _Known) -> Iterator[Group]:
        """The groups of a layout, micro-batch and sequence parallelism passing the rules:
        per ZeRO stage and job (its bf16 states, ``Context.jobs``) whose model states fit,
        else per offload the space allows under which they do, a bundle of its recompute
        choices and, where EP overlap runs, a group of each recompute choice it runs with
        (``per_zero`` candidates in all, counted where they do not fit). ``known``: the
        layout's fitting model states and offload choices (:meth:`opened`)."""
        stats = self.stats
        verdicts, offload_choices = known
        # the bounds read only the schedules that pass the schedule rules
        runnable = self.ctx.runnable(base, mbs, sp, scheds)
        overlap = self.ctx.overlap_schedules(base, scheds)
        overlap_runnable = self.ctx.runnable(base, mbs, sp, overlap) if overlap else ()
        # every group here starts at the layout's compute floor (a ZeRO-3 group's own
        # only if no other ZeRO stage has one; EP overlap's apart): its ZeRO-3 floor and
        # layout bound are worked out only if it comes up
        floors: dict[tuple[bool, bool], float] = {}
        # one rank per shard: every ZeRO stage holds and moves the same as the first (ZeRO 3
        # a gathered-layer buffer more); they differ only in the offload and the states
        # they allow (bf16 moments only in the distributed optimizer): the states of the
        # groups given as they are
        unsharded = base.dp * base.cp == 1 and base.edp == 1
        fitted: set[StatePrecision] = set()
        for zero in zeros:
            zero3 = zero is ZeroStage.PARAMETERS and not floors
            for job in self.ctx.jobs(zero):
                states = self.ctx.states(job, zero)
                fits = self._verdict(base, zero, job, NO_OFFLOAD, mbs, sp, verdicts) is States.FIT
                if unsharded and fits and states in fitted:
                    stats.pruned[ZERO_UNSHARDED] += per_zero  # a lower stage's group, again
                    continue
                if fits:
                    fitted.add(states)
                    yield from self._groups_of(base, mbs, sp, zero, zero3, job, NO_OFFLOAD,
                                               scheds, cps, runnable, overlap,
                                               overlap_runnable, recomputes, floors)
                    continue
                stats.infeasible["model states exceed memory"] += per_zero
                # no member fits as it is: each offload the space allows is tried
                offloads = offload_choices.get(zero)
                if offloads is None:
                    offloads = offload_choices[zero] = dp.offload_choices(
                        base, zero, self.ctx.cluster, self.ctx.space)[1:]
                for off in offloads:
                    stats.generated += per_zero
                    if self._verdict(base, zero, job, off, mbs, sp, verdicts) is not States.FIT:
                        stats.infeasible["model states exceed memory"] += per_zero
                        continue
                    yield from self._groups_of(base, mbs, sp, zero, zero3, job, off, scheds, cps,
                                               runnable, overlap, overlap_runnable, recomputes,
                                               floors)

    def _groups_of(self, base: Layout, mbs: int, sp: bool, zero: ZeroStage, zero3: bool,
                   job: Job, off: Offload, scheds: Sequence[Sched], cps: Sequence[CpComm],
                   runnable: tuple[Sched, ...], overlap: tuple[Sched, ...],
                   overlap_runnable: tuple[Sched, ...], recomputes: tuple[Choice, ...],
                   floors: dict[tuple[bool, bool], float]) -> Iterator[Group]:
        """The bundle of the layout's recompute choices at ``zero``, ``job`` and ``off``,
        and where EP overlap runs the bundle of those it runs with, each at its layout's
        compute floor (:meth:`LayoutFloors.layout_floor` at the least recompute of those it
        stands for, ``Context.least``; with EP overlap its dispatch at the least it
        exposes whatever the recompute: the bounds of the probes hold for every job,
        ``Context.bound_job``). An EP overlap bundle is opened when it comes up, its
        groups each at its own recompute's floor (:meth:`unbundled`): more recompute
        shortens the forward's exposed dispatch, which a bundle's own bounds, read at its
        least recompute, do not allow (:meth:`TimeBounds.with_layout_bound`)."""
        ctx, bounds = self.ctx, self.bounds
        # (EP overlap, the least recompute, the choices, the schedules, those that run)
        kinds = [(False, ctx.least, recomputes, scheds, runnable)]
        if overlap:
            kinds.append((True, ctx.overlap_least, ctx.overlap_choices, overlap, overlap_runnable))
        for ep_overlap, least, choices, schedules, runs in kinds:
            probe = ctx.probe(base, mbs, sp, zero, cps[-1], least, ep_overlap)
            floor = floors.get((zero3, ep_overlap))
            if floor is None:
                floor = floors[(zero3, ep_overlap)] = bounds.floors.layout_floor(probe, cps, runs)
            plan = ctx.recomputed(probe, choices[0]) if choices[0] != least else probe
            if job is not plan.job or off.any:
                plan = plan.replace(job=job, offload=off)
            yield self.group(plan, floor, schedules, cps, runs, choices, steps=int(zero3))

    def _verdict(self, base: Layout, zero: ZeroStage, job: Job, off: Offload, mbs: int, sp: bool,
                 verdicts: dict[tuple[ZeroStage, StatePrecision, Offload], States]
                 ) -> States:
        """``MemoryFloors.states_verdict`` on the layout's model states at ``zero``, ``job``
        and ``off``, kept in ``verdicts`` where it holds for every micro-batch and SP."""
        key = (zero, self.ctx.states(job, zero), off)
        verdict = verdicts.get(key)
        if verdict is None:
            verdict = self.floors.states_verdict(base, zero, off, mbs, sp, job)
            if verdict is not States.NOTED:
                verdicts[key] = verdict
        return verdict

    @staticmethod
    def group(plan: Plan, bound: float, scheds: Sequence[Sched], cps: Sequence[CpComm],
              runnable: tuple[Sched, ...], recomputes: tuple[Choice, ...] = (),
              steps: int = 0) -> Group:
        """The group of ``plan``'s schedules (a bundle where more than one recompute is
        given), its layout bound yet to be counted (:meth:`TimeBounds.with_layout_bound`)."""
        return Group(bound, rank_key_static(plan), plan, tuple(scheds), tuple(cps),
                     runnable=runnable, recomputes=recomputes if len(recomputes) > 1 else (),
                     layout_bounded=False, steps=steps)

    def unbundled(self, group: Group) -> list[Group]:
        """The groups a bundle stands for (the group itself if it is none), in rank: the
        first, at the bundle's recompute, with the bundle's bound; the others with their
        own recompute's layout compute floor if more, their own recompute's layout bound
        counted when they come up."""
        if not group.recomputes:
            return [group]
        out = []
        # an EP overlap bundle's bound is its compute floor alone: each of its groups
        # takes its own (``_groups_of``)
        overlap = group.plan.ep_overlap
        for i, rc in enumerate(group.recomputes):
            first = i == 0 and not overlap
            plan = group.plan if i == 0 else self.ctx.recomputed(group.plan, rc)
            bound = group.bound if first else max(
                group.bound, self.bounds.floors.layout_floor(plan, group.cp_comms, group.runnable))
            # (a ZeRO-3 group's floor at its recompute is its own ZeRO-3 floor)
            out.append(evolve_group(
                self.group(plan, bound, group.schedules, group.cp_comms, group.runnable),
                layout_bounded=group.layout_bounded and first,
                steps=group.steps if first else int(plan.zero is ZeroStage.PARAMETERS)))
        return out

    def each_group(self) -> Iterator[Group]:
        """:meth:`groups`, bundles opened, each with its layout's bound (for tests and
        tools)."""
        fully_laid = self.bounds.fully_laid
        for group in self.groups():
            for each in self.unbundled(fully_laid(group)):
                yield fully_laid(each)

    def wants_offload(self, group: Group, floor: Memory | None) -> bool:
        """Whether the search tries the group's offload variants: it keeps nothing in host
        memory, and no member of its uniform layer splits fits as it is (the group's memory
        floor, ``floor``, over them passes the limit). The search offloads what does not fit
        without it; a group whose model states alone do not fit is offloaded at generation
        (``groups``)."""
        if group.plan.offload.any or len(self.ctx.space.offload) == 1:
            return False
        if floor is None:  # split variants: their uniform members' floor decides
            uniform = tuple(x for x in group.schedules if not x[2])
            if not uniform:
                return False
            floor = self.floors.memory_floor(evolve_group(group, schedules=uniform))
        return floor is not None and floor.peak > self.ctx.limit

    def offloaded(self, group: Group) -> list[Group]:
        """The group's offload variants, where the space and the plan's rules allow them
        (each offload choice passing ``dp.offload_choices``), each bounded from the group's
        own bound (exact: asked once it is), shifted by ``TimeBounds.offloaded_bound``.
        Asked only for a group none of whose members fits: the search offloads what does
        not fit as it is (search/engine.py)."""
        plan = group.plan
        out = []
        for off in dp.offload_choices(plan.layout, plan.zero, self.ctx.cluster, self.ctx.space)[1:]:
            # the group's own bound, as ``group_bound`` would find it for the variant but
            # for its optimizer term (``offloaded_bound``): nothing else in it moves
            bound = self.bounds.offloaded_bound(group.bound, plan, off)
            variant = plan.replace(offload=off)
            out.append(evolve_group(group, plan=variant, bound=bound,
                                    key=rank_key_static(variant), unpressured_bound=bound,
                                    memory_floored=False))
        self.stats.generated += sum(g.size for g in out)
        return out

    def schedule_plans(self, group: Group, count: bool = True) -> Iterator[tuple[Plan, bool]]:
        """The group's plans, one per (schedule, vpp, split) and exchange, that pass the
        schedule rules, with whether the split is still to be searched; ``count``: those
        that break one are counted by the rule. The schedule rules read neither the
        exchange nor the split: asked once a schedule."""
        cps, lay = group.cp_comms, group.plan.layout
        m, memo = group.plan.num_microbatches, self.ctx.schedule_rule
        for sched, v, split in group.schedules:
            rule = memo[(lay.pp, m, sched, v, split)]  # asked by ``Context.runnable``
            if rule:
                if count:
                    self.stats.pruned[rule] += len(cps)
                continue
            first = self.ctx.scheduled(group.plan.replace(cp_comm=cps[0]), sched, v, split)
            for cp_comm in cps:
                yield (first if cp_comm is cps[0] else first.replace(cp_comm=cp_comm)), split
