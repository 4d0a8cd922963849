"""A serving plan's prediction: memory, KV capacity, the simulated latencies and
throughput of its deployment under its workload, and what a million output tokens cost.

Per million output tokens (:class:`PerMillion`): GPU-hours = GPUs / (output tokens/s) x
1e6 / 3600; dollars = GPU-hours x the device's ``price_per_gpu_hour`` (or ``--price``);
energy = GPUs x mean board power x PUE x the same seconds. The mean power charges the
device's load power while the simulated scheduler runs iterations and its idle power while
it waits for requests (``SimResult.busy_s``), as the training what-if does for the pipeline
bubble (autoplan.whatif.economics). Load is the datasheet's maximum board power, and a
decode step, bound by memory bandwidth, draws less than that: the energy is an upper
estimate of the GPUs' share.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from autoplan.descriptors.hardware import Cluster
from autoplan.serving.cost import Memory, StepModel, kv_transfer
from autoplan.serving.deployment import ArrivalKind, Deployment, ServingPlan, resolved_limits
from autoplan.serving.kinds import CacheShape
from autoplan.serving.simulate import SimResult, simulate, simulate_disaggregated
from autoplan.serving.trust import Evidence, evidence_of


@dataclass(frozen=True, slots=True)
class Latency:
    """Milliseconds: mean and percentiles over the simulated requests."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, seconds: np.ndarray) -> Latency:
        if not len(seconds):
            return cls(0.0, 0.0, 0.0, 0.0)
        ms = seconds * 1e3
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        return cls(float(ms.mean()), float(p50), float(p90), float(p99))

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}


JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True, slots=True)
class PerMillion:
    """What a million output tokens take on the whole deployment (module doc)."""

    gpu_hours: float
    busy_share: float  # of the run, the share the GPUs ran iterations (the rest idle)
    price_per_gpu_hour: float | None  # None: the device file gives none
    mean_power_W: float | None  # per GPU at the board; None: no power figures
    energy_kwh: float | None  # facility energy (PUE applied)

    @property
    def cost_usd(self) -> float | None:
        return None if self.price_per_gpu_hour is None else self.gpu_hours * self.price_per_gpu_hour

    def to_dict(self) -> dict[str, float | None]:
        return {"gpu_hours": self.gpu_hours, "cost_usd": self.cost_usd, "energy_kwh": self.energy_kwh}


def per_million(plan: ServingPlan, output_tokens_per_s: float, busy_share: float) -> PerMillion | None:
    """GPU-hours, dollars and energy per million output tokens; None where nothing is served."""
    if output_tokens_per_s <= 0:
        return None
    gpus = plan.deployment.gpus
    seconds = 1e6 / output_tokens_per_s
    busy = min(1.0, max(0.0, busy_share))
    # each side on its own pool's devices (a heterogeneous cluster): GPU-weighted means
    dis = plan.deployment.disaggregated
    sides = ([(dis.prefill.gpus, plan.cluster_of("prefill")), (dis.decode.gpus, plan.cluster_of("decode"))]
             if plan.pools is not None and dis is not None else [(gpus, plan.cluster)])
    price: float | None = 0.0
    for n, c in sides:
        each = c.device.price_per_gpu_hour
        price = None if price is None or each is None else price + n * each / gpus
    power = facility = None
    if all(c.device.power_load_W is not None and c.device.power_idle_W is not None for _, c in sides):
        watts = [n * (c.device.power_load_W * busy + c.device.power_idle_W * (1.0 - busy))  # type: ignore[operator]
                 for n, c in sides]
        power = sum(watts) / gpus
        facility = sum(w * c.pue for w, (_, c) in zip(watts, sides, strict=True))
    return PerMillion(
        gpu_hours=gpus * seconds / 3600.0, busy_share=busy, price_per_gpu_hour=price,
        mean_power_W=power,
        energy_kwh=None if facility is None else facility * seconds / JOULES_PER_KWH)


