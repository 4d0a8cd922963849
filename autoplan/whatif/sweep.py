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

import multiprocessing
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autoplan import caches, forking
from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.model import Model
from autoplan.descriptors.space import SearchSpace
from autoplan.plan import Plan, Prediction
from autoplan.search.engine import Ceiling, Ranked, SearchResult, SearchStats
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
          asynchronous: bool = False, deadline_days: float | None = None,
          budget_usd: float | None = None) -> Sweep:
    """Search each cluster size (ascending GPUs); see module doc. ``price_per_gpu_hour``
    None takes the device's (which may be None too: costs are then None). ``jobs``:
    searches run at once (None: one per usable CPU). ``min_headroom_bytes``: what every
    plan leaves free per GPU (``search.engine.search``; a ``searcher`` given decides its own).
    ``progress``: told of each count as its search ends. ``asynchronous``: checkpoints
    saved behind training, where the clusters fail (cost/reliability.py).

    Each count's search returns its best plan and those of its top_k that can enter the
    sweep's top_k by the objective among the plans meeting ``deadline_days`` and
    ``budget_usd`` (:class:`_Wanted`): :meth:`Sweep.ranked` of them is the same as of
    every count's top_k, for less search. Where no ceiling applies, every count's
    top_k."""
    clusters = sorted(clusters, key=lambda c: c.gpus)
    assert clusters and train_tokens > 0
    price = price_per_gpu_hour if price_per_gpu_hour is not None else \
        clusters[0].device.price_per_gpu_hour
    # searches run in turn share their layers' costs (autoplan.caches); the collector
    # stays paused between them as within each
    with caches.collector_paused(), caches.scope():
        if searcher is not None:
            results = tuple(searcher(model, c, job, space, top_k) for c in clusters)
        else:
            wanted = _Wanted.make(clusters, job, objective, train_tokens, price, top_k,
                                  deadline_days, budget_usd)
            results = _search_all(model, clusters, job, space, top_k, jobs, min_headroom_bytes,
                                  progress, wanted)
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
                progress: Progress | None = None,
                wanted: _Wanted | None = None) -> tuple[SearchResult, ...]:
    """One search per cluster (ascending GPUs), dealt to ``jobs`` processes where the
    platform forks (``forking.deal``; None: one per usable CPU): one works up from the
    fewest GPUs, the next down from the most, each searching counts next to the ones it
    searched (their layers' costs are memoized for the next) until they meet; the counts
    too small to hold the model, the quickest searched, come last. With a
    ceiling (``wanted``), the most GPUs' search comes first and the others but those that
    cannot hold the model wait for it (:class:`_Wanted`). The results are the same as one
    after another, in cluster order, and so are their counts."""
    from autoplan.search.launchable import search

    done: list[int] = []

    def told(i: int, _: SearchResult) -> None:
        done.append(i)
        if progress is not None:
            progress(f"searched {clusters[i].gpus:,} GPUs ({len(done)} of {len(clusters)} counts)")

    seed = len(clusters) - 1
    # where even one bf16 copy of the weights and gradients does not fit: no plan is found
    # there (no ceiling, none waited for), and once the layers' costs are memoized its
    # search is among the shortest (DeepSeek-V3 on 8-32 H100: 0.02-0.13 s of a 5 s sweep)
    unheld = [i for i, c in enumerate(clusters)
              if c.gpus * c.device.mem_bytes < 4 * model.params_total]
    free = {seed, *unheld}

    def one(i: int) -> SearchResult:
        if wanted is None or i in free:
            result = search(model, clusters[i], job, space, top_k, headroom)
            if wanted is not None and i == seed:
                wanted.publish(result.plans, clusters[i])
            return result
        return search(model, clusters[i], job, space, top_k, headroom,
                      wanted.ceiling(clusters[i]))

    order, last = list(range(len(clusters))), []
    if forking.dealt_to(len(order), jobs) == 1:
        if wanted is not None:
            order = [seed, *order[:-1]]  # in turn: the seed first (it is taken from the back else)
    elif unheld and len(unheld) < len(order):
        # the counts that hold no model are dealt once the others are taken: the process
        # ending first searches them while the other ends (the two met at a count of the
        # heaviest, and one waited up to 0.4 s of 3 for the other)
        order, last = [i for i in order if i not in unheld], unheld
    # a process that ends without the seed's plans lets the searches waiting on them go
    # (without a ceiling: the sweep then fails on the seed's failure anyway)
    found = forking.deal(order, one, told, jobs, None if wanted is None else wanted.release,
                         last)
    return tuple(found[i] for i in range(len(clusters)))


