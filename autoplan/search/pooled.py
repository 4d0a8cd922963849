"""Search on a heterogeneous cluster (``PooledCluster``): pipeline stages placed on pools
of unlike GPUs, the layers split so that each stage's time matches its pool's speed.

The walk:

1. **Each pool alone**: the search of a cluster of identical nodes (``engine.search``),
   with its own memory headroom.
2. **Two or more pools**, in each order along the pipeline (every order of up to three
   pools; beyond, the fastest pool first and the fastest last): a stage is a block of
   dp*tp*cp ranks inside one pool (``parallel.rules``: data, tensor and context parallel
   groups never leave a pool), and each pool hosts as many stages as it has room for
   (its GPUs // the block), so pp is their sum. Every block layout (expert foldings
   included), micro-batch size, sequence-parallel flag, schedule with one chunk per stage,
   ZeRO stage and recompute choice that passes the plan's rules and the space's gets the
   split of :func:`balanced_split` and is evaluated (``cost.placed``).
3. All of them ranked together (``engine.rank_key``): the answer may be a plan on one pool
   alone, and :attr:`PooledResult.verdict` says which pools it leaves out and why.

Best first: candidates are grouped by all but schedule and ZeRO stage, each group
entering a queue at its :func:`compute_floor` and bounded by :func:`fluid_bound` when it
comes up, and groups split and evaluated in the bounds' order until a
bound passes both the k-th best step time found (alone or across) and the best across
pools found: no later plan can enter the top k or be the best across pools (which the
verdict compares with the best alone). A group's plans are tried most-ZeRO first; where
one finds no room in memory, the lower ZeRO stages of its schedule (which hold more) are
not tried. A split's own bound (m times its slowest stage) skips the evaluation of splits
that cannot enter the top k. For Llama 3 70B on 32 H100 + 32 A100 the walk generates
65,280 candidates and evaluates under a hundred and fifty (``benchmarks/pooled_search.py``).

The search is dealt to two parts, run in two processes where a second can run
(``autoplan.forking``), else in turn: each searches every other pool alone and walks every
other group across pools, bounded by the plans it found itself. Each keeps every plan of
its groups that could enter the top k or be the best across pools, so the answer is the
one a single walk gives; together they walk further than one would (each is bounded by
its own plans only), the same on any machine. Llama 3 70B on 32 H100 + 32 A100: 3.3 s
to 2.2 s on two cores.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from autoplan import caches, forking
from autoplan.caches import memo
from autoplan.cost.placed import evaluate_placed
from autoplan.cost.stage import (
    StageWork,
    between_send_seconds,
    cost_key,
    layer_core,
    placed_stage_work,
    stage_memory,
    stage_work_for,
)
from autoplan.descriptors.hardware import Cluster, PooledCluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.model import Model
from autoplan.descriptors.space import SearchSpace, StageShape
from autoplan.kernels.memory import default_headroom_bytes
from autoplan.parallel import cp, dp, ep, tp
from autoplan.parallel.common import Rule, Scope, capped_divisors
from autoplan.parallel.rules import RULES, space_problems
from autoplan.plan import Layout, Placement, Plan
from autoplan.schedules import Schedule
from autoplan.schedules.memory import peak_inflight
from autoplan.schedules.registry import Chunks
from autoplan.search.context import recompute_choices, state_jobs
from autoplan.search.engine import (
    BOUND,
    OUTSIDE_SPACE,
    Ranked,
    SearchResult,
    SearchStats,
    rank_key,
    search,
)
from autoplan.search.items import Choice
from autoplan.search.layout_floor import layer_work
from autoplan.vocab import NO_OFFLOAD, CpComm, ZeroStage

MAX_ALL_ORDERS = 3  # pools whose every order along the pipeline is tried
PARTS = 2  # the search's parts (``_search_pooled``), whatever the machine
_BISECTIONS = 60  # at most; the bisection stops within _TOLERANCE of the least bottleneck
_TOLERANCE = 1e-4  # of the least bottleneck: the split found is within it


@dataclass(frozen=True, slots=True)
class PooledResult:
    plans: tuple[Ranked, ...]  # best first: across pools and on each pool alone
    alone: tuple[SearchResult, ...]  # the search of each pool alone, in the cluster's order
    best_across: Ranked | None  # the best plan placing stages on two or more pools
    stats: SearchStats  # of the walk across pools
    cluster: PooledCluster

    def best_alone(self) -> tuple[int, Ranked] | None:
        """The best plan on one pool alone, and that pool's index."""
        found = [(i, r.plans[0]) for i, r in enumerate(self.alone) if r.plans]
        return min(found, key=lambda x: rank_key(x[1].plan, x[1].prediction), default=None)

    def verdict(self) -> str:
        """Which pools the best plan uses, against the best on one pool alone."""
        pools = self.cluster.pools
        alone, across = self.best_alone(), self.best_across
        if not self.plans:
            return "no plan fits on any pool or across them"
        best = self.plans[0]
        if best.plan.placement is None:
            i = pools.index(best.plan.cluster)
            left = [p.name for j, p in enumerate(pools) if j != i]
            if across is None:
                why = "no plan across pools fits"
            else:
                why = (f"the best plan across {_names(across.plan)} predicts "
                       f"{across.prediction.tokens_per_s:,.0f} tokens/s, "
                       f"{_ratio(across, best)} of {pools[i].name} alone "
                       f"({best.prediction.tokens_per_s:,.0f})")
            return f"leaves out {', '.join(left)}: {why}"
        used = set(best.plan.placement.stage_pools)
        left = [p.name for j, p in enumerate(pools) if j not in used]
        out = f"uses {_names(best.plan)}"
        if alone is not None:
            i, r = alone
            out += (f": {best.prediction.tokens_per_s:,.0f} tokens/s, {_ratio(best, r)} of the "
                    f"best on {pools[i].name} alone ({r.prediction.tokens_per_s:,.0f})")
        if left:
            out += f"; leaves out {', '.join(left)}"
        return out


