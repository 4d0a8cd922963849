"""The best-first loop of the search (branch and bound, search/engine.py): a heap of
items (search/items.py) by the bound each carries; the item at the front is tightened one
step (back in line where that raises its bound), opened into what it stands for, or, a
candidate with its memory checked and every bound counted, evaluated into the top k;
the loop stops once the front's bound cannot beat the k-th best step time."""

from __future__ import annotations

import dataclasses
import heapq

from autoplan.cost.bounds import StageWork, chain_bound, memory_pressure, stage_work, step_overhead
from autoplan.cost.evaluate import evaluate
from autoplan.plan import Memory, Plan
from autoplan.schedules import Schedule
from autoplan.search.bound import TimeBounds
from autoplan.search.context import Context
from autoplan.search.enumeration import Enumeration
from autoplan.search.floors import MemoryFloors
from autoplan.search.items import (
    Block,
    Candidate,
    Group,
    Split,
    Unopened,
    evolve_candidate,
    evolve_group,
)
from autoplan.search.results import (
    BOUND,
    SPLIT_IS_UNIFORM,
    Ceiling,
    Ranked,
    SearchResult,
    SearchStats,
    rank_key,
    rank_key_static,
)
from autoplan.search.stages import (
    partition_problem,
    split_bound,
    split_bound_with_memory,
    with_best_stages,
)
from autoplan.vocab import CpComm

NO_SPLIT_FITS = "no layer split the launcher can express fits memory"
BOUND_SLACK = 1e-9  # relative; keeps exact ties (broken by memory) in the top k
# a group whose model states take more than this share of the limit has its memory floor
# asked before its time bounds (:meth:`Frontier._too_big`)
MEMORY_FIRST = 0.5
# schedules whose candidates are bounded by their schedule's critical chain before they
# are simulated: the V schedules. V-Half and V-Min hold microbatches back to save memory:
# their bubbles exceed the fill and drain of ``step_time_lower_bound`` (by 16-40% on GPT-3
# 175B / 1024 A100). ZB-V's, with its output layer on stage 0, by 1-3% there: its chain
# cuts the plans simulated from 92 to 74 (the flat schedules' chains cut none, at more
# cost than the simulations they would save: seven searches of the golden check). Each
# schedule says whether its chain counts (``ScheduleSpec.chain_bounded``).

_Item = Group | Candidate | Split | Unopened | Block


