"""Which deployment to launch: every (replicas x TP x PP, attention DP and EP for MoE,
precision, batch limit) that uses the GPUs, simulated under the workload and ranked.

Ranking: plans that meet the SLO first (all where none is given), then by goodput per
GPU where an SLO is given, else output tokens/s per GPU; ties go to the smaller replica.
The front is throughput per GPU against tokens/s each user sees (1000 / mean TPOT): the
trade-off between batching more and answering faster.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from autoplan import caches
from autoplan.descriptors.hardware import Cluster, PooledCluster
from autoplan.descriptors.model import Model
from autoplan.errors import InputError
from autoplan.serving.cost import compute_dtype
from autoplan.serving.deployment import (
    Deployment,
    Pool,
    Precision,
    ServingPlan,
    Slo,
    Speculative,
    Workload,
)
from autoplan.serving.engine import Engine, engine_defaults
from autoplan.serving.evaluate import ServingPrediction, evaluate_serving
from autoplan.vocab import Dtype

# batch limits tried beside the engine's default: a lower max_num_seqs trades throughput
# for time per output token (the knob a TPOT SLO turns)
BATCH_CAPS = (256, 64, 16)


@dataclass(frozen=True, slots=True)
class Ranked:
    plan: ServingPlan
    prediction: ServingPrediction

    @property
    def per_gpu(self) -> float:
        return self.prediction.output_tokens_per_s / self.plan.deployment.gpus

    @property
    def goodput_per_gpu(self) -> float:
        return self.prediction.goodput_rps / self.plan.deployment.gpus

    @property
    def user_tokens_per_s(self) -> float:
        tpot = self.prediction.tpot_ms.mean
        return 1000.0 / tpot if tpot > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ServeResult:
    plans: tuple[Ranked, ...]  # ranked, best first (those that fit)
    front: tuple[Ranked, ...]  # non-dominated in (throughput per GPU, tokens/s per user)
    evaluated: int
    not_fitting: int

    def why_none(self, slo: Slo) -> str:
        if not self.plans:
            return (f"no deployment fits: {self.not_fitting} tried, each leaves no room for the KV "
                    "cache, or a cache too small for one request's prompt and what the engine sets "
                    "aside for its output (more GPUs, fp8 weights or KV cache, shorter requests)")
        best = self.plans[0]
        p = best.prediction
        gaps = []
        if slo.ttft_ms is not None and p.slo_ttft_ms > slo.ttft_ms:
            gaps.append(f"TTFT p{slo.percentile:g} {p.slo_ttft_ms:,.0f} ms against {slo.ttft_ms:g} "
                        f"({p.slo_ttft_ms / slo.ttft_ms:.2f}x)")
        if slo.tpot_ms is not None and p.slo_tpot_ms > slo.tpot_ms:
            gaps.append(f"TPOT p{slo.percentile:g} {p.slo_tpot_ms:,.1f} ms against {slo.tpot_ms:g} "
                        f"({p.slo_tpot_ms / slo.tpot_ms:.2f}x)")
        if not p.steady:
            gaps.append("its queue grows through the run (the rate exceeds what it serves)")
        return (f"no deployment meets the SLO; the closest, {best.plan.deployment.label()}: "
                + "; ".join(gaps))


def _divisors_pow2(n: int, cap: int) -> list[int]:
    return [d for d in (1, 2, 4, 8, 16, 32, 64) if d <= cap and n % d == 0]


def deployments(model: Model, cluster: Cluster, gpus: int, engine: Engine,
                weights: Sequence[Precision], kv_caches: Sequence[Precision]) -> Iterator[Deployment]:
    """Every deployment of exactly ``gpus`` GPUs at the engine's batch limits: TP within an
    NVLink domain (and dividing the attention heads), PP over the layers, for MoE attention
    DP and EP within a stage."""
    domain = min(cluster.nvlink_domain, cluster.gpus)
    for tp in _divisors_pow2(gpus, domain):
        if model.heads % tp:
            continue
        for pp in _divisors_pow2(gpus // tp, 16):
            if pp > model.layers:
                continue
            adps = [1]
            if model.is_moe:
                adps += [a for a in _divisors_pow2(gpus // (tp * pp), domain // tp) if a > 1]
            for adp in adps:
                per_replica = tp * pp * adp
                if gpus % per_replica:
                    continue
                eps = [1]
                if model.is_moe:
                    stage = tp * adp
                    eps = [e for e in (1, stage) if model.experts % e == 0] or [1]
                    eps = sorted(set(eps))
                for ep in eps:
                    for w in weights:
                        for kv in kv_caches:
                            yield Deployment(replicas=gpus // per_replica, tp=tp, pp=pp, ep=ep,
                                             attention_dp=adp, weights=w, kv_cache=kv)


SPLIT_STEPS = 16  # prefill shares of the GPUs tried on large clusters: k/16


def pool_workers(model: Model, domain: int) -> list[Pool]:
    """The workers a pool of the search is made of, one replica each: TP within an NVLink
    domain (dividing the attention heads), and for MoE models wide expert parallel too:
    tp 1 with attention data parallel over the worker's GPUs and the experts over all of
    them (``attention_dp = ep``, the DEP workers of NVIDIA's measured wide-EP runs)."""
    out = [Pool(1, t) for t in _divisors_pow2(domain, domain) if model.heads % t == 0]
    if model.is_moe:
        out += [Pool(1, 1, attention_dp=a, ep=a) for a in _divisors_pow2(domain, domain)
                if a > 1 and model.experts % a == 0]
    return out


def disaggregated_deployments(model: Model, cluster: Cluster, gpus: int, weights: Sequence[Precision],
                              kv_caches: Sequence[Precision]) -> Iterator[Deployment]:
    """Splits of ``gpus`` into a prefill pool and a decode pool, each of replicas of one
    worker (:func:`pool_workers`: a TP degree, or for MoE a wide-EP worker): every split
    where the prefill pool has at most SPLIT_STEPS instances' worth of choices, else the
    prefill shares nearest k/SPLIT_STEPS of the GPUs (a bounded search on large clusters)."""
    domain = min(cluster.nvlink_domain, cluster.gpus)
    workers = pool_workers(model, domain)
    for p in workers:
        width = p.gpus_per_replica
        sizes: Sequence[int] = range(width, gpus, width)
        if len(sizes) > SPLIT_STEPS:
            sizes = sorted({max(width, min(gpus - 1, round(gpus * k / SPLIT_STEPS / width) * width))
                            for k in range(1, SPLIT_STEPS)} - {gpus})
        for n_p in sizes:
            for d in workers:
                n_d = gpus - n_p
                if n_d % d.gpus_per_replica:
                    continue
                prefill = replace(p, replicas=n_p // width)
                decode = replace(d, replicas=n_d // d.gpus_per_replica)
                for w in weights:
                    for kv in kv_caches:
                        yield Deployment.split(prefill, decode, weights=w, kv_cache=kv)


def pooled_deployments(model: Model, pools: PooledCluster, weights: Sequence[Precision],
                       kv_caches: Sequence[Precision]) -> Iterator[Deployment]:
    """Disaggregated deployments with prefill on one pool of a heterogeneous cluster and
    decode on another (Splitwise, Patel et al. 2024: prompt and token phases on different GPU
    generations), both orders: each side as many replicas of one worker
    (:func:`pool_workers`, within its pool's NVLink domain) as its pool holds."""
    for a in pools.pools:
        for b in pools.pools:
            if a is b:
                continue
            for p in pool_workers(model, min(a.nvlink_domain, a.gpus)):
                for d in pool_workers(model, min(b.nvlink_domain, b.gpus)):
                    n_p, n_d = a.gpus // p.gpus_per_replica, b.gpus // d.gpus_per_replica
                    if not n_p or not n_d:
                        continue
                    for w in weights:
                        for kv in kv_caches:
                            yield Deployment.split(replace(p, replicas=n_p), replace(d, replicas=n_d),
                                                   on=(a.name, b.name), weights=w, kv_cache=kv)


def serve_pooled_search(model: Model, pools: PooledCluster, engine: Engine, workload: Workload,
                        slo: Slo, weights: Sequence[Precision] = (Precision.BF16,),
                        kv_caches: Sequence[Precision] = (Precision.BF16,), seed: int = 0,
                        engine_version: str | None = None) -> ServeResult:
    """Every :func:`pooled_deployments` of a heterogeneous cluster simulated and ranked as
    :func:`serve_search` ranks (the KV hand-off over ``between_pools``); a precision a side's
    device cannot run leaves that side's deployments out."""
    with caches.scope():
        plans = []
        for split in pooled_deployments(model, pools, weights, kv_caches):
            dis = split.disaggregated
            assert dis is not None
            sides = [pools.pools[pools.index(dis.prefill_on)], pools.pools[pools.index(dis.decode_on)]]
            if any(p in (Precision.FP8, Precision.FP4) and not c.device.supports(Dtype.FP8)
                   and compute_dtype(p, c.device) is not Dtype.FP4
                   for c in sides for p in (split.weights, split.kv_cache)):
                continue
            plans.append(ServingPlan(model, sides[1], engine, split, workload, slo, engine_version,
                                     pools=pools))
        ranked, evaluated, not_fitting = _rank_splits(plans, seed)
        ranked.sort(key=lambda r: rank_key(r, slo))
        return ServeResult(tuple(ranked), pareto(ranked), evaluated, not_fitting)


def _rank_splits(plans: Sequence[ServingPlan], seed: int) -> tuple[list[Ranked], int, int]:
    """Disaggregated plans simulated: (those that fit and serve, unsorted; how many were
    simulated; how many left no room for the cache or served no request)."""
    ranked: list[Ranked] = []
    not_fitting = 0
    for plan in plans:
        pred = evaluate_serving(plan, seed)
        if not pred.fits or not pred.simulated_requests:
            not_fitting += 1
            continue
        ranked.append(Ranked(plan, pred))
    return ranked, len(plans), not_fitting


def rank_key(r: Ranked, slo: Slo) -> tuple:
    p, d = r.prediction, r.plan.deployment
    score = r.goodput_per_gpu if slo.any else r.per_gpu
    return (not p.meets_slo, -round(score, 9), d.gpus_per_replica, d.tp, d.pp,
            -(d.max_num_seqs or 10**9), d.weights.value, d.kv_cache.value)


def pareto(ranked: Sequence[Ranked]) -> tuple[Ranked, ...]:
    """The plans no other beats on both throughput per GPU and tokens/s per user, by
    throughput per GPU, highest first."""
    pts = sorted(ranked, key=lambda r: (-r.per_gpu, -r.user_tokens_per_s))
    front: list[Ranked] = []
    best_user = -math.inf
    for r in pts:
        if r.user_tokens_per_s > best_user:
            front.append(r)
            best_user = r.user_tokens_per_s
    return tuple(front)


def serve_search(model: Model, cluster: Cluster, engine: Engine, workload: Workload, slo: Slo,
                 weights: Sequence[Precision] = (Precision.BF16,),
                 kv_caches: Sequence[Precision] = (Precision.BF16,), seed: int = 0,
                 disaggregated: bool = False, speculative: Speculative | None = None,
                 engine_version: str | None = None) -> ServeResult:
    """Simulate every deployment of the cluster's GPUs; see the module doc. ``engine_version``:
    the engine release every plan names (None: its default line). ``disaggregated``:
    also every prefill/decode split (at the engine's batch limits only). ``speculative``:
    every aggregated deployment also with this speculative decoding (ranked beside the one
    without: at high load verifying proposals can cost more than it saves). One cost scope
    (``autoplan.caches``) holds every deployment's."""
    with caches.scope():
        return _serve_search(model, cluster, engine, workload, slo, weights, kv_caches, seed,
                             disaggregated, speculative, engine_version)


def _serve_search(model: Model, cluster: Cluster, engine: Engine, workload: Workload, slo: Slo,
                  weights: Sequence[Precision], kv_caches: Sequence[Precision], seed: int,
                  disaggregated: bool, speculative: Speculative | None = None,
                  engine_version: str | None = None) -> ServeResult:
    for p, field in [(w, "--weights") for w in weights] + [(k, "--kv-cache") for k in kv_caches]:
        if p in (Precision.FP8, Precision.FP4) and not cluster.device.supports(Dtype.FP8) \
                and compute_dtype(p, cluster.device) is not Dtype.FP4:
            also = " nor fp4 (peak_tflops.fp4)" if p is Precision.FP4 else ""
            raise InputError.single(field, "", f"{cluster.device.name} has no fp8 support "
                                                f"(peak_tflops.fp8){also} for {p.value}")
    ranked: list[Ranked] = []
    evaluated = not_fitting = 0
    default_seqs = engine_defaults(engine, cluster.device, engine_version).max_num_seqs
    bases = deployments(model, cluster, cluster.gpus, engine, weights, kv_caches)
    if speculative is not None:
        draft = speculative.draft

        def runs_draft(d: Deployment) -> bool:  # a draft model runs on the target's TP group
            return draft is None or draft.heads % d.tp == 0

        bases = (b for plain in bases for b in (
            (plain, replace(plain, speculative=speculative)) if runs_draft(plain) else (plain,)))
    for base in bases:
        running = default_seqs
        for cap in (None, *BATCH_CAPS):
            if cap is not None and cap >= running:
                continue  # the batch never reached this cap: the same run
            plan = ServingPlan(model, cluster, engine, replace(base, max_num_seqs=cap), workload, slo,
                               engine_version)
            pred = evaluate_serving(plan, seed)
            evaluated += 1
            if not pred.fits or not pred.simulated_requests:  # no room for the cache, or a request
                not_fitting += 1
                break
            if cap is None:
                running = pred.max_concurrency
            ranked.append(Ranked(plan, pred))
    if disaggregated:
        splits = [ServingPlan(model, cluster, engine, split, workload, slo, engine_version)
                  for split in disaggregated_deployments(model, cluster, cluster.gpus, weights, kv_caches)]
        more, n, unfit = _rank_splits(splits, seed)
        ranked += more
        evaluated, not_fitting = evaluated + n, not_fitting + unfit
    ranked.sort(key=lambda r: rank_key(r, slo))
    return ServeResult(tuple(ranked), pareto(ranked), evaluated, not_fitting)
