"""Serving at several GPU counts (``autoplan serve --gpus 8,16,32`` or ``8..64``): the serve
search at each count, the count an objective prefers, and the front of tokens/s per GPU
against tokens/s per user over every deployment of every count.

Objectives, among the counts whose best deployment meets the SLO (the rest after them):

- ``goodput``: the most requests/s meeting the SLO per GPU (with no SLO: output tokens/s
  per GPU);
- ``cost``: the fewest dollars per million output tokens (``per_million``: GPU-hours at the
  device's or ``--price``'s price per GPU-hour);
- ``energy``: the least facility energy per million output tokens (board power between
  idle and load by the share of the run the GPUs compute, times the cluster's PUE).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.library import with_gpus
from autoplan.descriptors.model import Model
from autoplan.errors import InputError
from autoplan.serving.deployment import Precision, Slo, Speculative, Workload
from autoplan.serving.engine import Engine
from autoplan.serving.search import Ranked, ServeResult, pareto, serve_search


class ServeObjective(str, enum.Enum):
    GOODPUT = "goodput"
    COST = "cost"
    ENERGY = "energy"


@dataclass(frozen=True, slots=True)
class CountResult:
    """The serve search at one GPU count."""

    gpus: int
    result: ServeResult

    @property
    def best(self) -> Ranked | None:
        return self.result.plans[0] if self.result.plans else None


@dataclass(frozen=True, slots=True)
class ServeSweep:
    counts: tuple[CountResult, ...]  # ascending GPU counts
    order: tuple[int, ...]  # GPU counts by the objective, best first (counts with a plan)
    front: tuple[Ranked, ...]  # every count's deployments: non-dominated per GPU x per user
    objective: ServeObjective

    @property
    def chosen(self) -> CountResult | None:
        return next((c for c in self.counts if self.order and c.gpus == self.order[0]), None)


def objective_value(r: Ranked, objective: ServeObjective, slo: Slo) -> float:
    """What the objective minimizes for a deployment (inf where it cannot say)."""
    p = r.prediction
    if objective is ServeObjective.GOODPUT:
        return -(r.goodput_per_gpu if slo.any else r.per_gpu)
    pm = p.per_million
    value = None if pm is None else pm.cost_usd if objective is ServeObjective.COST else pm.energy_kwh
    return math.inf if value is None else value


def serve_sweep(model: Model, cluster: Cluster, counts: Sequence[int], engine: Engine, workload: Workload,
                slo: Slo, weights: Sequence[Precision], kv_caches: Sequence[Precision], *,
                objective: ServeObjective = ServeObjective.GOODPUT, price_per_gpu_hour: float | None = None,
                disaggregated: bool = False, speculative: Speculative | None = None,
                progress: Callable[[str], None] | None = None,
                engine_version: str | None = None) -> ServeSweep:
    """The serve search at each of ``counts`` GPUs of ``cluster``'s kind (module doc);
    ``progress`` is told of each count as its search ends."""
    dev = cluster.device
    if objective is ServeObjective.COST and price_per_gpu_hour is None and dev.price_per_gpu_hour is None:
        raise InputError.single("--objective", "", f"cost needs a price: {dev.name}'s file gives no "
                                                   "price_per_gpu_hour; give --price")
    if objective is ServeObjective.ENERGY and (dev.power_load_W is None or dev.power_idle_W is None):
        raise InputError.single("--objective", "", f"energy needs {dev.name}'s power_W (load and idle) "
                                                   "in its device file")
    results = []
    for n in sorted(set(counts)):
        result = serve_search(model, with_gpus(cluster, n), engine, workload, slo, weights, kv_caches,
                              disaggregated=disaggregated, speculative=speculative,
                              engine_version=engine_version)
        if price_per_gpu_hour is not None:
            price = price_per_gpu_hour
            result = replace(result, plans=tuple(replace(r, prediction=r.prediction.priced(price))
                                                 for r in result.plans))
        results.append(CountResult(n, result))
        if progress is not None:
            progress(f"simulated {n:,} GPUs ({len(results)} of {len(set(counts))} counts)")
    bests = [(c.gpus, best) for c in results if (best := c.best) is not None]
    order = sorted(bests, key=lambda gb: (not gb[1].prediction.meets_slo,
                                          objective_value(gb[1], objective, slo), gb[0]))
    every = [r for c in results for r in c.result.plans]
    return ServeSweep(tuple(results), tuple(g for g, _ in order), pareto(every), objective)