def _names(plan: Plan) -> str:
    assert plan.placement is not None
    placement = plan.placement
    return " + ".join(
        f"{pool.name} ({placement.span(stages)}, layers "
        f"{'/'.join(str(plan.stage_layers[s]) for s in stages)})"
        for pool, stages in placement.runs())


def _ratio(a: Ranked, b: Ranked) -> str:
    return f"{a.prediction.tokens_per_s / b.prediction.tokens_per_s:.2f}x"


def search_pooled(model: Model, cluster: PooledCluster, job: Job, space: SearchSpace,
                  top_k: int = 10, min_headroom_bytes: float | None = None,
                  progress: Callable[[str], None] | None = None) -> PooledResult:
    """The top_k plans by predicted tokens/s on the pools alone and across them (module
    doc). ``min_headroom_bytes``: what every plan leaves free on each GPU (None: each
    device's default, ``memory.default_headroom_bytes``). One cost scope
    (``autoplan.caches``) holds the searches on each pool and across them. ``progress``:
    told as each stage of the search ends. The cyclic garbage collector is paused while it
    runs, as in ``engine.search`` (the walk builds hundreds of thousands of short-lived
    acyclic plans and stage works, and a collector's pass over a command's live objects
    cost it a third of its time)."""
    with caches.collector_paused(), caches.scope():
        if not space.parts:
            return _search_pooled(model, cluster, job, space, top_k, min_headroom_bytes,
                                  progress or (lambda _: None))
        # the launchers' spaces (``search.launchable``): each part searched, ranked together,
        # each after the first bounded by what the parts before it found (:class:`_Seed`)
        found: list[PooledResult] = []
        for part in space.parts:
            seed = _Seed.of(_merged(found, top_k), top_k) if found else None
            found.append(_search_pooled(model, cluster, job, part, top_k, min_headroom_bytes,
                                        progress or (lambda _: None), seed, union=True))
        return _merged(found, top_k)


@dataclass(frozen=True, slots=True)
class _Seed:
    """What the parts of a union searched so far found, bounding the next part's search: a
    plan of it slower than their k-th best (of each pool alone, or of all) enters no top
    k, and one across pools slower than their best across changes no verdict."""

    kept: tuple[float, ...]  # the step times of their plans, ascending
    best_across: float
    alone: tuple[float, ...]  # per pool: the k-th best step time alone (inf: fewer found)

    @classmethod
    def of(cls, merged: PooledResult, top_k: int) -> _Seed:
        alone = tuple(a.plans[top_k - 1].prediction.step_time_s if len(a.plans) >= top_k
                      else float("inf") for a in merged.alone)
        across = merged.best_across
        return cls(tuple(sorted(r.prediction.step_time_s for r in merged.plans)),
                   across.prediction.step_time_s if across is not None else float("inf"), alone)


def _merged(found: list[PooledResult], top_k: int) -> PooledResult:
    """The pooled searches of a union's parts as one: the plans some launcher runs ranked
    together, each pool's best search alone (its plans those some launcher runs), the best
    across pools."""
    from autoplan.export import launchers

    def key(r: Ranked) -> tuple:
        return rank_key(r.plan, r.prediction)

    stats = SearchStats()
    for f in found:
        stats.merge(f.stats)
    plans = sorted((r for f in found for r in f.plans if launchers(r.plan)), key=key)[:top_k]
    runnable = [[replace(a, plans=tuple(r for r in a.plans if launchers(r.plan)))
                 for a in f.alone] for f in found]
    alone = tuple(min((f[i] for f in runnable),
                      key=lambda a: key(a.plans[0]) if a.plans else (float("inf"),))
                  for i in range(len(found[0].alone)))
    across = [f.best_across for f in found if f.best_across is not None and launchers(f.best_across.plan)]
    return PooledResult(plans=tuple(plans), alone=alone, best_across=min(across, key=key, default=None),
                        stats=stats, cluster=found[0].cluster)


