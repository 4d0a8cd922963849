"""`autoplan diff`: what changed between two plans, and what it does to the prediction.

A diff has two parts, both data: the plan fields whose values differ (model and cluster
field by field, the GPU count, the job, each layout degree, micro-batch, microbatches
per step, schedule, recompute, ZeRO stage, sequence parallelism, the stage split), and
the predicted metrics of both plans side by side with absolute and relative deltas
(step time, throughput, MFU, peak memory and each of its components, each step-time
term, each stage's peak memory). Metric names follow the plan file's ``prediction``
keys, so ``memory_gib.peak`` here is ``prediction.memory_gib.peak`` there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.pipeline_layout import render_layout
from autoplan.plan import TIME_TERMS, Plan, Prediction
from autoplan.units import GiB

MEMORY_TERMS = ("peak", "weights", "grads", "optimizer", "activations", "other")
Value = Any  # a JSON scalar, or a tuple of them (the stage split)


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One plan field whose value differs; None where a plan has no such field."""

    field: str  # dotted, as in the plan file: "layout.tp", "model.layers", "cluster.nodes"
    a: Value
    b: Value

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "a": _json(self.a), "b": _json(self.b)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Delta:
    """One predicted metric of both plans. None where a plan has no such value (a
    pipeline stage the other plan does not have)."""

    metric: str  # "step_time_s", "memory_gib.peak", "breakdown_s.bubble", "memory_gib_per_stage[1].peak"
    unit: str  # "s", "tokens/s", "TFLOP/s", "fraction", "GiB"
    a: float | None
    b: float | None

    @property
    def change(self) -> float | None:
        """b - a."""
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def relative(self) -> float | None:
        """(b - a) / a; None where a is 0 or either is missing."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return (self.b - self.a) / abs(self.a)

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "unit": self.unit, "a": self.a, "b": self.b,
                "change": self.change, "relative": self.relative}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanDiff:
    source_a: str
    source_b: str
    plan_a: Plan
    plan_b: Plan
    prediction_a: Prediction
    prediction_b: Prediction
    changes: tuple[Change, ...]
    deltas: tuple[Delta, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.source_a,
            "b": self.source_b,
            "changes": [c.to_dict() for c in self.changes],
            "feasible": {"a": self.prediction_a.feasible, "b": self.prediction_b.feasible},
            "deltas": [d.to_dict() for d in self.deltas],
        }


def diff_plans(a: Plan, b: Plan, source_a: str = "A", source_b: str = "B") -> PlanDiff:
    """Compare two valid plans (``autoplan.plans.file.read_plan``); both are evaluated."""
    pa, pb = evaluate(a), evaluate(b)
    return PlanDiff(source_a=source_a, source_b=source_b, plan_a=a, plan_b=b,
                    prediction_a=pa, prediction_b=pb, changes=plan_changes(a, b),
                    deltas=prediction_deltas(pa, pb))


def plan_changes(a: Plan, b: Plan) -> tuple[Change, ...]:
    """The fields whose values differ, in plan-file order."""
    fa, fb = plan_fields(a), plan_fields(b)
    keys = list(fa) + [k for k in fb if k not in fa]
    return tuple(Change(field=k, a=fa.get(k), b=fb.get(k)) for k in keys if fa.get(k) != fb.get(k))


def plan_fields(plan: Plan) -> dict[str, Value]:
    """Every field that makes up a plan, flattened to dotted keys in plan-file order.
    Derived facts people compare plans by sit beside the fields they follow from
    (``gpus`` after the cluster, ``microbatches`` after ``micro_batch``)."""
    out: dict[str, Value] = {}
    _flatten("model", plan.model.to_dict(), out)
    placement = plan.placement
    cluster = plan.cluster.to_dict() if placement is None else placement.cluster.to_dict()
    _flatten("cluster", cluster, out)
    out["gpus"] = plan.cluster.gpus if placement is None else plan.layout.gpus
    # the pool of each stage, in order (None on a cluster of identical nodes)
    out["placement"] = None if placement is None else tuple(
        placement.cluster.pools[i].name for i in placement.stage_pools)
    job = plan.job
    out.update({"job.global_batch": job.global_batch, "job.seq_len": job.seq_len,
                "job.dtype": job.dtype.value})
    if plan.model.is_moe:
        out["job.moe_imbalance"] = job.moe_imbalance
    # the states it keeps: the job's, where unset its stack's (``Plan.states``)
    out.update({f"job.{k}": v for k, v in plan.states.values().items()})
    lay = plan.layout
    for axis in ("dp", "tp", "pp", "cp", "ep", "vpp"):
        out[f"layout.{axis}"] = getattr(lay, axis)
    if plan.model.is_moe:  # dense models: etp is tp
        out["layout.etp"] = lay.etp
    out["micro_batch"] = plan.micro_batch
    out["microbatches"] = plan.num_microbatches
    out["schedule"] = plan.schedule.value
    out["recompute"] = plan.recompute_label
    out["zero"] = int(plan.zero)
    out["sequence_parallel"] = plan.sequence_parallel
    out["cp_comm"] = plan.cp_comm.value if lay.cp > 1 else None
    out["stages"] = plan.stage_layers
    # chunks of their own sizes, as Megatron's layout string (None: equal chunks)
    out["pipeline_layout"] = render_layout(plan.chunks) if plan.chunks is not None else None
    out["offload.optimizer"] = plan.offload.optimizer
    out["offload.activations"] = plan.offload.activations
    _flatten("stack", plan.stack.to_dict(), out)
    return out


def _flatten(prefix: str, value: Any, out: dict[str, Value]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}", item, out)
    elif isinstance(value, list):
        out[prefix] = tuple(value)
    else:
        out[prefix] = value


def prediction_deltas(a: Prediction, b: Prediction) -> tuple[Delta, ...]:
    """Headline metrics, then memory, the step-time terms and each stage's peak memory."""
    rows = [
        Delta(metric="step_time_s", unit="s", a=a.step_time_s, b=b.step_time_s),
        Delta(metric="tokens_per_s", unit="tokens/s", a=a.tokens_per_s, b=b.tokens_per_s),
        Delta(metric="tflops_per_gpu", unit="TFLOP/s", a=a.tflops_per_gpu, b=b.tflops_per_gpu),
        Delta(metric="hw_tflops_per_gpu", unit="TFLOP/s", a=a.hw_tflops_per_gpu, b=b.hw_tflops_per_gpu),
        Delta(metric="mfu", unit="fraction", a=a.mfu, b=b.mfu),
        Delta(metric="capacity_gib", unit="GiB", a=a.capacity_bytes / GiB, b=b.capacity_bytes / GiB),
        Delta(metric="headroom_gib", unit="GiB", a=a.headroom_bytes / GiB, b=b.headroom_bytes / GiB),
        Delta(metric="host_memory_gib_per_node", unit="GiB", a=a.host_memory_bytes_per_node / GiB,
              b=b.host_memory_bytes_per_node / GiB),
    ]
    ma, mb = a.memory.to_gib_dict(), b.memory.to_gib_dict()
    rows += [Delta(metric=f"memory_gib.{k}", unit="GiB", a=ma[k], b=mb[k]) for k in MEMORY_TERMS]
    ta, tb = a.breakdown.to_dict(), b.breakdown.to_dict()
    rows += [Delta(metric=f"breakdown_s.{t}", unit="s", a=ta[t], b=tb[t]) for t in TIME_TERMS]
    for s in range(max(len(a.memory_per_stage), len(b.memory_per_stage))):
        rows.append(Delta(metric=f"memory_gib_per_stage[{s}].peak", unit="GiB",
                          a=_stage_peak(a, s), b=_stage_peak(b, s)))
    return tuple(rows)


