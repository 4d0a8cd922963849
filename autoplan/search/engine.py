"""The search: generate candidate plans over a SearchSpace, prune by rule, decide
memory before any pipeline simulation, then evaluate in order of a lower bound
on step time and stop once no remaining candidate can enter the top k
(branch and bound: the result equals brute-force evaluation of every candidate).

Where the space lets a launcher take uneven layer splits, each pipelined schedule
also has a split variant, kept in the queue with a bound valid for any split; the
partitioner (search/partition.py) runs only for the variants that reach the front.

Besides the layout, micro-batch, schedule, ZeRO stage, exchange and offload, a space
may try selective recompute's module sets (``recompute_module_sets``: each a recompute
choice of a bundle, tried where the model has its modules), Megatron-Core's EP overlap
(``ep_overlap``: a bundle of its own per group, of the recompute choices and schedules
its rule allows) and bf16 gradients and Adam moments (``bf16_states``: a group per ZeRO
stage and job, search/context.py); the bounds standing for several read the least of
them (the modules common to a bundle's sets, the least EP overlap exposes, the job of
the fewest state bytes).

Every item in the queue carries a bound valid for all it stands for, tightened in
steps, each only for the items that come up (back in line each time the bound rises):
a bundle of a group's recompute choices at its layout's compute floor (ZeRO-3's, with
its gathers, once it comes up); its layout's bound (every ZeRO stage below 3, or ZeRO-3;
its least recompute); each of its groups at its own recompute's compute floor, then
layout bound; the group's own bound; the group's memory
floor (dropped where no member fits, else charged the allocator's pressure); its
schedules as candidates at their busiest-stage bound; a candidate's own bound; its
schedule's critical chain (a V's); its memory; then ``evaluate``. The tests hold each bound
to the evaluated steps and memory of the plans it stands for, and the results to
brute force (``tests/unit/test_bounds.py``, ``test_search.py``).

The parts, one module each under search/: ``context`` (the search's inputs, the schedule
rules' verdicts), ``items`` (what the queue holds), ``enumerate`` (the layouts, groups and
plans a space yields), ``bound`` (the step-time bounds), ``floors`` (the memory floors),
``frontier`` (the best-first loop and the top k), ``results`` (what a search returns, its
statistics and rank keys). This module wires them and keeps the entry points.
"""

from __future__ import annotations

from collections.abc import Iterator

from autoplan import caches
from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.model import Model
from autoplan.descriptors.space import SearchSpace
from autoplan.plan import Plan
from autoplan.search.bound import TimeBounds
from autoplan.search.context import Context
from autoplan.search.enumeration import Enumeration
from autoplan.search.floors import MemoryFloors
from autoplan.search.frontier import BOUND_SLACK, Frontier
from autoplan.search.items import Group
from autoplan.search.results import (
    BOUND,
    HOST_MEMORY,
    OUTSIDE_SPACE,
    SEARCH_PRUNING,
    SPLIT_IS_UNIFORM,
    Ceiling,
    Ranked,
    SearchResult,
    SearchStats,
    pruning_reason,
    rank_key,
    rank_key_static,
)

__all__ = [
    "BOUND", "BOUND_SLACK", "HOST_MEMORY", "Ceiling", "OUTSIDE_SPACE", "SEARCH_PRUNING", "SPLIT_IS_UNIFORM",
    "Ranked", "SearchResult", "SearchStats", "candidate_plans", "pruning_reason", "rank_key",
    "rank_key_static", "search",
]


class _Search:
    """One search's parts, wired: its inputs (``ctx``), its statistics, its step-time bounds,
    memory floors, the enumeration of its space (``walk``) and the best-first ``frontier``.
    Tests and tools reach the parts themselves (``parts.bounds.group_bound``, ...)."""

    def __init__(self, model: Model, cluster: Cluster, job: Job, space: SearchSpace, top_k: int,
                 min_headroom_bytes: float = 0.0, ceiling: Ceiling | None = None,
                 cutoff: float = float("inf")):
        self.space = space
        self.ctx = Context(model, cluster, job, space, min_headroom_bytes)
        self.stats = SearchStats()
        self.bounds = TimeBounds(self.ctx)
        self.floors = MemoryFloors(self.ctx, self.stats)
        self.walk = Enumeration(self.ctx, self.stats, self.bounds, self.floors)
        self.frontier = Frontier(self.ctx, self.stats, self.bounds, self.floors, self.walk, top_k,
                                 ceiling, cutoff)

    def run(self) -> SearchResult:
        return self.frontier.run()


def search(model: Model, cluster: Cluster, job: Job, space: SearchSpace,
           top_k: int = 10, min_headroom_bytes: float = 0.0,
           ceiling: Ceiling | None = None, cutoff: float = float("inf")) -> SearchResult:
    """The top_k plans by predicted tokens/s over ``space``; see module doc. A plan fits
    where every stage's peak leaves ``min_headroom_bytes`` of the device free. Runs in
    a cost scope (``autoplan.caches``): its candidates share their layers' costs.
    ``ceiling``: told of each plan found, it returns a step time past which no plan is
    wanted (:class:`Ceiling`): the search then returns its top_k of those below it (and
    always its best). ``cutoff``: a step time past which no plan is wanted at all, its
    best neither (the result may then hold none).

    The cyclic garbage collector is paused while it runs (and restored after): the
    walk builds millions of short-lived acyclic plans that reference counting frees,
    and the collector's passes over them cost tenths of a second a search."""
    assert top_k >= 1
    with caches.collector_paused(), caches.scope():
        return _Search(model, cluster, job, space, top_k, min_headroom_bytes, ceiling,
                       cutoff).run()


def candidate_plans(model: Model, cluster: Cluster, job: Job, space: SearchSpace) -> Iterator[Plan]:
    """Every plan the search generates past the rules and the model-state check, before
    memory and bounds decide (split variants with the uniform split they start from), with
    the offload variants of the groups that do not fit without them (module doc).
    For tests and tools: each must pass ``parallel.rules.plan_problems`` and the space."""
    parts = _Search(model, cluster, job, space, top_k=1)
    walk = parts.walk
    # the groups' plans need none of their bounds (``each_group`` lays every one)
    for bundle in walk.groups():
        for group in walk.unbundled(bundle):
            yield from _group_plans(parts, group)


def _group_plans(parts: _Search, group: Group) -> Iterator[Plan]:
    """One group's plans, its offload variants' where none of its members fits as it is."""
    walk = parts.walk
    groups = [group]
    if walk.wants_offload(group, parts.floors.memory_floor(group)):
        groups += walk.offloaded(group)
    for g in groups:
        for plan, _ in walk.schedule_plans(g):
            yield plan