def _search_pooled(model: Model, cluster: PooledCluster, job: Job, space: SearchSpace,
                   top_k: int, min_headroom_bytes: float | None,
                   progress: Callable[[str], None], seed: _Seed | None = None,
                   union: bool = False) -> PooledResult:
    space = _on_gpus(space)

    def headroom(c: Cluster) -> float:
        return (default_headroom_bytes(c.device.mem_bytes) if min_headroom_bytes is None
                else min_headroom_bytes)

    # the search is dealt to two parts, run in two processes where a second can run
    # (``autoplan.forking``; else one after the other: the same counts on any machine):
    # each searches every other pool alone, builds the groups across pools and walks
    # every other one of them, bounded by its own plans (alone and across); the answer is
    # theirs together, the same as one walk finds (``_walk``: each keeps every plan of
    # its groups' top k, and its best across pools)
    stats = SearchStats()
    other = [forking.beside(functools.partial(
        _search_part, model, cluster, job, space, top_k, headroom, w, PARTS, seed=seed,
        union=union))
        for w in range(1, PARTS)]
    try:
        mine = _search_part(model, cluster, job, space, top_k, headroom, 0, PARTS, stats,
                            progress, seed, union)
    except BaseException:
        for pending in other:
            pending.abandon()
        raise
    found = [mine, *(pending.result() for pending in other)]
    alone = tuple(sorted((a for part in found for a in part.alone), key=lambda a: a[0]))
    across = sorted((r for part in found for r in part.across),
                    key=lambda r: rank_key(r.plan, r.prediction))
    for part in found:
        stats.merge(part.stats)
    ranked = sorted([*across[:top_k], *(r for _, a in alone for r in a.plans)],
                    key=lambda r: rank_key(r.plan, r.prediction))
    return PooledResult(plans=tuple(ranked[:top_k]), alone=tuple(a for _, a in alone),
                        best_across=across[0] if across else None, stats=stats, cluster=cluster)


@dataclass(frozen=True, slots=True)
class _Part:
    """What one part of a pooled search found (:func:`_search_part`)."""

    alone: list[tuple[int, SearchResult]]  # (pool index, its search alone)
    across: list[Ranked]  # its top k across pools and its best
    stats: SearchStats  # its walk's counts


def _search_part(model: Model, cluster: PooledCluster, job: Job, space: SearchSpace,
                 top_k: int, headroom: Callable[[Cluster], float], part: int, parts: int,
                 built: SearchStats | None = None,
                 progress: Callable[[str], None] = lambda _: None,
                 seed: _Seed | None = None, union: bool = False) -> _Part:
    """Part ``part`` of ``parts`` of a pooled search: the pools ``part``, ``part +
    parts``, ... alone, and the walk across pools over every ``parts``-th group from
    ``part`` on. The groups are built in full by each part (the same list in each);
    what building them counts goes to ``built`` (one part's: the counts would repeat)."""
    alone = []
    # a union's part searches each pool alone at uniform splits, as a launchable search of
    # one pool does (``search.launchable``)
    alone_space = space if not union else replace(space, stage_shape=StageShape.UNIFORM)
    for i in range(part, len(cluster.pools), parts):
        pool = cluster.pools[i]
        bound = seed.alone[i] if seed is not None else float("inf")
        alone.append((i, search(model, pool, job, alone_space, top_k, headroom(pool),
                                None if seed is None else (lambda _, b=bound: b))))
        progress(f"searched pool {pool.name} alone")
    # best first: every group at its compute floor, tightened to its fluid bound when it
    # comes up (most never do), then its plans split and evaluated in the bounds' order
    counts = built if built is not None else SearchStats()
    queue: list[tuple[float, int, bool, _Group]] = [
        (compute_floor(g.probes), i, False, g)
        for i, g in enumerate(g for order in _orders(cluster)
                              for g in _groups(model, cluster, job, space, order, counts))]
    progress(f"searching plans across pools: {len(queue):,} layout groups by bound"
             + (f", in {parts} processes" if parts > 1 and forking.can_fork() else ""))
    kept = sorted([*(r.prediction.step_time_s for _, a in alone for r in a.plans),
                   *(seed.kept if seed is not None else ())])
    stats = SearchStats()
    across = _walk(queue[part::parts], stats, kept, space, headroom, top_k,
                   seed.best_across if seed is not None else float("inf"))
    across.sort(key=lambda r: rank_key(r.plan, r.prediction))
    best = across[:top_k]  # the best across pools is the first of them
    return _Part(alone, best, stats)