@dataclass(frozen=True, slots=True)
class ServingPrediction:
    ttft_ms: Latency
    tpot_ms: Latency
    e2e_ms: Latency
    output_tokens_per_s: float  # whole deployment
    total_tokens_per_s: float
    requests_per_s: float
    goodput_rps: float  # requests per second meeting every SLO given
    meets_slo: bool
    slo_ttft_ms: float  # TTFT and TPOT at the SLO's percentile
    slo_tpot_ms: float
    memory: Memory
    kv_cache_tokens: int  # per scheduler (a replica's attention-DP rank)
    max_concurrency: int  # sequences one scheduler ran at once, at most
    schedulers: int
    fits: bool
    steady: bool
    preemptions: int
    simulated_requests: int
    timeline: tuple[tuple[float, int, int], ...]
    per_million: PerMillion | None = None  # None: nothing served
    prefill_pool: PoolPrediction | None = None  # disaggregated deployments only
    # of the prompt tokens, the share served from the prefix cache (None: no shared prefix)
    prefix_hit_share: float | None = None
    # what the prediction stands on: the engine release, the measured kernels, the held-out
    # error of its regime (serving.trust; None: not worked out)
    evidence: Evidence | None = None
    # a model whose layers differ: what a sequence holds per GPU (serving.kinds.CacheShape;
    # None for one whose layers are alike: kv_cache_tokens says it)
    cache: CacheShape | None = None
    # KV cache tokens the decoding sequences of one scheduler hold on average over the run
    # (:func:`kv_in_use`; None: a closed loop, whose measured requests are a part of its run)
    kv_in_use_tokens: float | None = None

    def priced(self, price_per_gpu_hour: float) -> ServingPrediction:
        """The prediction with dollars at ``price_per_gpu_hour`` (``--price``)."""
        if self.per_million is None:
            return self
        return dataclasses.replace(self, per_million=dataclasses.replace(
            self.per_million, price_per_gpu_hour=price_per_gpu_hour))

    def to_dict(self) -> dict[str, object]:
        return {
            "ttft_ms": self.ttft_ms.to_dict(), "tpot_ms": self.tpot_ms.to_dict(),
            "e2e_ms": self.e2e_ms.to_dict(),
            "output_tokens_per_s": self.output_tokens_per_s,
            "total_tokens_per_s": self.total_tokens_per_s,
            "requests_per_s": self.requests_per_s, "goodput_rps": self.goodput_rps,
            "meets_slo": self.meets_slo,
            "memory_gib_per_gpu": self.memory.to_gib(),
            "kv_cache_tokens": self.kv_cache_tokens, "max_concurrency": self.max_concurrency,
            "per_million_output_tokens": None if self.per_million is None else self.per_million.to_dict(),
            **({} if self.prefix_hit_share is None else {"prefix_cache_hit_share": self.prefix_hit_share}),
            **({} if self.prefill_pool is None else {"prefill_pool": {
                "memory_gib_per_gpu": self.prefill_pool.memory.to_gib(),
                "kv_cache_tokens": self.prefill_pool.kv_cache_tokens,
                "kv_transfer_ms_mean": self.prefill_pool.transfer_ms_mean}}),
            **({} if self.evidence is None else {"evidence": self.evidence.to_dict()}),
            **({} if self.cache is None else {"cache_per_gpu": {
                "kv_bytes_per_token": self.cache.kv_per_token,
                "sliding_bytes_per_token": self.cache.sliding_per_token,
                "sliding_window": self.cache.window,
                "state_bytes_per_sequence": self.cache.state_per_sequence}}),
        }


def schedulers_of(d: Deployment) -> int:
    """Independent batches the deployment runs: per replica one per attention-DP rank and
    per pipeline batch in flight."""
    return d.replicas * d.attention_dp * d.pp


def evaluate_serving(plan: ServingPlan, seed: int = 0, *, evidence: bool = True) -> ServingPrediction:
    """Simulate one scheduler of the plan (see :mod:`autoplan.serving.simulate`), with the
    evidence it stands on (:func:`autoplan.serving.trust.evidence_of`; ``evidence=False``:
    without it, for a fit that predicts the same plans many times)."""
    if plan.deployment.disaggregated is not None:
        pred, steps = _evaluate_disaggregated(plan, seed)
    else:
        pred, step = _evaluate_aggregated(plan, seed)
        steps = [step]
    if not evidence:
        return pred
    cache = steps[-1].cache if steps[-1].hybrid else None
    return dataclasses.replace(pred, evidence=evidence_of(plan, steps), cache=cache)


def _evaluate_aggregated(plan: ServingPlan, seed: int) -> tuple[ServingPrediction, StepModel]:
    d = plan.deployment
    step = StepModel(plan.model, plan.cluster, d, plan.engine, plan.engine_version)
    mem = step.memory()
    fits = mem.peak <= plan.cluster.device.mem_bytes and mem.kv_cache > 0
    # a pipelined replica's batches in flight share its KV cache
    kv = step.kv_tokens(mem) // d.pp
    sched = schedulers_of(d)
    if not fits or kv <= 0:
        return _unfit(mem, kv, sched), step
    sim = simulate(step, plan.workload, sched, kv, seed)
    return _prediction(plan, sim, mem, kv, sched, fits), step


