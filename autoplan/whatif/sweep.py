"""How many GPUs, for how long, at what cost: a search per GPU count, the plans'
economics (whatif/economics.py), and the Pareto front of days against dollars.

Per count the search returns its top k plans by throughput; the count's point is the
best of them by the objective (for time and cost that is the fastest plan: at a fixed
count, GPU-hours are proportional to the step time). The front keeps the points no
other point beats on both days and cost (cost by GPU-hours where there is no price:
one price per GPU-hour orders them the same). ``constrain`` then applies a deadline
and a budget and names the constraint that kept a better point out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autoplan import caches, forking
from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.model import Model
from autoplan.descriptors.space import SearchSpace
from autoplan.plan import Plan, Prediction
from autoplan.search.engine import SearchResult, SearchStats
from autoplan.whatif.economics import Economics, Objective, economics

# told what has finished, in a sentence (the command line prints it as progress)
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Point:
    """One plan with what a whole run on it takes."""

    plan: Plan
    prediction: Prediction
    economics: Economics

    @property
    def gpus(self) -> int:
        return self.economics.gpus

    @property
    def cost(self) -> float:
        """Dollars, or GPU-hours where there is no price (one price per GPU-hour orders
        the points the same)."""
        e = self.economics
        return e.cost_usd if e.cost_usd is not None else e.gpu_hours


@dataclass(frozen=True, slots=True)
class Sweep:
    objective: Objective
    counts: tuple[int, ...]
    results: tuple[SearchResult, ...]  # one per count, in count order
    every: tuple[Point, ...]  # every plan found, by count, each count's in the search's order
    points: tuple[Point, ...]  # the best plan of each count that has one, by count
    front: tuple[Point, ...]  # non-dominated in (days, cost), by count

    def ranked(self) -> list[Point]:
        """Every plan found, best first by the objective (ties: fewer GPUs, then the
        search's own order; ``sorted`` is stable)."""
        return sorted(self.every, key=lambda p: (p.economics.key(self.objective), p.gpus))

    def stats(self) -> SearchStats:
        total = SearchStats()
        for result in self.results:
            total.merge(result.stats)
        return total

    def why_none(self) -> str:
        return "; ".join(f"{n} GPUs: {r.why_none()}" for n, r in zip(self.counts, self.results, strict=True))


Searcher = Callable[[Model, Cluster, Job, SearchSpace, int], SearchResult]


def sweep(model: Model, clusters: Sequence[Cluster], job: Job, space: SearchSpace, *,
          train_tokens: float, objective: Objective = Objective.TIME,
          price_per_gpu_hour: float | None = None, top_k: int = 10,
          searcher: Searcher | None = None, jobs: int | None = None,
          min_headroom_bytes: float = 0.0, progress: Progress | None = None,
          asynchronous: bool = False) -> Sweep:
    """Search each cluster size (ascending GPUs); see module doc. ``price_per_gpu_hour``
    None takes the device's (which may be None too: costs are then None). ``jobs``:
    searches run at once (None: one per usable CPU). ``min_headroom_bytes``: what every
    plan leaves free per GPU (``search.engine.search``; a ``searcher`` given decides its own).
    ``progress``: told of each count as its search ends. ``asynchronous``: checkpoints
    saved behind training, where the clusters fail (whatif/reliability.py)."""
    clusters = sorted(clusters, key=lambda c: c.gpus)
    assert clusters and train_tokens > 0
    price = price_per_gpu_hour if price_per_gpu_hour is not None else \
        clusters[0].device.price_per_gpu_hour
    with caches.scope():  # searches run in turn share their layers' costs (autoplan.caches)
        if searcher is not None:
            results = tuple(searcher(model, c, job, space, top_k) for c in clusters)
        else:
            results = _search_all(model, clusters, job, space, top_k, jobs, min_headroom_bytes,
                                  progress)
    every: list[Point] = []
    points = []
    for result in results:
        found = [Point(r.plan, r.prediction,
                       economics(r.plan, r.prediction, train_tokens, price, asynchronous))
                 for r in result.plans]
        if found:
            points.append(min(found, key=lambda p: p.economics.key(objective)))
        every.extend(found)
    return Sweep(objective=objective, counts=tuple(c.gpus for c in clusters), results=results,
                 every=tuple(every), points=tuple(points), front=pareto_front(points))


def _search_all(model: Model, clusters: Sequence[Cluster], job: Job, space: SearchSpace,
                top_k: int, jobs: int | None, headroom: float = 0.0,
                progress: Progress | None = None) -> tuple[SearchResult, ...]:
    """One search per cluster (ascending GPUs), dealt to ``jobs`` processes where the
    platform forks (``forking.deal``; None: one per usable CPU): one works up from the
    fewest GPUs, the next down from the most, each searching counts next to the ones it
    searched (their layers' costs are memoized for the next) until they meet. The results
    are the same as one after another, in cluster order."""
    from autoplan.search.engine import search

    done: list[int] = []

    def told(i: int, _: SearchResult) -> None:
        done.append(i)
        if progress is not None:
            progress(f"searched {clusters[i].gpus:,} GPUs ({len(done)} of {len(clusters)} counts)")

    found = forking.deal(range(len(clusters)),
                         lambda i: search(model, clusters[i], job, space, top_k, headroom),
                         told, jobs)
    return tuple(found[i] for i in range(len(clusters)))


def pareto_front(points: Sequence[Point]) -> tuple[Point, ...]:
    """The points no other point dominates in (train days, cost): none is at most as
    long and at most as dear and better in one. Of exact duplicates the one with fewer
    GPUs stays. Ordered by GPUs."""
    ordered = sorted(points, key=lambda p: p.gpus)
    front = []
    for i, p in enumerate(ordered):
        dp_, cp_ = p.economics.train_days, p.cost
        dominated = False
        for j, q in enumerate(ordered):
            if j == i:
                continue
            dq, cq = q.economics.train_days, q.cost
            if dq <= dp_ and cq <= cp_ and (dq < dp_ or cq < cp_ or j < i):
                dominated = True
                break
        if not dominated:
            front.append(p)
    return tuple(front)


@dataclass(frozen=True, slots=True)
class Constrained:
    """The front under a deadline and a budget."""

    kept: tuple[Point, ...]  # the front points that meet both, by GPUs
    chosen: Point | None  # the best of them by the objective
    binding: tuple[str, ...]  # "deadline" / "budget": each kept a better point out
    reason: str  # one sentence: what bound, or why nothing is left


def meets(p: Point, deadline_days: float | None, budget_usd: float | None) -> tuple[bool, bool]:
    """(meets the deadline, meets the budget); no limit is always met."""
    on_time = deadline_days is None or p.economics.train_days <= deadline_days
    cost = p.economics.cost_usd
    assert budget_usd is None or cost is not None, "a budget needs a price"
    in_budget = budget_usd is None or (cost is not None and cost <= budget_usd)
    return on_time, in_budget


def constrain(front: Sequence[Point], objective: Objective, *,
              deadline_days: float | None = None, budget_usd: float | None = None) -> Constrained:
    """Keep the front points that meet the deadline and the budget; the chosen one is
    the best kept by ``objective``, and a constraint binds when a point better by the
    objective misses it (so lifting it would change the answer)."""
    best = sorted(front, key=lambda p: (p.economics.key(objective), p.gpus))
    kept = [p for p in best if all(meets(p, deadline_days, budget_usd))]
    chosen = kept[0] if kept else None
    better = best if chosen is None else best[:best.index(chosen)]
    misses: Counter[str] = Counter()
    for p in better:
        on_time, in_budget = meets(p, deadline_days, budget_usd)
        misses["deadline"] += not on_time
        misses["budget"] += not in_budget
    binding = tuple(c for c in ("deadline", "budget") if misses[c])
    return Constrained(kept=tuple(sorted(kept, key=lambda p: p.gpus)), chosen=chosen,
                       binding=binding,
                       reason=_reason(front, chosen, binding, objective, deadline_days, budget_usd))


def _reason(front: Sequence[Point], chosen: Point | None, binding: tuple[str, ...],
            objective: Objective, deadline: float | None, budget: float | None) -> str:
    if deadline is None and budget is None:
        return ""
    limits = " and ".join(x for x in (
        f"a {deadline:g}-day deadline" if deadline is not None else "",
        f"a ${budget:,.0f} budget" if budget is not None else "") if x)
    if not front:
        return f"no plan to hold to {limits}"
    fastest = min(front, key=lambda p: (p.economics.train_days, p.gpus))
    cheapest = min(front, key=lambda p: (p.cost, p.gpus))
    if chosen is None:
        return (f"no GPU count meets {limits}: the fastest ({fastest.gpus} GPUs) takes "
                f"{fastest.economics.train_days:.1f} days"
                + (f" and costs ${fastest.economics.cost_usd:,.0f}"
                   if fastest.economics.cost_usd is not None else "")
                + (f"; the cheapest ({cheapest.gpus} GPUs) costs "
                   f"${cheapest.economics.cost_usd:,.0f} and takes "
                   f"{cheapest.economics.train_days:.1f} days"
                   if cheapest.economics.cost_usd is not None else ""))
    if not binding:
        return f"{limits} do not bind: the best plan by {objective.value} meets them" \
            if deadline is not None and budget is not None else \
            f"{limits} does not bind: the best plan by {objective.value} meets it"
    what = " and ".join(binding)
    return (f"the {what} {'bind' if len(binding) > 1 else 'binds'}: "
            f"{chosen.gpus} GPUs is the best by {objective.value} within {limits}")