def _walk(queue: list[tuple[float, int, bool, _Group]], stats: SearchStats, kept: list[float],
          space: SearchSpace, headroom: Callable[[Cluster], float], top_k: int,
          best_across: float = float("inf")) -> list[Ranked]:
    """The plans across pools that the best-first walk over ``queue`` evaluates, until a
    bound passes both the k-th best step time so far (of ``kept``, the plans alone, and
    those it found: no later plan can enter the top k) and the best it found across pools
    (the verdict compares the best across with the best alone; ``best_across``: the best
    found before, by a union's earlier parts). Every plan of the top k and the best across
    pools of the groups in ``queue`` is among those returned."""
    heapq.heapify(queue)
    kept = list(kept)
    across: list[Ranked] = []

    def beyond(bound: float) -> bool:
        return len(kept) >= top_k and bound > kept[top_k - 1] and bound > best_across

    no_room = _NoRoom()
    while queue:
        bound, i, tight, group = queue[0]
        if beyond(bound):  # the groups left, their plans unbuilt: every one by the bound
            stats.pruned[BOUND] += sum(g.size for *_, g in queue)
            break
        heapq.heappop(queue)
        if not tight:  # back in line at its fluid bound
            heapq.heappush(queue, (max(bound, min(fluid_bound(p) for p in group.probes)), i,
                                   True, group))
            continue
        for plan in sorted(group.variants(stats), key=_NoRoom.least_first):
            if no_room.holds(plan):
                stats.infeasible["a stage exceeds its GPU's memory"] += 1
                continue
            found = _placed(plan, space, headroom, beyond, stats)
            if found is None:
                continue
            if isinstance(found, Ranked):
                across.append(found)
                bisect.insort(kept, found.prediction.step_time_s)
                best_across = min(best_across, found.prediction.step_time_s)
            else:
                no_room.add(plan)
    return across


class _NoRoom:
    """Plans no layer split fits in memory, and those that hold at least as much.

    Of two plans alike (their recompute and its modules, and their states' precision, too)
    but for the micro-batch size b, the schedule and a ZeRO stage of 0-2, one holds at
    least as much as the other on every stage at every layer count where its b is no
    smaller, its ZeRO stage no higher (ZeRO 0-2 only shard more state as the stage
    rises) and, on every stage s, b times the microbatches s holds
    (``schedules.memory.peak_inflight``: with one chunk per stage, a stage's activations,
    embedding output and logits are that many microbatches' of b sequences) is no
    smaller. Weights, gradients and optimizer states do not depend on b or the schedule.
    So where one finds no room, none of those does."""

    def __init__(self) -> None:
        self._seen: dict[tuple, list[tuple[int, int, tuple[int, ...]]]] = {}

    @staticmethod
    def _key(plan: Plan) -> tuple[tuple, tuple[int, int, tuple[int, ...]]]:
        assert plan.placement is not None
        zero3 = plan.zero is ZeroStage.PARAMETERS
        b, p, m = plan.micro_batch, plan.layout.pp, plan.num_microbatches
        held = tuple(b * peak_inflight(plan.schedule, p, m, 1, s) for s in range(p))
        return ((plan.placement.stage_pools, plan.layout, plan.sequence_parallel,
                 plan.cp_comm, plan.recompute, plan.recompute_modules, plan.states, zero3),
                (b, 0 if zero3 else -int(plan.zero), held))

    def add(self, plan: Plan) -> None:
        key, at = self._key(plan)
        self._seen.setdefault(key, []).append(at)

    def holds(self, plan: Plan) -> bool:
        key, (b, z, held) = self._key(plan)
        return any(b0 <= b and z0 <= z and all(h0 <= h for h0, h in zip(held0, held, strict=True))
                   for b0, z0, held0 in self._seen.get(key, ()))

    @staticmethod
    def least_first(plan: Plan) -> tuple[int, int]:
        """An order that tries a group's plans holding the least first."""
        b, p, m = plan.micro_batch, plan.layout.pp, plan.num_microbatches
        return (-int(plan.zero) if plan.zero <= ZeroStage.GRADIENTS else 1,
                sum(peak_inflight(plan.schedule, p, m, 1, s) for s in range(p)) * b)


def _placed(plan: Plan, space: SearchSpace, headroom: Callable[[Cluster], float],
            beyond: Callable[[float], bool], stats: SearchStats) -> Ranked | bool | None:
    """The plan with its balanced split, evaluated; False where no split fits in memory;
    None where the split's own bound shows it cannot enter the top k, or it does not fit
    as evaluated."""
    limits = tuple(v.cluster.device.mem_bytes - headroom(v.cluster)
                   for v in (plan.on_stage(s) for s in range(plan.layout.pp)))
    caps = layer_caps(plan, limits)
    if caps is not None and sum(caps) >= plan.model.layers:
        # no split that fits is faster than its fluid bound with the stages' memory caps
        if beyond(capped_fluid_bound(plan, caps)):
            stats.pruned[BOUND] += 1
            return None
        found = balanced_split(plan, limits)
    else:
        found = None
    if found is None:
        stats.infeasible["a stage exceeds its GPU's memory"] += 1
        return False
    split, bottleneck = found
    # the slowest stage of the split is busy m * (F + B): the step takes at least that
    if beyond(plan.num_microbatches * bottleneck):
        stats.pruned[BOUND] += 1
        return None
    plan = plan.replace(stages=split)
    if space_problems(plan, space):  # a launcher that takes only the even split
        plan = plan.replace(stages=None)
    pred = evaluate_placed(plan)
    stats.evaluated += 1
    if not pred.feasible or any(
            m.peak > lim for m, lim in zip(pred.memory_per_stage, limits, strict=True)):
        stats.infeasible["a stage exceeds its GPU's memory"] += 1
        return None
    return Ranked(plan, pred)