def _unfit(mem: Memory, kv: int, schedulers: int) -> ServingPrediction:
    """The prediction of a deployment with no room for its KV cache: its memory, nothing served."""
    empty = Latency(0.0, 0.0, 0.0, 0.0)
    return ServingPrediction(empty, empty, empty, 0.0, 0.0, 0.0, 0.0, False, 0.0, 0.0, mem,
                             max(0, kv), 0, schedulers, False, True, 0, 0, ())


@dataclass(frozen=True, slots=True)
class PoolPrediction:
    """A disaggregated deployment's prefill pool (the decode pool's are the prediction's own
    memory, KV cache and schedulers)."""

    memory: Memory
    kv_cache_tokens: int
    schedulers: int
    transfer_ms_mean: float  # the KV hand-off of the simulated requests' prompts


def _evaluate_disaggregated(plan: ServingPlan, seed: int) -> tuple[ServingPrediction, list[StepModel]]:
    """The prefill pool runs prompts to their first token, the decode pool the rest
    (:func:`autoplan.serving.simulate.simulate_disaggregated`); each pool's memory and KV
    cache are its own instances'."""
    d = plan.deployment
    pools = [d.pool("prefill"), d.pool("decode")]
    # each side on its own cluster: a heterogeneous cluster's pool (ServingPlan.pools)
    clusters = [plan.cluster_of("prefill"), plan.cluster_of("decode")]
    steps = [StepModel(plan.model, c, pool, plan.engine, plan.engine_version)
             for c, pool in zip(clusters, pools, strict=True)]
    mems = [step.memory() for step in steps]
    # a pipelined worker's batches in flight share its KV cache (as evaluate_serving's)
    kvs = [step.kv_tokens(mem) // pool.pp for step, mem, pool in zip(steps, mems, pools, strict=True)]
    scheds = (schedulers_of(pools[0]), schedulers_of(pools[1]))
    fits = all(m.peak <= c.device.mem_bytes and m.kv_cache > 0 and kv > 0
               for m, kv, c in zip(mems, kvs, clusters, strict=True))
    if not fits:
        return _unfit(max(mems, key=lambda m: m.peak), kvs[1], scheds[1]), steps
    apart = plan.pools is not None and clusters[0] is not clusters[1]
    transfer = kv_transfer(plan.model, plan.cluster, d,
                           plan.pools.between_pools if apart and plan.pools is not None else None)
    sim = simulate_disaggregated(steps[0], steps[1], plan.workload, scheds, (kvs[0], kvs[1]), transfer, seed)
    pred = _prediction(plan, sim, mems[1], kvs[1], scheds[1], fits)
    moved = 1e3 * (transfer[0] + transfer[1] * float(sim.input_len.mean())) if len(sim.input_len) else 0.0
    return dataclasses.replace(pred, prefill_pool=PoolPrediction(mems[0], kvs[0], scheds[0], moved)), steps


@dataclass(frozen=True, slots=True)
class Rate:
    """The whole deployment's requests per second, and the share of its span a scheduler
    runs iterations (the rest it waits for requests)."""

    requests_per_s: float
    busy_share: float


def deployment_rate(plan: ServingPlan, sim: SimResult, schedulers: int) -> Rate:
    """Requests per second the whole deployment serves: its requests over its span, first
    arrival to last finish of all of them, every scheduler's share counted. One scheduler is
    simulated; the others run the same stream's share (module doc of ``serving.simulate``).

    Where the simulation covers the scheduler's whole share of the workload's ``requests``
    (``requested x schedulers >= requests``), the deployment serves them all (but what the
    engine refuses) over: an open loop's arrival span (``requests / rate``, or the trace's
    first to last arrival) plus the drain after the last arrival (its last request's time
    in the simulation); a closed loop or an offline batch, all present at the start, the
    simulated scheduler's own span. Where the simulation is a window of a longer run, the
    rate is its steady state: an open loop that keeps up serves what arrives (the offered
    rate; a trace's over the window's arrivals), else what the window served over its span.
    Either way no deployment serves more requests per second than arrive.

    A closed loop keeps its clients' requests in flight throughout what it measures
    (``SimResult.in_flight``; :class:`autoplan.serving.simulate.ClosedLoop`): ``in_flight``
    requests on each scheduler's share, each in the system for the measured requests' mean
    time, serve ``in_flight / mean e2e`` requests per second each (Little's law), however
    many requests the simulation's budget held (a loop of a single wave is a batch, above)."""
    n = len(sim.arrival)
    if not n or sim.requested == 0:
        return Rate(0.0, 0.0)
    if sim.in_flight > 0:
        e2e = float(sim.e2e.mean())
        busy = min(1.0, sim.busy_s / sim.duration_s) if sim.duration_s > 0 else 1.0
        return Rate(sim.in_flight * schedulers / e2e if e2e > 0 else 0.0, busy)
    w = plan.workload
    kind, total = w.arrival.kind, w.requests
    served = n / sim.requested  # the engine refuses what never fits its cache
    drain = max(0.0, float(sim.finish.max() - sim.arrival.max()))
    if sim.requested * schedulers >= total:  # the whole workload, every scheduler's share
        if kind is ArrivalKind.RATE:
            span = total / w.arrival.rate_rps + drain
        elif kind is ArrivalKind.TRACE:
            assert w.arrival.trace is not None
            arrivals = w.arrival.trace.arrival_s[:total]
            span = float(arrivals[-1] - arrivals[0]) + drain
        else:
            span = sim.duration_s
        span = max(span, 1e-9)
        return Rate(total * served / span, min(1.0, sim.busy_s / span))
    # a window of a longer run: its steady state
    window = max(sim.duration_s, 1e-9)
    rps = n * schedulers / window
    if kind in (ArrivalKind.RATE, ArrivalKind.TRACE) and sim.steady and n > 1:
        arrival_span = float(sim.arrival.max() - sim.arrival.min()) * n / (n - 1)
        offered = (w.arrival.rate_rps if kind is ArrivalKind.RATE
                   else n * schedulers / max(arrival_span, 1e-9))
        rps = offered * served if kind is ArrivalKind.RATE else min(rps, offered)
    return Rate(rps, min(1.0, sim.busy_s / window))


def kv_in_use(sim: SimResult) -> float | None:
    """KV cache tokens one scheduler holds on average in its steady state, by Little's law:
    the rate requests arrive at times the mean of what each holds over its time, a request
    holding from its first token to its last its prompt and, on average, half its output
    (the arrival rate, not the run's span, so the run's first and last requests, which run
    beside fewer others, weigh no more than the rest). A prompt being prefilled, and the
    block a sequence rounds up to, add a little: a lower estimate of the engines' gauge
    (vLLM's ``kv_cache_usage_perc``). None where requests do not arrive over time (a closed
    loop, an offline batch) or fewer than two were served."""
    n = len(sim.arrival)
    if sim.in_flight > 0 or n < 2:
        return None
    span = float(sim.arrival.max() - sim.arrival.min())
    if span <= 0:
        return None
    held = (sim.finish - sim.first_token) * (sim.input_len + sim.output_len / 2.0)
    return (n - 1) / span * float(held.mean())


def _prediction(plan: ServingPlan, sim: SimResult, mem: Memory, kv: int, sched: int,
                fits: bool) -> ServingPrediction:
    slo = plan.slo
    ttft, tpot, e2e = sim.ttft, sim.tpot, sim.e2e
    n = len(ttft)
    rate = deployment_rate(plan, sim, sched)
    rps = rate.requests_per_s
    # tokens per second: the requests' rate times the served requests' mean lengths
    out_per_request = float(sim.output_len.mean()) if n else 0.0
    in_per_request = float(sim.input_len.mean()) if n else 0.0
    good = np.ones(n, dtype=bool)
    if slo.ttft_ms is not None:
        good &= ttft * 1e3 <= slo.ttft_ms
    if slo.tpot_ms is not None:
        per_tok = np.zeros(n)
        many = sim.output_len > 1
        per_tok[many] = (sim.finish[many] - sim.first_token[many]) / (sim.output_len[many] - 1)
        good &= per_tok * 1e3 <= slo.tpot_ms
    q = slo.percentile
    slo_ttft = float(np.percentile(ttft * 1e3, q)) if n else 0.0
    slo_tpot = float(np.percentile(tpot * 1e3, q)) if len(tpot) else 0.0
    meets = (n > 0 and sim.steady
             and (slo.ttft_ms is None or slo_ttft <= slo.ttft_ms)
             and (slo.tpot_ms is None or slo_tpot <= slo.tpot_ms))
    out_rate = rps * out_per_request
    return ServingPrediction(
        kv_in_use_tokens=kv_in_use(sim),
        ttft_ms=Latency.of(ttft), tpot_ms=Latency.of(tpot), e2e_ms=Latency.of(e2e),
        output_tokens_per_s=out_rate,
        total_tokens_per_s=rps * (out_per_request + in_per_request),
        requests_per_s=float(rps), goodput_rps=float(rps * (good.sum() / n if n else 0.0)),
        meets_slo=bool(meets), slo_ttft_ms=slo_ttft, slo_tpot_ms=slo_tpot, memory=mem,
        kv_cache_tokens=kv, max_concurrency=sim.max_running, schedulers=sched, fits=fits,
        steady=sim.steady, preemptions=sim.preemptions, simulated_requests=n,
        timeline=sim.timeline,
        per_million=per_million(plan, out_rate, rate.busy_share),
        prefix_hit_share=None if plan.workload.prefix is None else sim.prefix_hit_share)


def serving_document(plan: ServingPlan, pred: ServingPrediction | None,
                     plan_dir: str | None = None) -> dict[str, object]:
    """The serving plan file (``kind: serving``; issue 15's schema), with its prediction
    (None: without one, what the runs log records of a run).
    Built-in models and clusters are written by name; an arrival trace by its path relative
    to ``plan_dir`` (the folder the plan is written to; None: absolute)."""
    from autoplan.descriptors.library import builtin_cluster_ref, builtin_model_matches
    from autoplan.plan import SCHEMA_VERSION

    d, c = plan.deployment, plan.cluster

    def bare(c: Cluster) -> Cluster:  # a measured correction and mixer tables are no part of the file
        if c.device.correction is None and c.device.mixer_kernels is None:
            return c
        device = dataclasses.replace(c.device, correction=None, mixer_kernels=None)
        return dataclasses.replace(c, device=device)

    c = bare(c)
    deployment: dict[str, object]
    if d.disaggregated is not None:
        dis = d.disaggregated
        sides = {"prefill": dis.prefill.to_dict(), "decode": dis.decode.to_dict()}
        if dis.prefill_on:
            sides["prefill"]["pool"] = dis.prefill_on  # type: ignore[assignment]
        if dis.decode_on:
            sides["decode"]["pool"] = dis.decode_on  # type: ignore[assignment]
        deployment = {"disaggregated": sides}
    else:
        deployment = {"replicas": d.replicas, "tp": d.tp, "pp": d.pp, "ep": d.ep,
                      "attention_dp": d.attention_dp}
    deployment.update(weights=d.weights.value, kv_cache=d.kv_cache.value)
    seqs, tokens, chunked = resolved_limits(d, plan.engine, c.device, plan.engine_version)
    deployment.update(max_num_seqs=seqs, max_batched_tokens=tokens, chunked_prefill=chunked)
    if d.speculative is not None:
        spec = d.speculative.to_dict()
        if d.speculative.draft is not None and not builtin_model_matches(d.speculative.draft):
            spec["draft_model"] = d.speculative.draft.to_dict()  # a descriptor of its own, inline
        deployment["speculative"] = spec
    doc: dict[str, object] = {
        "autoplan": SCHEMA_VERSION,
        "kind": "serving",
        "model": plan.model.name if builtin_model_matches(plan.model) else plan.model.to_dict(),
        # a built-in by name: whole nodes, or part of a node by its GPUs; a heterogeneous
        # cluster whole, its pools' devices as their files give them
        "cluster": (dataclasses.replace(plan.pools, pools=tuple(bare(p) for p in plan.pools.pools)).to_dict()
                    if plan.pools is not None else builtin_cluster_ref(c) or c.to_dict()),
        # the engine by name (its default line), or with the release the plan names
        "engine": (plan.engine.value if plan.engine_version is None
                   else {"name": plan.engine.value, "version": plan.engine_version}),
        "deployment": deployment,
        "workload": plan.workload.to_dict(plan_dir),
    }
    if plan.slo.any:
        doc["slo"] = plan.slo.to_dict()
    if plan.autoscale is not None:
        doc["autoscale"] = plan.autoscale.to_dict()
    if pred is not None:
        doc["prediction"] = pred.to_dict()
    return doc