def _stage_peak(pred: Prediction, stage: int) -> float | None:
    if stage >= len(pred.memory_per_stage):
        return None
    return pred.memory_per_stage[stage].peak / GiB


def _json(value: Value) -> Any:
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingDiff:
    """Two serving plans: the fields that differ and their predictions side by side."""

    source_a: str
    source_b: str
    summary_a: str
    summary_b: str
    meets_a: bool
    meets_b: bool
    changes: tuple[Change, ...]
    deltas: tuple[Delta, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.source_a, "b": self.source_b, "kind": "serving",
                "changes": [c.to_dict() for c in self.changes],
                "meets_slo": {"a": self.meets_a, "b": self.meets_b},
                "deltas": [d.to_dict() for d in self.deltas]}


# serving prediction metrics by unit, in the order the plan file's ``prediction`` has them
_SERVING_UNITS = {"ttft_ms": "ms", "tpot_ms": "ms", "e2e_ms": "ms", "output_tokens_per_s": "tokens/s",
                  "total_tokens_per_s": "tokens/s", "requests_per_s": "req/s", "goodput_rps": "req/s",
                  "memory_gib_per_gpu": "GiB", "kv_cache_tokens": "tokens", "max_concurrency": "sequences"}


def diff_serving(a: Any, b: Any, source_a: str = "A", source_b: str = "B") -> ServingDiff:
    """Compare two valid serving plans (``autoplan.serving.planfile.read_serving_plan``);
    both are simulated (``autoplan.serving.evaluate``)."""
    from autoplan.serving.evaluate import evaluate_serving, serving_document

    pa, pb = evaluate_serving(a), evaluate_serving(b)
    da, db = serving_document(a, pa), serving_document(b, pb)
    fa: dict[str, Value] = {}
    fb: dict[str, Value] = {}
    for doc, out in ((da, fa), (db, fb)):
        for key, value in doc.items():
            if key != "prediction":
                _flatten(key, value, out)
    keys = list(fa) + [k for k in fb if k not in fa]
    changes = tuple(Change(field=k, a=fa.get(k), b=fb.get(k)) for k in keys if fa.get(k) != fb.get(k))
    qa: dict[str, Value] = {}
    qb: dict[str, Value] = {}
    _flatten("", da["prediction"], qa)
    _flatten("", db["prediction"], qb)
    deltas = []
    for key in qa:
        name = key.lstrip(".")
        unit = _SERVING_UNITS.get(name.split(".")[0])
        if unit is None or isinstance(qa[key], bool):
            continue
        deltas.append(Delta(metric=name, unit=unit, a=float(qa[key]), b=float(qb[key])))

    def words(plan: Any) -> str:
        d = plan.deployment
        return f"{plan.engine.value} {d.label()}, weights {d.weights.value}, KV cache {d.kv_cache.value}"

    return ServingDiff(source_a=source_a, source_b=source_b, summary_a=words(a), summary_b=words(b),
                       meets_a=pa.meets_slo, meets_b=pb.meets_slo, changes=changes, deltas=tuple(deltas))