def _on_gpus(space: SearchSpace) -> SearchSpace:
    """The space without offload: plans across pools keep their state on the GPUs (and
    the pools alone are compared on the same terms)."""
    return replace(space, offload=(NO_OFFLOAD,))


def _orders(cluster: PooledCluster) -> Iterator[tuple[int, ...]]:
    """Pool orders along the pipeline, for every set of two or more pools."""
    n = len(cluster.pools)
    speed = [p.device.peak_bf16_flops for p in cluster.pools]
    for size in range(2, n + 1):
        for subset in itertools.combinations(range(n), size):
            if size <= MAX_ALL_ORDERS:
                yield from itertools.permutations(subset)
            else:
                fast_first = tuple(sorted(subset, key=lambda i: (-speed[i], i)))
                yield fast_first
                yield fast_first[::-1]


@dataclass(slots=True)
class _Group:
    """A group of ``_groups``: its probes, and its plans, built (and each counted by the
    rule it breaks, if any) only when the walk comes to them (:meth:`variants`)."""

    probes: list[Plan]
    size: int  # the candidates it stands for
    _make: Callable[[SearchStats], list[Plan]]

    def variants(self, stats: SearchStats) -> list[Plan]:
        """Its plans passing the rules (those breaking one counted in ``stats``)."""
        return self._make(stats)


