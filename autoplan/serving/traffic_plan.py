"""A deployment planned for traffic that changes over the day (``serve --traffic``).

**One replica shape for the whole day.** Autoscalers (Kubernetes' HorizontalPodAutoscaler,
KEDA, Dynamo's planner) add and remove replicas of one template; none changes TP or the
batch limit as the day goes. So the shape is chosen once: the replica that serves the most
requests per second per GPU while meeting the SLO at the lengths of the busiest period
(the most offered tokens per second). That is the shape ``serve`` ranks first where every
deployment is loaded to the most it serves under the SLO (its ranking is goodput per GPU
under the SLO), and the one with the fewest GPUs at the peak; as replicas are whole, the
rounding of each period can favour a smaller replica, so a larger one must beat a smaller
one by more than the search's tolerance (CAPACITY_TOLERANCE), and a tie goes to the
smaller (finer steps through the night).

**A replica's capacity** is the highest Poisson rate one replica serves meeting the SLO
(its queue steady, TTFT and TPOT within the SLO at its percentile), found by search over
the rate with :func:`autoplan.serving.evaluate.evaluate_serving` (doubling, then bisection
to CAPACITY_TOLERANCE; every evaluation cached). Shapes are tried smallest first, a larger
one first at the rate per GPU it must beat, so most cost one evaluation.

**Replicas per period** = ceil(rate / capacity at the period's lengths), or for a closed
loop ceil(clients / requests in flight per replica at capacity), then checked by
evaluating the period on that many replicas (where it falls short, as a closed loop's burst
of first requests can, doubled until some number meets and bisected back to the fewest). A router is
assumed to spread requests at random over the replicas, each a Poisson stream at its share
of the rate (Poisson splitting: what the simulator models, ``serving.simulate``); a router
that balances by load (least in flight, KV-aware as Dynamo's and llm-d's) does at least as
well, so the figures are conservative. Replicas are assumed ready when their period begins
(start them a model load earlier); a period with no requests keeps one replica (scaling to
zero makes the first request wait for a model load).

**Static against scaled.** Static provisioning runs the busiest period's replicas all day;
scaling runs each period's. GPU-hours are GPUs x hours; energy is each GPU's board power
between its idle and load figures (``power_W`` of the device file) by the share of the
period the simulated scheduler runs iterations, times the cluster's PUE, over the hours
(as ``serving.evaluate.per_million`` prices a million tokens; load is the datasheet's
maximum board power: an upper estimate); dollars are GPU-hours at ``--price`` or the
device's ``price_per_gpu_hour``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from autoplan import caches
from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.library import with_gpus
from autoplan.errors import InputError
from autoplan.serving.autoscale import HPA_TOLERANCE, Autoscale, ScalingMetric, ScalingPeriod
from autoplan.serving.deployment import (
    Arrival,
    ArrivalKind,
    Deployment,
    Dist,
    Lengths,
    ServingPlan,
)
from autoplan.serving.engine import engine_defaults
from autoplan.serving.evaluate import ServingPrediction, evaluate_serving, schedulers_of
from autoplan.serving.planfile import MAX_RATE, MAX_REQUESTS, MIN_RATE, holding_gpus
from autoplan.serving.request import ServeRequest
from autoplan.serving.search import BATCH_CAPS, deployments
from autoplan.serving.traffic import Period, Traffic

CAPACITY_TOLERANCE = 0.02  # the capacity search stops within 2% (percentiles move about that)
MAX_STEPS = 40  # doublings or halvings of the rate: 2^40 spans MIN_RATE to MAX_RATE
REPLICA_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)  # GPUs per replica tried
SIZE_SPREAD = 4  # replica sizes tried: from the smallest that fits to 4x it
MAX_REPLICAS = 1 << 16  # replicas of one period at most (planfile's MAX_DEGREE)
Lengths2 = tuple[float, float]  # a period's mean prompt and output tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class Capacity:
    """What one replica of ``deployment`` serves under the SLO at ``lengths`` (module doc)."""

    deployment: Deployment  # one replica
    lengths: Lengths2
    rate_rps: float  # the most requests/s meeting the SLO, within CAPACITY_TOLERANCE
    prediction: ServingPrediction  # at that rate

    @property
    def per_gpu(self) -> float:
        return self.rate_rps / self.deployment.gpus

    @property
    def requests_in_flight(self) -> float:
        """Requests on the replica at capacity, running and queued (Little's law: the rate
        times the mean time a request spends from arrival to its last token)."""
        return self.rate_rps * self.prediction.e2e_ms.mean / 1e3

    @property
    def kv_cache_usage(self) -> float:
        """The share of the replica's KV cache in use at capacity (``kv_in_use``)."""
        p = self.prediction
        if not p.kv_cache_tokens or p.kv_in_use_tokens is None:
            return 0.0
        return min(1.0, p.kv_in_use_tokens / p.kv_cache_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class PeriodPlan:
    """One period: the replicas it needs, and the deployment's prediction there, scaled and
    static (None: no requests)."""

    period: Period
    lengths: Lengths2
    replicas: int
    gpus: int
    offered_rps: float  # the rate given; a closed loop's: what it serves on ``replicas``
    utilization: float  # the load over what ``replicas`` serve under the SLO
    prediction: ServingPrediction | None
    static_prediction: ServingPrediction | None
    meets_slo: bool
    energy_kwh: float | None
    static_energy_kwh: float | None

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.period.hours


@dataclass(frozen=True, slots=True, kw_only=True)
class Totals:
    """Over every period: GPU-hours, facility energy and dollars (None: unknown)."""

    gpu_hours: float
    energy_kwh: float | None
    cost_usd: float | None

    def to_dict(self) -> dict[str, float | None]:
        return {"gpu_hours": self.gpu_hours, "energy_kwh": self.energy_kwh, "cost_usd": self.cost_usd}


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficPlan:
    traffic: Traffic
    shape: Capacity  # the replica chosen, at the busiest period's lengths
    shapes_tried: int
    evaluations: int
    periods: tuple[PeriodPlan, ...]
    static: Totals
    scaled: Totals
    autoscale: Autoscale
    plan: ServingPlan  # the busiest period's deployment (its most replicas), with ``autoscale``
    prediction: ServingPrediction  # of ``plan``
    price_per_gpu_hour: float | None

    @property
    def meets_slo(self) -> bool:
        return all(p.meets_slo for p in self.periods)

    @property
    def saving(self) -> Totals:
        """What scaling saves against static provisioning."""
        def less(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else a - b
        return Totals(gpu_hours=self.static.gpu_hours - self.scaled.gpu_hours,
                      energy_kwh=less(self.static.energy_kwh, self.scaled.energy_kwh),
                      cost_usd=less(self.static.cost_usd, self.scaled.cost_usd))

    def to_dict(self) -> dict[str, object]:
        q = self.plan.slo.percentile
        periods = []
        for pp in self.periods:
            p = pp.prediction
            periods.append({
                "start": pp.period.label(), "start_h": pp.period.start_h, "hours": pp.period.hours,
                "rate_rps": pp.period.rate_rps, "concurrency": pp.period.concurrency,
                "offered_rps": pp.offered_rps, "input_len": pp.lengths[0], "output_len": pp.lengths[1],
                "replicas": pp.replicas, "gpus": pp.gpus, "utilization": pp.utilization,
                "meets_slo": pp.meets_slo,
                "ttft_ms": None if p is None else {"p50": p.ttft_ms.p50, f"p{q:g}": p.slo_ttft_ms},
                "tpot_ms": None if p is None else {"p50": p.tpot_ms.p50, f"p{q:g}": p.slo_tpot_ms},
                "energy_kwh": pp.energy_kwh, "static_energy_kwh": pp.static_energy_kwh})
        shape = self.shape
        return {
            "file": self.traffic.path, "span_h": self.traffic.span_h,
            "replica": {"deployment": replace(shape.deployment, replicas=1).label(),
                        "gpus": shape.deployment.gpus, "max_num_seqs": shape.deployment.max_num_seqs,
                        "capacity_rps": shape.rate_rps, "lengths": list(shape.lengths),
                        "shapes_tried": self.shapes_tried, "evaluations": self.evaluations},
            "periods": periods,
            "static": self.static.to_dict(), "scaled": self.scaled.to_dict(),
            "saving": self.saving.to_dict(), "price_per_gpu_hour": self.price_per_gpu_hour,
            "meets_slo": self.meets_slo,
            "autoscale": self.autoscale.to_dict(),
        }


class _Evaluator:
    """The request's deployments evaluated at a period's lengths and arrival, each once."""

    def __init__(self, req: ServeRequest):
        assert req.base_cluster is not None
        self.req = req
        self.base = req.base_cluster
        self.cache: dict[tuple[Deployment, Lengths2, Arrival], ServingPrediction] = {}
        self.count = 0

    def cluster(self, gpus: int) -> Cluster:
        return with_gpus(self.base, holding_gpus(gpus, self.base.gpus_per_node))

    def plan(self, d: Deployment, lengths: Lengths2, arrival: Arrival) -> ServingPlan:
        """``d`` serving ``arrival`` at ``lengths``: each of its schedulers (a replica runs one
        per attention-DP rank and pipeline stage) simulated for the job's requests, so that
        the run is as long against a request's time at any rate and on any shape (fewer, at
        a replica's capacity, end before a queue has had the time to grow)."""
        w = self.req.workload
        requests = min(MAX_REQUESTS, w.requests * schedulers_of(d))
        workload = replace(w, input_len=with_mean(w.input_len, lengths[0]),
                           output_len=with_mean(w.output_len, lengths[1]), arrival=arrival,
                           requests=requests)
        return ServingPlan(self.req.model, self.cluster(d.gpus), self.req.engine, d, workload,
                           self.req.slo, self.req.engine_version)

    def run(self, d: Deployment, lengths: Lengths2, arrival: Arrival) -> ServingPrediction:
        key = (d, lengths, arrival)
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = evaluate_serving(self.plan(d, lengths, arrival))
            self.count += 1
        return found

    def rate(self, d: Deployment, lengths: Lengths2, rate: float) -> ServingPrediction:
        return self.run(d, lengths, Arrival(ArrivalKind.RATE, rate_rps=rate))


def with_mean(lengths: Lengths, mean: float) -> Lengths:
    """``lengths`` with another mean, its distribution kept (a uniform's bounds scaled)."""
    if mean == lengths.mean:
        return lengths
    if lengths.dist is Dist.UNIFORM:
        k = mean / lengths.mean
        low = max(1, min(int(mean), round(lengths.low * k)))
        return replace(lengths, mean=mean, low=low, high=max(math.ceil(mean), round(lengths.high * k)))
    return replace(lengths, mean=mean)


def _ok(p: ServingPrediction) -> bool:
    return p.fits and p.simulated_requests > 0 and p.meets_slo


def capacity(ev: _Evaluator, d: Deployment, lengths: Lengths2, *, start: float = 1.0,
             floor: float | None = None) -> tuple[Capacity | None, ServingPrediction]:
    """One replica's capacity (module doc), or None where it meets the SLO at no rate (or
    not above ``floor``: then one evaluation, at floor x (1 + tolerance)); with the first
    evaluation (whether the shape fits, its batch)."""
    first_rate = floor * (1.0 + CAPACITY_TOLERANCE) if floor is not None else start
    first = ev.rate(d, lengths, first_rate)
    if not first.fits or not first.simulated_requests:
        return None, first
    lo: float | None = None
    hi: float | None = None
    best = first
    if _ok(first):
        lo = first_rate
    elif floor is not None:
        return None, first
    else:  # halve until it meets
        hi, r = first_rate, first_rate
        for _ in range(MAX_STEPS):
            r /= 2.0
            if r < MIN_RATE:
                return None, first
            p = ev.rate(d, lengths, r)
            if _ok(p):
                lo, best = r, p
                break
            hi = r
        if lo is None:
            return None, first
    if hi is None:  # double until it falls short
        r = lo
        for _ in range(MAX_STEPS):
            r *= 2.0
            if r > MAX_RATE:
                break
            p = ev.rate(d, lengths, r)
            if not _ok(p):
                hi = r
                break
            lo, best = r, p
        if hi is None:  # meets the SLO up to MAX_RATE: that is its capacity here
            return Capacity(deployment=d, lengths=lengths, rate_rps=lo, prediction=best), first
    while hi / lo > 1.0 + CAPACITY_TOLERANCE:
        mid = math.sqrt(lo * hi)
        p = ev.rate(d, lengths, mid)
        if _ok(p):
            lo, best = mid, p
        else:
            hi = mid
    return Capacity(deployment=d, lengths=lengths, rate_rps=lo, prediction=best), first


def _replica_shapes(ev: _Evaluator, gpus: int) -> Iterator[Deployment]:
    """One replica of each shape of ``gpus`` GPUs ``serve`` tries (``search.deployments``),
    and each also with the request's speculative decoding where its draft runs on the shape."""
    req = ev.req
    spec = req.speculative
    for d in deployments(req.model, ev.cluster(gpus), gpus, req.engine, req.weights, req.kv_caches):
        if d.replicas != 1:
            continue
        yield d
        if spec is not None and (spec.draft is None or spec.draft.heads % d.tp == 0):
            yield replace(d, speculative=spec)


def choose_shape(ev: _Evaluator, lengths: Lengths2, budget: int | None) -> tuple[Capacity | None, int]:
    """The replica with the most requests/s per GPU under the SLO at ``lengths`` (module
    doc), and how many shapes (with their batch limits) were tried."""
    best: Capacity | None = None
    tried = 0
    first_fit: int | None = None
    default_seqs = engine_defaults(ev.req.engine, ev.base.device, ev.req.engine_version).max_num_seqs
    for g in REPLICA_SIZES:
        if (budget is not None and g > budget) or (first_fit is not None and g > first_fit * SIZE_SPREAD):
            break
        for shape in _replica_shapes(ev, g):
            running = default_seqs
            for cap in (None, *BATCH_CAPS):
                if cap is not None and cap >= running:
                    continue  # the batch never reached this cap: the same replica
                d = replace(shape, max_num_seqs=cap)
                tried += 1
                floor = None if best is None else best.per_gpu * d.gpus
                found, first = capacity(ev, d, lengths, floor=floor)
                if not first.fits or not first.simulated_requests:
                    break  # no room for the cache: no batch limit makes room
                first_fit = first_fit or g
                if cap is None:
                    running = (found.prediction if found is not None else first).max_concurrency
                beats = best is None or (found is not None
                                         and found.per_gpu > best.per_gpu * (1 + CAPACITY_TOLERANCE))
                if found is not None and beats:
                    best = found
    return best, tried


def period_lengths(req: ServeRequest, period: Period) -> Lengths2:
    w = req.workload
    return (period.input_len if period.input_len is not None else w.input_len.mean,
            period.output_len if period.output_len is not None else w.output_len.mean)


def _busiest(req: ServeRequest, traffic: Traffic) -> Period:
    """The period whose lengths the shape is chosen at: the most offered tokens per second
    among the periods given a rate; where none is, the most clients times their tokens."""
    def tokens(p: Period) -> float:
        inp, out = period_lengths(req, p)
        return (p.rate_rps if p.rate_rps is not None else p.concurrency or 0) * (inp + out)

    rated = ([p for p in traffic.periods if p.rate_rps] or [p for p in traffic.periods if p.concurrency]
             or list(traffic.periods))
    return max(rated, key=tokens)


def check_lengths(req: ServeRequest, traffic: Traffic) -> None:
    """Every period's requests within the model's context (engines refuse longer ones)."""
    m = req.model
    for p in traffic.periods:
        inp, out = period_lengths(req, p)
        total = inp + req.workload.image_tokens + out
        if total > m.max_seq_len:
            column = ("input_len" if p.input_len is not None
                      else "output_len" if p.output_len is not None else "")
            raise InputError.single(traffic.path, f"line {p.line}" + (f", {column}" if column else ""), (
                f"input + output length {total:,.0f} tokens exceeds {m.name}'s max_seq_len "
                f"{m.max_seq_len:,}: engines refuse such requests"))


def plan_traffic(req: ServeRequest, traffic: Traffic, *, budget_gpus: int | None = None,
                 price_per_gpu_hour: float | None = None) -> TrafficPlan | None:
    """The day's plan (module doc); None where no replica shape meets the SLO at the
    busiest period's lengths. ``budget_gpus``: the most GPUs the deployment may take (a
    period that needs more keeps that many and falls short)."""
    if req.workload.arrival.kind is ArrivalKind.TRACE:
        raise InputError.single("--traffic", "", "the traffic file gives the arrivals: leave --trace out")
    if all((p.rate_rps or 0.0) == 0.0 and p.concurrency is None for p in traffic.periods):
        raise InputError.single(traffic.path, "rate_rps", "no requests in any period: nothing to plan")
    check_lengths(req, traffic)
    with caches.scope():
        return _plan(req, traffic, budget_gpus, price_per_gpu_hour)


def _plan(req: ServeRequest, traffic: Traffic, budget_gpus: int | None,
          price: float | None) -> TrafficPlan | None:
    ev = _Evaluator(req)
    busiest = _busiest(req, traffic)
    shape, tried = choose_shape(ev, period_lengths(req, busiest), budget_gpus)
    if shape is None:
        return None
    gpr = shape.deployment.gpus
    most = None if budget_gpus is None else max(1, budget_gpus // gpr)
    capacities: dict[Lengths2, Capacity | None] = {shape.lengths: shape}

    def capacity_at(lengths: Lengths2) -> Capacity | None:
        if lengths not in capacities:
            capacities[lengths] = capacity(ev, shape.deployment, lengths, start=shape.rate_rps)[0]
        return capacities[lengths]

    rows: list[tuple[Period, Lengths2, int, ServingPrediction | None, Capacity | None]] = []
    for period in traffic.periods:
        lengths = period_lengths(req, period)
        cap = capacity_at(lengths)
        n, pred = _replicas(ev, shape.deployment, period, lengths, cap or shape, most)
        rows.append((period, lengths, n, pred, cap))
    static_n = max(n for _, _, n, _, _ in rows)
    base_cluster = ev.cluster(gpr)
    periods: list[PeriodPlan] = []
    for period, lengths, n, pred, cap in rows:
        arrival = _arrival(period)
        static = None if arrival is None else ev.run(replace(shape.deployment, replicas=static_n), lengths,
                                                      arrival)
        offered = (period.rate_rps if period.rate_rps is not None
                   else pred.requests_per_s if pred is not None else 0.0)
        periods.append(PeriodPlan(
            period=period, lengths=lengths, replicas=n, gpus=n * gpr, offered_rps=offered,
            utilization=_utilization(period, n, cap or shape),
            prediction=pred, static_prediction=static,
            meets_slo=arrival is None or (cap is not None and pred is not None and pred.meets_slo),
            energy_kwh=_energy_kwh(base_cluster, n * gpr, period.hours, pred),
            static_energy_kwh=_energy_kwh(base_cluster, static_n * gpr, period.hours, static)))
    price = price if price is not None else base_cluster.device.price_per_gpu_hour
    scaled = _totals([(p.gpu_hours, p.energy_kwh) for p in periods], price)
    static_totals = _totals([(static_n * gpr * p.period.hours, p.static_energy_kwh) for p in periods], price)
    used = [c for c in capacities.values() if c is not None]
    autoscale = Autoscale(
        min_replicas=min(p.replicas for p in periods), max_replicas=static_n,
        metric=ScalingMetric.REQUESTS_IN_FLIGHT,
        target=min(c.requests_in_flight for c in used) / (1.0 + HPA_TOLERANCE),
        capacity_rps=shape.rate_rps,
        requests_in_flight=min(c.requests_in_flight for c in used),
        kv_cache_usage=min(c.kv_cache_usage for c in used),
        periods=tuple(ScalingPeriod(start_h=p.period.start_h, hours=p.period.hours, rate_rps=p.offered_rps,
                                    replicas=p.replicas) for p in periods))
    peak = max(periods, key=lambda p: (p.replicas, p.offered_rps))
    arrival = _arrival(peak.period)
    assert arrival is not None  # the busiest period has requests: some period needs the most replicas
    deployment = replace(shape.deployment, replicas=static_n)
    plan = dataclasses.replace(ev.plan(deployment, peak.lengths, arrival), autoscale=autoscale)
    prediction = ev.run(deployment, peak.lengths, arrival)
    return TrafficPlan(traffic=traffic, shape=shape, shapes_tried=tried, evaluations=ev.count,
                       periods=tuple(periods), static=static_totals, scaled=scaled, autoscale=autoscale,
                       plan=plan, prediction=prediction, price_per_gpu_hour=price)


def _arrival(period: Period) -> Arrival | None:
    """The period's arrivals (None: none come)."""
    if period.rate_rps is not None:
        return None if period.rate_rps == 0.0 else Arrival(ArrivalKind.RATE, rate_rps=period.rate_rps)
    assert period.concurrency is not None
    return Arrival(ArrivalKind.CONCURRENCY, concurrency=period.concurrency)


def _estimate(period: Period, cap: Capacity) -> int:
    """Replicas from the capacity alone (module doc)."""
    if period.rate_rps is not None:
        return max(1, math.ceil(period.rate_rps / cap.rate_rps - 1e-9))
    assert period.concurrency is not None
    return max(1, math.ceil(period.concurrency / max(cap.requests_in_flight, 1e-9) - 1e-9))


def _replicas(ev: _Evaluator, shape: Deployment, period: Period, lengths: Lengths2, cap: Capacity,
              most: int | None) -> tuple[int, ServingPrediction | None]:
    """The fewest replicas meeting the SLO in ``period``: the estimate where it meets, else
    doubled until some number meets (at most ``most``) and bisected back to the fewest; the
    prediction there. One replica where nothing comes."""
    arrival = _arrival(period)
    if arrival is None:
        return 1, None
    limit = most if most is not None else MAX_REPLICAS
    n = min(_estimate(period, cap), limit)
    pred = ev.run(replace(shape, replicas=n), lengths, arrival)
    if pred.meets_slo or n >= limit:
        return n, pred
    short = n  # falls short
    while not pred.meets_slo and n < limit:
        short, n = n, min(2 * n, limit)
        pred = ev.run(replace(shape, replicas=n), lengths, arrival)
    if not pred.meets_slo:
        return n, pred  # not even ``limit`` replicas meet it
    while n - short > 1:
        mid = (short + n) // 2
        p = ev.run(replace(shape, replicas=mid), lengths, arrival)
        if p.meets_slo:
            n, pred = mid, p
        else:
            short = mid
    return n, pred


def _utilization(period: Period, n: int, cap: Capacity) -> float:
    """The period's load over what ``n`` replicas serve under the SLO."""
    if period.rate_rps is not None:
        return period.rate_rps / (n * cap.rate_rps)
    assert period.concurrency is not None
    return period.concurrency / (n * max(cap.requests_in_flight, 1e-9))


def _energy_kwh(cluster: Cluster, gpus: int, hours: float, pred: ServingPrediction | None) -> float | None:
    """Facility energy of ``gpus`` GPUs over ``hours`` (module doc); None without power figures."""
    dev = cluster.device
    if dev.power_load_W is None or dev.power_idle_W is None:
        return None
    busy = 0.0 if pred is None or pred.per_million is None else pred.per_million.busy_share
    watts = dev.power_idle_W + busy * (dev.power_load_W - dev.power_idle_W)
    return gpus * watts * cluster.pue * hours / 1e3


def _totals(rows: list[tuple[float, float | None]], price: float | None) -> Totals:
    gpu_hours = sum(h for h, _ in rows)
    energy = None if any(e is None for _, e in rows) else sum(e for _, e in rows if e is not None)
    return Totals(gpu_hours=gpu_hours, energy_kwh=energy,
                  cost_usd=None if price is None else gpu_hours * price)
