"""Reading serving plan files (``kind: serving``): every problem named by file and field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.job import MAX_SEQ_LEN
from autoplan.descriptors.model import Model
from autoplan.descriptors.strict import Fields
from autoplan.errors import InputError, Problem
from autoplan.serving.deployment import (
    KV_PRECISIONS,
    Arrival,
    ArrivalKind,
    Deployment,
    Dist,
    Engine,
    Lengths,
    Precision,
    ServingPlan,
    Slo,
    Workload,
)

MAX_DEGREE = 1 << 16  # replicas, TP, PP, EP or attention DP: past any cluster
MAX_REQUESTS = 1_000_000
MAX_RATE = 1e6  # requests/s
# output tokens per request: the simulation steps once per output token, and no model
# generates more than this in one answer today
MAX_OUTPUT_TOKENS = 1 << 17


def is_serving(data: Any) -> bool:
    """Whether a plan-file mapping is a serving plan."""
    return isinstance(data, Mapping) and data.get("kind") == "serving"


def _lengths(f: Fields, key: str) -> Lengths | None:
    raw = f.raw(key)
    if raw is None:
        return None
    hi = MAX_OUTPUT_TOKENS if key == "output_len" else MAX_SEQ_LEN
    if not isinstance(raw, Mapping):
        value = f.int(key, min=1, max=hi)
        return None if value is None else Lengths(float(value))
    g = f.child(key, raw)
    dist = g.enum("dist", Dist, Dist.FIXED)
    mean = g.float("mean", min=1, max=hi)
    sigma = g.float("sigma", 0.5 if dist is Dist.LOGNORMAL else 0.0, min=0.0, max=4.0)
    low = g.int("low", 1, min=1, max=MAX_SEQ_LEN)
    high = g.int("high", 0, min=0, max=hi)
    g.close()
    if None in (dist, mean, sigma, low, high):
        return None
    if dist is Dist.UNIFORM and not (high and low <= mean <= high):
        g.fail("high", f"uniform lengths need low <= mean <= high, got {low}, {mean:g}, {high}")
        return None
    return Lengths(mean, dist, sigma, low, high)


def _arrival(f: Fields) -> Arrival | None:
    raw = f.raw("arrival")
    if raw is None:
        return None
    if raw == "offline":
        return Arrival(ArrivalKind.OFFLINE)
    g = f.child("arrival", raw)
    if not g.ok:
        return None
    if g.has("trace"):
        g.fail("trace", "arrival traces are not supported yet: give rate_rps, concurrency or offline")
        return None
    if g.has("rate_rps") == g.has("concurrency"):
        g.fail("", "expected one of rate_rps, concurrency (or the word offline)")
        return None
    if g.has("rate_rps"):
        rate = g.float("rate_rps", positive=True, max=MAX_RATE)
        g.close()
        return None if rate is None else Arrival(ArrivalKind.RATE, rate_rps=rate)
    c = g.int("concurrency", min=1, max=MAX_REQUESTS)
    g.close()
    return None if c is None else Arrival(ArrivalKind.CONCURRENCY, concurrency=c)


def _model_and_cluster(f: Fields, required: bool) -> tuple[Model | None, Cluster | None]:
    """The ``model`` and ``cluster`` fields resolved (built-in, path or mapping); their
    problems recorded with the rest."""
    from autoplan.descriptors.library import resolve_cluster, resolve_model

    out: list[Any] = []
    for key, resolve in (("model", resolve_model), ("cluster", resolve_cluster)):
        value = None
        try:
            if (ref := f.raw(key) if required else f.raw(key, None)) is not None:
                value = resolve(ref, f.source, key)
        except InputError as exc:
            f.problems.extend(exc.problems)
        out.append(value)
    return out[0], out[1]


def _slo(f: Fields) -> Slo:
    """The ``slo`` mapping: TTFT and TPOT in ms (either may be absent), the percentile."""
    s = f.child("slo", f.raw("slo"))
    ttft = s.float("ttft_ms", None, positive=True, max=1e9)
    tpot = s.float("tpot_ms", None, positive=True, max=1e9)
    pct = s.float("percentile", 99.0, positive=True, max=100.0)
    s.close()
    return Slo(ttft, tpot, pct if pct is not None else 99.0)


def _deployment(f: Fields) -> Deployment | None:
    g = f.child("deployment", f.raw("deployment"))
    if not g.ok:
        return None
    if g.has("disaggregated"):
        g.fail("disaggregated", "prefill/decode disaggregation is not supported yet")
    values = dict(
        replicas=g.int("replicas", 1, min=1, max=MAX_DEGREE), tp=g.int("tp", min=1, max=MAX_DEGREE),
        pp=g.int("pp", 1, min=1, max=MAX_DEGREE), ep=g.int("ep", 1, min=1, max=MAX_DEGREE),
        attention_dp=g.int("attention_dp", 1, min=1, max=MAX_DEGREE),
        weights=g.enum("weights", Precision, Precision.BF16),
        kv_cache=g.enum("kv_cache", Precision, Precision.BF16),
        max_num_seqs=g.int("max_num_seqs", None, min=1, max=MAX_REQUESTS),
        max_batched_tokens=g.int("max_batched_tokens", None, min=1, max=MAX_SEQ_LEN),
        chunked_prefill=g.bool("chunked_prefill", None),
    )
    g.close()
    if values["kv_cache"] is not None and values["kv_cache"] not in KV_PRECISIONS:
        g.fail("kv_cache", f"expected one of {', '.join(p.value for p in KV_PRECISIONS)}, "
                           f"got {values['kv_cache'].value}")
        return None
    required = ("replicas", "tp", "pp", "ep", "attention_dp", "weights", "kv_cache")
    if any(values[k] is None for k in required):
        return None
    return Deployment(**values)  # type: ignore[arg-type]


def _check(plan: ServingPlan, f: Fields) -> None:
    d, m, c = plan.deployment, plan.model, plan.cluster
    if d.gpus != c.gpus:
        f.fail("deployment", f"replicas x tp x pp x attention_dp = {d.gpus} GPUs, but the cluster "
                             f"has {c.gpus}")
    if m.heads % d.tp:
        f.fail("deployment.tp", f"must divide {m.name}'s {m.heads} attention heads, got {d.tp}")
    if d.pp > m.layers:
        f.fail("deployment.pp", f"at most {m.name}'s {m.layers} layers, got {d.pp}")
    stage = d.tp * d.attention_dp
    if not m.is_moe and (d.ep > 1 or d.attention_dp > 1):
        f.fail("deployment", f"ep and attention_dp are for mixture-of-experts models; {m.name} is dense")
    elif m.is_moe and (stage % d.ep or m.experts % d.ep):
        f.fail("deployment.ep", f"must divide tp x attention_dp ({stage}) and the {m.experts} experts, "
                                f"got {d.ep}")
    tokens, seqs = d.max_batched_tokens, d.max_num_seqs
    if tokens is not None and seqs is not None and tokens < seqs:
        # each running sequence decodes a token an iteration (vLLM refuses this at start)
        f.fail("deployment.max_batched_tokens", f"must be at least max_num_seqs ({d.max_num_seqs:,}), "
                                                f"got {d.max_batched_tokens:,}")
    total = plan.workload.input_len.mean + plan.workload.output_len.mean
    if total > m.max_seq_len:
        f.fail("workload", f"input + output length {total:,.0f} tokens exceeds {m.name}'s max_seq_len "
                           f"{m.max_seq_len:,}: engines refuse such requests")
    if d.chunked_prefill is False and d.max_batched_tokens is not None:
        longest = plan.workload.input_len.ceiling
        if d.max_batched_tokens < longest:
            f.fail("deployment.max_batched_tokens", f"without chunked prefill a prompt must fit one "
                                                    f"iteration: at least {longest:,.0f}, got "
                                                    f"{d.max_batched_tokens:,}")


@dataclass(frozen=True, slots=True)
class ServingJob:
    """What ``autoplan serve JOB.yaml`` reads: every field optional (flags fill the rest)."""

    model: Model | None = None
    cluster: Cluster | None = None
    gpus: int | None = None
    engine: Engine | None = None
    input_len: Lengths | None = None
    output_len: Lengths | None = None
    arrival: Arrival | None = None
    requests: int | None = None
    slo: Slo | None = None


def read_serving_job(data: Any, source: str) -> ServingJob:
    """A serving job file: ``model``, ``cluster``, ``gpus``, ``engine``, ``workload``
    (as in a plan) and ``slo``; no deployment (that is what ``serve`` finds)."""
    problems: list[Problem] = []
    f = Fields(data, source, "", problems)
    if not f.ok:
        raise InputError(problems)
    if f.has("deployment"):
        f.fail("deployment", "a job file leaves the deployment to `autoplan serve`; a plan with "
                             "one is read by `autoplan evaluate`")
    f.raw("autoplan", None)
    kind = f.str("kind", "serving")
    if kind is not None and kind != "serving":
        f.fail("kind", f"expected serving, got {kind!r}"[:120])
    model, cluster = _model_and_cluster(f, required=False)
    gpus = f.int("gpus", None, min=1, max=MAX_DEGREE * 16)
    engine = f.enum("engine", Engine, None)
    inp = out = arrival = None
    requests = None
    if f.has("workload"):
        w = f.child("workload", f.raw("workload"))
        if w.ok:
            inp = _lengths(w, "input_len") if w.has("input_len") else None
            out = _lengths(w, "output_len") if w.has("output_len") else None
            arrival = _arrival(w) if w.has("arrival") else None
            requests = w.int("requests", None, min=1, max=MAX_REQUESTS)
            w.close()
    slo = _slo(f) if f.has("slo") else None
    f.close()
    if problems:
        raise InputError(problems)
    return ServingJob(model=model, cluster=cluster, gpus=gpus, engine=engine, input_len=inp,
                      output_len=out, arrival=arrival, requests=requests, slo=slo)


def read_serving_plan(data: Any, source: str) -> ServingPlan:
    """Build and check a serving plan from a plan-file mapping; every problem at once."""
    from autoplan.plan import SCHEMA_VERSION

    problems: list[Problem] = []
    f = Fields(data, source, "", problems)
    if not f.ok:
        raise InputError(problems)
    version = f.int("autoplan")
    if version is not None and version != SCHEMA_VERSION:
        f.fail("autoplan", f"expected schema version {SCHEMA_VERSION}, got {version}")
    f.str("kind")
    model, cluster = _model_and_cluster(f, required=True)
    engine = f.enum("engine", Engine, Engine.VLLM)
    deployment = _deployment(f)
    w = f.child("workload", f.raw("workload"))
    workload = None
    if w.ok:
        inp, out, arrival = _lengths(w, "input_len"), _lengths(w, "output_len"), _arrival(w)
        requests = w.int("requests", 1000, min=1, max=MAX_REQUESTS)
        w.close()
        if None not in (inp, out, arrival, requests):
            workload = Workload(inp, out, arrival, requests)  # type: ignore[arg-type]
    slo = _slo(f) if f.has("slo") else Slo()
    if f.has("prediction") and not isinstance(f.raw("prediction"), Mapping):
        f.fail("prediction", "expected a mapping (written by autoplan serve or evaluate)")
    f.close()
    if problems or None in (model, cluster, engine, deployment, workload):
        raise InputError(problems or [Problem(source, "", "incomplete serving plan")])
    plan = ServingPlan(model, cluster, engine, deployment, workload, slo)  # type: ignore[arg-type]
    _check(plan, f)
    if problems:
        raise InputError(problems)
    return plan