class _Wanted:
    """The ceiling of a sweep's searches (``search.results.Ceiling``): the plans no count
    needs, as no one of them can enter the sweep's top k by the objective (among those
    meeting its deadline and budget) nor be its count's best.

    Where a plan's objective is a fixed multiple of its step time at each count (time and
    cost where the cluster gives no failure model: days = step x tokens / tokens per step,
    GPU-hours that times the GPUs), a plan whose objective passes the k-th best of plans
    already found cannot enter the top k, and its count's best is its fastest (which the
    search keeps). The plans found first are those of the most GPUs (the seed, searched
    without a ceiling; by time its plans are the fastest of the sweep): every other count
    but those that cannot hold the model waits for them (``publish``) once it has found
    its first plan, and its search stops at their k-th best objective, as a step time at
    its count. Each count's ceiling is the same whichever process runs it and whenever:
    the answer and the counts of what each search did are the same however the counts
    are dealt.
    Where a failure model's wall-clock factor or the energy differ by plan, and where one
    plan is wanted of each count, there is no ceiling."""

    def __init__(self, objective: Objective, train_tokens: float, tokens_per_step: float,
                 top_k: int, deadline_days: float | None, budget_usd: float | None,
                 price: float | None):
        ctx = multiprocessing.get_context("fork") if forking.can_fork() else multiprocessing
        self.objective, self.top_k = objective, top_k
        self.deadline, self.budget, self.price = deadline_days, budget_usd, price
        self.days_per_step_s = train_tokens / tokens_per_step / 86_400.0  # days per second of step
        self._kth = ctx.RawValue("d", float("inf"))  # the seed's k-th best objective value
        self._published = ctx.Event()

    @classmethod
    def make(cls, clusters: Sequence[Cluster], job: Job, objective: Objective,
             train_tokens: float, price: float | None, top_k: int,
             deadline_days: float | None, budget_usd: float | None) -> _Wanted | None:
        """The sweep's, where a ceiling applies (class doc); else None."""
        if (top_k == 1 or objective not in (Objective.TIME, Objective.COST)
                or any(c.fails for c in clusters)):
            return None
        return cls(objective, train_tokens, job.tokens_per_step, top_k, deadline_days,
                   budget_usd, price)

    def _per_s(self, cluster: Cluster) -> float:
        """The objective per second of step time at ``cluster``'s count."""
        return self.days_per_step_s * (1.0 if self.objective is Objective.TIME
                                       else cluster.gpus * 24.0)

    def publish(self, plans: Sequence[Ranked], cluster: Cluster) -> None:
        """The seed's plans (found on ``cluster``): their k-th best objective value among
        those meeting the deadline and budget (infinite where fewer do)."""
        values = []
        for r in plans:
            step = r.prediction.step_time_s
            days = step * self.days_per_step_s
            cost = None if self.price is None else days * 24.0 * cluster.gpus * self.price
            if ((self.deadline is None or days <= self.deadline)
                    and (self.budget is None or (cost is not None and cost <= self.budget))):
                values.append(step * self._per_s(cluster))
        values.sort()
        self._kth.value = values[self.top_k - 1] if len(values) >= self.top_k else float("inf")
        self._published.set()

    def release(self) -> None:
        """Let the searches waiting for the seed's plans go (without a ceiling, where
        none were published)."""
        self._published.set()

    def ceiling(self, cluster: Cluster) -> Ceiling:
        """The search ceiling of ``cluster``'s count. Asked first when the search has
        found its first plan (its walk until then reads no threshold), it waits there for
        the seed's plans: a search started before they are published runs on meanwhile."""
        per_s = self._per_s(cluster)
        cap: list[float] = []

        def told(_: Ranked) -> float:
            if not cap:
                self._published.wait()
                cap.append(self._kth.value / per_s * (1 + 1e-9))
            return cap[0]

        return told


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