def _groups(model: Model, cluster: PooledCluster, job: Job, space: SearchSpace,
            order: Sequence[int], stats: SearchStats) -> Iterator[_Group]:
    """The plans of pools ``order`` (module doc) that pass the rules, even split, in
    groups that share all but the schedule and ZeRO stage, with a probe per kind of
    backward (whole, or split for zero-bubble schedules) in ZeRO 0-2: no plan of the group
    runs its stages faster than the probe of its kind (ZeRO-3 only adds gathers), so the
    least of the probes' bounds is the group's. A probe is the first plan of its kind
    that passes the rules (every one of a kind has the same stage works:
    ``cost.stage.cost_key``); the group's other plans are built when the walk comes to
    them (most groups it never does)."""
    pools = [cluster.pools[i] for i in order]
    narrowest = min(pools, key=lambda c: (min(c.nvlink_domain, c.gpus), c.gpus))
    smallest = min(c.gpus for c in pools)
    schedules = [s for s in space.schedules if s.spec.chunks is Chunks.ONE]
    # the recompute choices (selective recompute's module sets) and jobs (bf16 states) the
    # space tries, as the search on one pool does (search/context.py); EP overlap, which
    # with pipelining runs two chunks a stage (the rule ep-overlap), runs on no plan here
    choices = recompute_choices(model, space)
    jobs = tuple(dict.fromkeys(j for z in ZeroStage for j in state_jobs(job, space, z)))
    for t in tp.degrees(narrowest, space):
        for c in cp.degrees(smallest // t, space):
            for d in capped_divisors(smallest // (t * c), smallest):
                counts = [pool.gpus // (d * t * c) for pool in pools]
                stage_pools = tuple(i for i, k in zip(order, counts, strict=True) for _ in range(k))
                placement = Placement(cluster=cluster, stage_pools=stage_pools)
                for lay in ep.foldings(model, Layout(dp=d, tp=t, pp=len(stage_pools), cp=c), space):
                    zeros = dp.zero_stages(lay, space)
                    # each job (bf16 states: ``context.state_jobs``) with the ZeRO stages
                    # that run it
                    by_job = {j: [(s, z) for s, z in itertools.product(schedules, zeros)
                                  if j in state_jobs(job, space, z)] for j in jobs}
                    for mbs, sp, exchange, recompute, each in itertools.product(
                            space.micro_batches, tp.sequence_parallel_choices(model, lay, space),
                            cp.exchanges(model, lay, job.seq_len, space), choices, jobs):
                        combos = by_job[each]
                        if not combos:
                            continue
                        group = _group(model, cluster.pools[order[0]], each, space, lay,
                                       placement, mbs, sp, exchange, recompute, combos, stats)
                        if group is not None:
                            yield group


def _group(model: Model, first: Cluster, job: Job, space: SearchSpace, lay: Layout,
           placement: Placement, mbs: int, sp: bool, exchange: CpComm, choice: Choice,
           combos: list[tuple[Schedule, ZeroStage]], stats: SearchStats) -> _Group | None:
    """One group of ``_groups`` (None where no plan of it passes the rules, each counted
    by the first it breaks)."""
    dispatch = ep.dispatch_for(model, first, lay, space, job.seq_len)
    recompute, modules = choice

    def make(sched: Schedule, zero: ZeroStage) -> Plan:
        return Plan(model=model, cluster=first, job=job, layout=lay, micro_batch=mbs,
                    schedule=sched, recompute=recompute, zero=zero, sequence_parallel=sp,
                    cp_comm=exchange, stack=space.stack, placement=placement,
                    moe_dispatch=dispatch, recompute_modules=modules)

    stats.generated += len(combos)
    # what the group shares is decided once (rules of the scopes up to sequence
    # parallelism read nothing later: parallel.common.Scope)
    broken = _broken(make(*combos[0]), _SHARED)
    if broken:
        stats.pruned[broken] += len(combos)
        return None
    asked: dict[tuple[Schedule, ZeroStage], tuple[Plan, str]] = {}

    def ask(sched: Schedule, zero: ZeroStage) -> tuple[Plan, str]:
        hit = asked.get((sched, zero))
        if hit is None:
            plan = make(sched, zero)
            hit = asked[(sched, zero)] = (plan, _broken(plan, _OWN) or (
                OUTSIDE_SPACE if space_problems(plan, space) else ""))
        return hit

    probes: dict[tuple[bool, ...], Plan] = {}  # one per kind of stage work (``cost_key``)
    for sched, zero in combos:
        if sched.spec.work_key not in probes:
            plan, why = ask(sched, zero)
            if not why:
                probes[sched.spec.work_key] = plan.replace(zero=min(zero, ZeroStage.GRADIENTS))

    def variants(counts: SearchStats) -> list[Plan]:
        out = []
        for sched, zero in combos:
            plan, why = ask(sched, zero)
            if why:
                counts.pruned[why] += 1
            else:
                out.append(plan)
        return out

    if not probes:  # none passes: each counted by its rule
        variants(stats)
        return None
    return _Group(list(probes.values()), len(combos), variants)


_SHARED = tuple(r for r in RULES if r.scope <= Scope.SEQUENCE_PARALLEL)
_OWN = tuple(r for r in RULES if r.scope > Scope.SEQUENCE_PARALLEL)


def _broken(plan: Plan, rules: Sequence[Rule]) -> str:
    """The id of the first of ``rules`` the plan breaks, or ""."""
    for rule in rules:
        if rule.broken(plan) is not None:
            return rule.id
    return ""


def _kinds(model: Model) -> tuple[bool, ...]:
    """The layer kinds a stage may hold: dense (True) and MoE (False) layers."""
    if not model.is_moe:
        return (True,)
    return (False,) if model.layers == model.moe_layers else (True, False)


def _work(view: Plan, stage: int, n: int, dense: bool) -> StageWork:
    """``stage`` holding ``n`` layers of one kind."""
    return stage_work_for(view, stage, n, n if dense else 0)


def compute_floor(probes: Sequence[Plan]) -> float:
    """A step time no plan of a group beats (``probes``: its plans alike but for their
    kind of backward, ``_groups``), cheaper and looser than :func:`fluid_bound`: read off
    one layer's costs on each pool (``search.layout_floor.layer_work``: its forward, input- and
    weight-gradient compute, forward TP collectives, CP exchange both ways, MoE dispatch
    and combine both ways and what its recompute runs again), tau_q on pool q (the less
    of a dense and an MoE layer), and the logits' compute on the last stage. A stage of n
    layers runs at least n tau_s per microbatch, the last the logits too (the embedding,
    TP at the heads and in backward, sends only add), so as in :func:`fluid_bound` some
    stage of any split takes at least (L + logits / tau_last) / sum(1 / tau_s), m times
    over. Per pool, not per stage: cheap enough for every group, so the fluid bound is
    worked out only for those that come up (Llama 3 70B on 32 H100 + 32 A100: 2,952 of
    its groups' 8,160 probes)."""
    plan = probes[0]
    assert plan.placement is not None
    pools = plan.placement.stage_pools
    views = plan.on_pools()
    per_pool = {}  # pool -> (one layer's work there, the logits')
    for q in set(pools):
        view = views[q]
        _, _, per_dense, per_moe, logits = layer_work(view, view.cp_comm, layer_core(view))
        per_pool[q] = (min(per_dense, per_moe) if plan.model.is_moe else per_dense, logits)
    terms = [(per_pool[q][1] if s == len(pools) - 1 else 0.0, per_pool[q][0])
             for s, q in enumerate(pools)]
    return plan.num_microbatches * _slowest_stage(terms, plan.model.layers)


def fluid_bound(plan: Plan) -> float:
    """A lower bound on the step time of ``plan`` under any layer split: m microbatches
    through the slowest stage.

    A stage's forward plus backward per microbatch, f_s(n) for n layers of one kind, is
    convex in n: layer terms grow linearly, and the exposed part of a collective beside
    compute is of the form max(0, a*n + b) (``tp.exposed_backward``), convex too. So
    f_s(n) >= c_s + n*tau_s with tau_s = f_s(2) - f_s(1) and c_s = f_s(1) - tau_s (the
    secant through n = 1, 2 stays below a convex function beyond them); of an MoE model
    with dense layers, each the smaller over the two kinds. A split whose every stage takes
    at most T holds at most sum((T - c_s) / tau_s) layers, so some stage takes at least
    T = (L + sum(c_s / tau_s)) / sum(1 / tau_s), and it is busy m times that, which the
    makespan, and the step, include. f_s is the stage's time as evaluated, its sends to
    another pool on the link between pools (``placed_stage_work``)."""
    return plan.num_microbatches * max(0.0, _slowest_stage(fluid_terms(plan), plan.model.layers))


def _slowest_stage(terms: Sequence[tuple[float, float]], layers: int) -> float:
    """The time some stage of any split of ``layers`` takes where stage s takes at least
    c_s + n tau_s for n layers (``terms``: (c_s, tau_s)): (L + sum c_s / tau_s) /
    sum 1 / tau_s (:func:`fluid_bound`)."""
    return ((layers + sum(c / tau for c, tau in terms))
            / sum(1.0 / tau for _, tau in terms))


def fluid_terms(plan: Plan) -> tuple[tuple[float, float], ...]:
    """(c_s, tau_s) of each stage (:func:`fluid_bound`): f_s(n) >= c_s + n tau_s. They read
    the plan as far as its stages' work does (``cost_key``: not its ZeRO stage below 3 or
    its schedule but for whether it splits the backward), so a group's plans share them."""
    return _fluid_terms(cost_key(plan))


@memo(16384)
def _fluid_terms(plan: Plan) -> tuple[tuple[float, float], ...]:
    assert plan.placement is not None
    model, p = plan.model, plan.layout.pp
    kinds = _kinds(model)
    pools = plan.placement.stage_pools
    # a stage's work depends on its index only through its pool, whether it holds the
    # embedding or the logits, and which of its sends cross to another pool
    memo: dict[tuple[int, bool, bool, bool, bool], tuple[float, float]] = {}
    crossing: dict[int, float] = {}
    out = []
    for s in range(p):
        cls = (pools[s], s == 0, s == p - 1, s < p - 1 and pools[s + 1] != pools[s],
               s > 0 and pools[s - 1] != pools[s])
        if cls not in memo:
            view = plan.on_stage(s)
            if pools[s] not in crossing:
                crossing[pools[s]] = between_send_seconds(plan, s)
            one, two = ([placed_stage_work(plan, s, _work(view, s, n, k), crossing[pools[s]])
                         for k in kinds] for n in (1, 2))
            tau = min(b.forward + b.backward - a.forward - a.backward
                      for a, b in zip(one, two, strict=True))
            memo[cls] = (min(a.forward + a.backward for a in one) - tau, tau)
        out.append(memo[cls])
    return tuple(out)


def capped_fluid_bound(plan: Plan, caps: Sequence[float]) -> float:
    """:func:`fluid_bound` where stage s holds at most ``caps[s]`` layers in memory
    (:func:`layer_caps`): a split whose every stage takes at most T holds at most
    g(T) = sum of min(cap_s, (T - c_s) / tau_s) layers (none where that is below 0), so
    the slowest stage of any split that fits takes at least the least T with g(T) >= L,
    and is busy m times that. g is piecewise linear and rises: its breakpoints are
    walked in order. Infinite where the caps hold fewer than L layers. Where memory
    binds (a fast pool whose GPUs hold fewer layers than its speed would take) this is
    the bottleneck's own order: Llama 3 70B on 32 H100 + 32 A100 splits 1,134 plans
    whose fluid bound was 5% or more below the split's bottleneck."""
    terms = fluid_terms(plan)
    layers = plan.model.layers
    return plan.num_microbatches * max(0.0, _slowest_stage(terms, layers),
                                       least_bottleneck(terms, caps, layers))


def least_bottleneck(terms: Sequence[tuple[float, float]], caps: Sequence[float],
                     layers: int) -> float:
    """The least T with sum over stages of min(caps[s], max(0, (T - c_s) / tau_s)) >= layers
    (``terms``: (c_s, tau_s)); infinite where the caps hold fewer layers."""
    if sum(caps) < layers:
        return float("inf")
    events = []
    for (fixed, tau), cap in zip(terms, caps, strict=True):
        events.append((fixed, 1.0 / tau))
        events.append((fixed + cap * tau, -1.0 / tau))
    events.sort()
    t, held, slope = events[0][0], 0.0, 0.0
    for at, change in events:
        if slope > 0 and held + slope * (at - t) >= layers:
            return t + (layers - held) / slope
        held += slope * (at - t)
        t, slope = at, slope + change
    return t  # every stage full by the last breakpoint, where g reaches their sum


def room_for_layers(plan: Plan, limits: Sequence[float]) -> bool:
    """Whether the stages' memory can hold the model's layers at all (a quick necessary
    condition before :func:`balanced_split`, which decides it).

    A stage's peak grows by the same bytes with each layer of a kind (its weights, grads
    and optimizer shard, and its activations times the microbatches the stage holds), so
    with m(n) its peak at n layers, n layers fit within ``limit`` only if
    n <= (limit - m(1)) / (m(2) - m(1)) + 1, taking the smaller growth of the model's two
    layer kinds. If even these counts, summed over the stages, fall short of the
    model's layers, no split fits."""
    caps = layer_caps(plan, limits)
    return caps is not None and sum(caps) >= plan.model.layers


def layer_caps(plan: Plan, limits: Sequence[float]) -> list[float] | None:
    """The most layers each stage can hold within ``limits[s]`` (:func:`room_for_layers`:
    n <= (limit - m(1)) / (m(2) - m(1)) + 1, the model's layers where a layer adds no
    memory); None where a stage cannot hold one."""
    model, p = plan.model, plan.layout.pp
    m = plan.num_microbatches
    caps = []
    for s in range(p):
        view = plan.on_stage(s)
        held = peak_inflight(plan.schedule, p, m, 1, s)
        one = two = float("inf")
        for dense in _kinds(model):
            m1 = stage_memory(view, s, _work(view, s, 1, dense), held).peak
            m2 = stage_memory(view, s, _work(view, s, 2, dense), held).peak
            one, two = min(one, m1), min(two, m1 + max(0.0, m2 - m1))
        if one > limits[s]:
            return None
        growth = two - one
        caps.append(model.layers if growth <= 0 else (limits[s] - one) / growth + 1)
    return caps


def balanced_split(plan: Plan, limits: Sequence[float]) -> tuple[tuple[int, ...], float] | None:
    """Layers per stage (contiguous, at least one each) that minimize the slowest stage's
    forward plus backward per microbatch, each stage's memory peak within ``limits[s]``
    (bytes), and that slowest stage's seconds; None where no split fits.

    A stage's time and memory grow with its layer count, so for a target time T the
    greedy split that gives each stage in turn as many layers as stay within T and its
    memory (leaving one for each later stage) fits iff any split does: it leaves the
    later stages as few layers as any split within T can. The least feasible T is found
    by bisection; the stage times are those ``evaluate`` uses (``stage_work_for`` on the
    stage's pool, the sends between pools costed by ``placed_stage_work``)."""
    model, lay = plan.model, plan.layout
    p, n_layers, m = lay.pp, model.layers, plan.num_microbatches
    if n_layers < p:
        return None
    views = [plan.on_stage(s) for s in range(p)]
    crossing = [between_send_seconds(plan, s) for s in range(p)]
    inflight = [peak_inflight(plan.schedule, p, m, 1, s) for s in range(p)]
    dense_total = n_layers - model.moe_layers if model.is_moe else n_layers
    memo: dict[tuple[int, int, int], tuple[float, bool]] = {}

    def stage(s: int, start: int, n: int) -> tuple[float, bool]:
        dense = max(0, min(dense_total - start, n))
        key = (s, dense, n)
        found = memo.get(key)
        if found is None:
            work = placed_stage_work(plan, s, stage_work_for(views[s], s, n, dense), crossing[s])
            fits = stage_memory(views[s], s, work, inflight[s]).peak <= limits[s]
            found = memo[key] = (work.forward + work.backward, fits)
        return found

    # each stage's take in the last greedy split: where the next one's search starts (the
    # bisection's targets close in, and the takes move little from one to the next)
    hint = [max(1, n_layers // p)] * p

    def most(s: int, start: int, target: float) -> int:
        """The most layers stage s can take from ``start`` within ``target`` and memory,
        leaving one for each later stage (0: not even one); time and memory grow with
        the count, so the largest that fits is bracketed by steps doubling away from the
        stage's last take, then found by bisection."""
        top = n_layers - start - (p - s - 1)
        if top <= 0:
            return 0

        def ok(n: int) -> bool:
            seconds, fits = stage(s, start, n)
            return seconds <= target and fits

        guess = min(hint[s], top)
        step = 1
        if ok(guess):  # the largest is in [guess, top]
            lo, hi = guess, top
            while lo < top:
                nxt = min(lo + step, top)
                if not ok(nxt):
                    hi = nxt - 1
                    break
                lo, step = nxt, 2 * step
        else:  # in [0, guess - 1]
            lo, hi = 0, guess - 1
            while hi > 0:
                nxt = max(hi - step + 1, 1)
                if ok(nxt):
                    lo = nxt
                    break
                hi, step = nxt - 1, 2 * step
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def greedy(target: float) -> list[int] | None:
        out, start = [], 0
        for s in range(p - 1):
            take = most(s, start, target)
            if not take:
                return None
            hint[s] = take
            out.append(take)
            start += take
        seconds, fits = stage(p - 1, start, n_layers - start)
        return [*out, n_layers - start] if seconds <= target and fits else None

    def slowest(split: Sequence[int]) -> float:
        return max(stage(s, sum(split[:s]), n)[0] for s, n in enumerate(split))

    best = greedy(float("inf"))
    if best is None:
        return None
    # bisection on the bottleneck; a split found within a target lowers the bracket to
    # its own slowest stage
    lo, hi = 0.0, slowest(best)
    for _ in range(_BISECTIONS):
        if hi - lo <= _TOLERANCE * hi:
            break
        mid = (lo + hi) / 2
        found = greedy(mid)
        if found is None:
            lo = mid
        else:
            best, hi = found, slowest(found)
    return tuple(best), hi