class Frontier:
    """The queue of one search and its top k so far (``threshold``: the k-th best step
    time found, infinite until k are)."""

    def __init__(self, ctx: Context, stats: SearchStats, bounds: TimeBounds, floors: MemoryFloors,
                 walk: Enumeration, top_k: int, ceiling: Ceiling | None = None,
                 cutoff: float = float("inf")):
        self.ctx, self.stats, self.top_k = ctx, stats, top_k
        # no plan slower than this is wanted, not even the search's best (a union's later
        # part: ``search.launchable``); the top k may then be empty
        self.cutoff = cutoff
        self.bounds, self.floors, self.walk = bounds, floors, walk
        self.ceiling = ceiling  # the caller's, asked of each plan found (``engine.search``)
        # the k-th best step time found so far, or the ceiling's if lower (never below the
        # best found)
        self.threshold = float("inf")
        # groups no member of which fits (their memory floor, their order): the 'smallest
        # plan' message looks into them only if nothing fits (:meth:`_note_dropped`)
        self._dropped: list[tuple[float, int, Group]] = []
        self._heap: list[tuple[float, tuple, int, _Item]] = []
        self._seq = 0  # the order of items and ranked plans alike in their bound and key
        self._best: list[tuple[_neg, int, Ranked]] = []  # the k best so far, worst on top
        self._fastest = float("inf")  # the best step time found so far
        # (pp, m, id of the schedules) -> (the schedules, their counts by rule): :meth:`_drop`
        self._rule_counts: dict[tuple[int, int, int], tuple[tuple, tuple[tuple[str, int], ...]]] = {}

    def run(self) -> SearchResult:
        """Best-first: pop the lowest bound; expand groups, evaluate candidates; stop when
        the lowest remaining bound cannot beat the k-th best step time."""
        heap = self._heap = []
        for i, block in enumerate(self.walk.blocks()):
            heap.append((block.bound, block.key, i, block))
        heapq.heapify(heap)
        self._seq = len(heap)
        self._best = []
        self.threshold, self._fastest = self.cutoff, float("inf")
        while heap:
            bound, _, _, item = heap[0]
            # the bound and a simulated time of a tie may differ in the last bits
            if bound > self.threshold * (1 + BOUND_SLACK):
                self.stats.pruned[BOUND] += sum(
                    it.size if isinstance(it, Group | Unopened | Block) else 1 for *_, it in heap)
                break
            heapq.heappop(heap)
            if isinstance(item, Candidate):
                ready = self._step_candidate(item, bound)
                if ready is not None:
                    self._evaluate(ready)
            elif isinstance(item, Group):
                self._step_group(item, bound)
            elif isinstance(item, Unopened):
                for group in self.walk.opened(item):  # each at its own bound, at least this one
                    self._push(group)
            elif isinstance(item, Block):
                for layout in self.walk.unblocked(item):  # each at its own bound, at least this one
                    self._push(layout)
            else:
                self._push(self.realize(item))
        top = sorted((r for _, _, r in self._best), key=lambda r: rank_key(r.plan, r.prediction))
        if not top:
            self._note_dropped()
        closest = self.floors.closest
        return SearchResult(tuple(top), self.stats, None if top or closest is None else closest[2:])

    def _push(self, item: _Item | None) -> None:
        """Put the item (if any) in line at its bound."""
        if item is not None:
            heapq.heappush(self._heap, (item.bound, item.key, self._seq, item))
            self._seq += 1

    def _evaluate(self, item: Candidate) -> None:
        """Evaluate the candidate into the top k (raising the threshold once k are found,
        or once the ceiling, where there is one, wants no slower plan than it says)."""
        pred = evaluate(item.plan)
        self.stats.evaluated += 1
        best = self._best
        found = Ranked(item.plan, pred)
        heapq.heappush(best, (_neg(rank_key(item.plan, pred)), self._seq, found))
        self._seq += 1
        if len(best) > self.top_k:
            heapq.heappop(best)
        if len(best) == self.top_k:
            self.threshold = min(self.cutoff, best[0][2].prediction.step_time_s)
        if self.ceiling is not None:
            self._fastest = min(self._fastest, pred.step_time_s)
            self.threshold = min(self.threshold, max(self.ceiling(found), self._fastest))

    def _step_candidate(self, item: Candidate, bound: float) -> Candidate | None:
        """The candidate that came up at ``bound``, tightened by its next bound: its own
        (where it is pending), its schedule's critical chain (a V), its memory; back in line
        where that raises it (or dropped, counted). The candidate itself where all are
        counted: it is to be evaluated."""
        if item.pending:
            # its own bound first: most candidates that come up this far end above
            # the k-th best once it is known, and need their memory checked only if
            # they come up again (``checked``)
            exact = self.candidate(item.plan)
            if exact is not None:  # back in line at its own bound
                self._push(evolve_candidate(exact, bound=max(bound, exact.bound),
                                            unpressured_bound=max(item.unpressured, exact.bound)))
            return None
        if not item.chain_counted and item.plan.schedule.spec.chain_bounded:
            tight = chain_bound(item.plan, stage_work(item.plan))
            item = Candidate(max(bound, tight), item.key, item.plan, item.fits, True,
                             unpressured_bound=None if item.fits else max(item.unpressured, tight))
            if tight > bound:  # back in line at the chain's bound
                self._push(item)
                return None
        if not item.fits:
            self._push(self.floors.checked(item))  # back in line: its bound may have grown
            return None
        return item

    def _step_group(self, item: Group, bound: float) -> None:
        """The group that came up at ``bound``, tightened by its next bound: its layout's,
        its own, its memory floor's pressure (back in line where that raises it, or
        dropped where no member fits); a bundle opened into its groups; a group past
        every bound into its candidates and split variants."""
        if not item.layout_bounded:
            if not item.memory_floored and self._too_big(item):
                return
            item = self.bounds.with_layout_bound(item)
            if item.bound > bound:  # back in line at its layout's bound
                self._push(item)
                return
        if item.recomputes:  # a bundle: its groups
            for group in self.walk.unbundled(item):
                self._push(group)
            return
        if not item.exact:
            own = self.bounds.group_bound(item.plan, item.runnable, item.cp_comms)
            item = evolve_group(item, bound=max(own, bound), exact=True, unpressured_bound=max(own, bound))
            if own > bound:  # back in line at its own bound
                self._push(item)
                return
        if not item.memory_floored:
            at_floor = self._with_memory_floor(item, bound)
            if at_floor is None:
                return
            item = at_floor
        for new in self.expand(item):
            self._push(new)

    def _too_big(self, item: Group) -> bool:
        """Whether the group (a bundle: each of its groups), come up unlaid, is dropped on
        its memory floor before any of its time bounds is tightened: asked first (and each
        group dropped, its offload variants queued, as :meth:`_floored` would) where its
        model states alone take more than ``MEMORY_FIRST`` of the limit, as on few GPUs
        for a large model, where most groups fit nowhere (DeepSeek-V3 on 64 H100: 1.66 s
        to 1.46 s; asking offloading bundles too, 0.99 s to 0.80 s with the floors' shared
        stage works); else, and where one fits, its memory is charged in turn
        (:meth:`_floored`, after its own bound: the pressure it charges grows with that
        bound). A bundle's groups are asked most recompute first, the one most likely to
        fit, which ends the question where it does; only a bundle whose groups would queue
        no offload variants (it offloads already, or the space offloads nothing): the
        variants of groups that never come up cost more than the bounds they save (DeepSeek-V3
        on 256 H100: 25% more calls)."""
        plan = item.plan
        if item.recomputes and not plan.offload.any and len(self.ctx.space.offload) > 1:
            return False
        states = self.floors.fullest_states(plan.layout, plan.zero, plan.offload.optimizer,
                                            plan.job)
        if states is None or states <= MEMORY_FIRST * self.ctx.limit:
            return False
        groups = [item] if not item.recomputes else [
            evolve_group(item, plan=self.ctx.recomputed(plan, rc), recomputes=())
            for rc in reversed(item.recomputes)]
        dropped = []
        for group in groups:
            floor = self.floors.memory_floor(group)
            if floor is None or floor.peak <= self.ctx.limit:
                return False
            dropped.append((group, floor))
        for group, floor in reversed(dropped):  # in rank, as the bundle's groups come up
            if self.walk.wants_offload(group, floor):
                for variant in self.walk.offloaded(group):
                    self._push(variant)
            self._drop(group, floor, self._seq)
        return True

    def _with_memory_floor(self, item: Group, bound: float) -> Group | None:
        """The group past its memory floor: dropped (None) where no member fits, its offload
        variants queued where the search tries them; back in line (None) where the
        allocator's pressure at the floor raises its bound; else the group, past its memory floor."""
        floor = self.floors.memory_floor(item)
        if self.walk.wants_offload(item, floor):
            for variant in self.walk.offloaded(item):
                self._push(variant)
        if floor is not None and floor.peak > self.ctx.limit:
            self._drop(item, floor, self._seq)
            return None
        item = evolve_group(item, memory_floored=True)
        if floor is not None:
            own = bound + memory_pressure(bound - step_overhead(item.plan), floor.peak,
                                          self.ctx.capacity)
            if own > bound:
                self._push(evolve_group(item, bound=own))
                return None
        return item

    def expand(self, group: Group) -> list[Candidate | Split]:
        """The group's schedules: uniform splits that fit in memory as candidates with
        their own bound; split variants deferred with the group's bound, valid for any
        split of any of its schedules (tightened only for those that come up)."""
        out: list[Candidate | Split] = []
        limit = self.threshold * (1 + BOUND_SLACK)
        # (exchange, vpp, B and W fused, breadth-first) -> the busiest-stage bound off the
        # group's works on that exchange (vpp 0: off its V works, as ``group_bound`` reads them)
        busiest: dict[tuple[CpComm, int, bool, bool], float] = {}
        # (exchange, B and W fused) -> its flat drain stages, for every chunk count
        drains: dict[tuple[CpComm, bool], list[tuple[float, float, float]]] = {}
        # the split variants' stages' room in memory (:meth:`MemoryFloors.split_caps`): a
        # variant none of whose splits can fit is dropped here, before its problem is built
        caps: tuple[int, ...] | None = None
        layers = group.plan.model.layers
        for plan, split in self.walk.schedule_plans(group):
            if split:
                if caps is None:
                    caps = self.floors.split_caps(group) or ()
                if caps and (sum(caps) < layers or min(caps) < plan.layout.vpp):
                    self.stats.infeasible[NO_SPLIT_FITS] += 1
                    continue
                # its own least bottleneck at its chunks' sends, without the fill (what
                # :meth:`realize` tightens first; memoized on what it reads)
                bound = max(group.bound, self.bounds.split_floor(plan))
                if bound > limit:
                    self.stats.pruned[BOUND] += 1
                    continue
                out.append(Split(bound, rank_key_static(plan), plan))
                continue
            spec = plan.schedule.spec
            v = plan.layout.vpp if spec.looping else 0
            fused = spec.drain_counts_w
            bf = spec.gathers_once_a_step
            unpressured = busiest.get((plan.cp_comm, v, fused, bf))
            if unpressured is None:
                unpressured = busiest[(plan.cp_comm, v, fused, bf)] = self.bounds.member_bound(
                    group.plan, plan.cp_comm, v, fused, drains, bf)
            # the group's bounds hold for it: the pressure-free one, and the one that
            # charges the group's memory floor (its own peak is no lower)
            unpressured = max(unpressured, group.unpressured_bound)
            bound = max(unpressured, group.bound)
            if bound > limit:
                self.stats.pruned[BOUND] += 1
                continue
            # its own works, bound and memory wait until it comes up (:meth:`_step_candidate`)
            out.append(Candidate(bound, rank_key_static(plan), plan, pending=True,
                                 unpressured_bound=unpressured))
        return out

    def candidate(self, plan: Plan) -> Candidate | None:
        """The plan as a candidate with its exact lower bound (``TimeBounds.exact_bound``),
        or None (and counted) when that bound already cannot beat the k-th best step time
        found. Its memory is checked only when it comes up (``MemoryFloors.checked``):
        most candidates never do."""
        bound = self.bounds.exact_bound(plan)
        if bound > self.threshold * (1 + BOUND_SLACK):
            self.stats.pruned[BOUND] += 1
            return None
        return Candidate(bound, rank_key_static(plan), plan)

    def realize(self, item: Split) -> Candidate | Split | None:
        """Tighten the split variant's bound, first with its schedule's pipeline fill,
        then with each stage's memory (back to the queue each time that raises it), then
        find its best layer split: the partitioner runs only for splits that can still
        enter the top k, and each tightening only for variants that come up."""
        space = self.ctx.space
        if not item.filled:
            bound = split_bound(item.plan, _group_works(item.plan))
            if bound > item.bound:
                return Split(bound, item.key, item.plan, filled=True)
        problem = item.problem
        if problem is None:
            problem = partition_problem(item.plan, space.stage_shape)
            capped = split_bound_with_memory(item.plan, problem, _group_works(item.plan))
            if capped is None:
                self.stats.infeasible[NO_SPLIT_FITS] += 1
                return None
            if capped > item.bound:
                return Split(capped, item.key, item.plan, True, problem)
        plan = with_best_stages(item.plan, space.stage_shape, problem)
        if plan is None:
            self.stats.infeasible[NO_SPLIT_FITS] += 1
            return None
        if plan.stages is None and plan.chunks is None:
            self.stats.pruned[SPLIT_IS_UNIFORM] += 1
            return None
        return self.candidate(plan)

    def _drop(self, group: Group, floor: Memory, order: int) -> None:
        """Count a group no member of which fits: its schedules that break a schedule
        rule by that rule, the others as not fitting, and keep it for the 'smallest plan'
        message."""
        lay, m = group.plan.layout, group.plan.num_microbatches
        # the schedules by the rule they break ('': none), per pipeline degree, m and
        # schedules (keyed on their identity: one tuple per degree, kept alive here)
        key = (lay.pp, m, id(group.schedules))
        counted = self._rule_counts.get(key)
        if counted is None:
            rules: dict[str, int] = {}
            for sched, v, split in group.schedules:
                rule = self.ctx.schedule_rule[(lay.pp, m, sched, v, split)]
                rules[rule] = rules.get(rule, 0) + 1
            counted = self._rule_counts[key] = (group.schedules, tuple(rules.items()))
        n = len(group.cp_comms)
        for rule, k in counted[1]:
            if rule:
                self.stats.pruned[rule] += k * n
            else:
                self.stats.infeasible[self.floors.why_not(floor)] += k * n
        self._dropped.append((floor.peak, order, group))

    def _note_dropped(self) -> None:
        """Where nothing fits, the 'smallest plan' message names the member needing the
        least memory: the dropped groups are looked into, least floor first, while one
        could still hold a member below the smallest noted so far."""
        floors = self.floors
        for floor, _, group in sorted(self._dropped, key=lambda d: d[:2]):
            if floors.closest is not None and floor > floors.closest[0]:
                break
            for plan, _ in self.walk.schedule_plans(group, count=False):  # counted when dropped
                stage, mem = floors.fullest(plan, stage_work(plan))
                floors.note_closest(plan, stage, mem)


def _group_works(plan: Plan) -> tuple[StageWork, ...]:
    """Per-stage work of the plan's uniform 1F1B, vpp = 1 form: what the split
    bounds read of it (parameters per stage) whatever the schedule and chunks."""
    return stage_work(dataclasses.replace(
        plan, layout=dataclasses.replace(plan.layout, vpp=1), schedule=Schedule.ONE_F_ONE_B,
        stages=None, chunks=None))


class _neg:
    """Reverses the order of a key so heapq's min-heap keeps the worst on top."""

    __slots__ = ("key",)

    def __init__(self, key: tuple):
        self.key = key

    def __lt__(self, other: _neg) -> bool:
        return self.key > other.key
