"""Autoscaler settings for a serving plan planned over a day's traffic (its ``autoscale``
block: ``serve --traffic``): a Kubernetes HorizontalPodAutoscaler, a KEDA ScaledObject and
the Dynamo planner's configuration, each a pure function of the plan, checked in the tests
against the resource's published schema (tests/data/schemas/autoscale/README.md names the
releases).

All three scale the plan's replicas between its ``min_replicas`` and ``max_replicas``; the
first two hold the per-replica threshold autoplan worked out (requests in flight, or the
share of the KV cache in use: ``autoplan.serving.autoscale``), read from the engine's own
Prometheus gauges:

- vLLM (vllm/v1/metrics/loggers.py): ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (a share, 0..1);
- SGLang (python/sglang/srt/metrics/collector.py): ``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:token_usage`` (the share of the KV pool's tokens used);
- TensorRT-LLM's ``trtllm-serve`` answers ``/metrics`` with JSON iteration statistics, not
  Prometheus gauges (docs/source/commands/trtllm-serve.rst), so an HPA or KEDA trigger has
  nothing to read: only the Dynamo planner's settings are written for it.

The scale target is the replicas' workload: a ``Deployment`` (apps/v1), or a
``LeaderWorkerSet`` (leaderworkerset.x-k8s.io/v1, which has the scale subresource an HPA
drives) where a replica spans nodes, named as ``resource_name`` says unless given.

- **HPA** (autoscaling/v2): a ``Pods`` metric at an ``AverageValue`` target per replica.
  Kubernetes reads a pod metric through a custom-metrics adapter; the metric's PromQL is in
  the annotation ``autoplan/metric-query`` for the adapter's rule (Prometheus Adapter:
  ``seriesQuery``/``metricsQuery``), named ``requests_in_flight`` or ``kv_cache_usage``.
- **KEDA** (keda.sh/v1alpha1 ScaledObject): a ``prometheus`` trigger whose query sums the
  gauge over the target's pods, ``metricType: AverageValue`` (KEDA's default: the sum over
  the replicas, pkg/scalers/scaler.go GetMetricTargetType) and ``threshold`` the per-replica
  target; no adapter needed. ``serverAddress`` defaults to kube-prometheus-stack's service,
  the address Dynamo's planner also defaults to (planner_config.py).
- **Dynamo planner** (its ``PlannerConfig``, passed as ``--config`` or under a
  DynamoGraphDeploymentRequest's ``spec.features.planner``): ``mode: agg``; its aggregated
  planner scales on its own TTFT and ITL estimates (components/src/dynamo/planner/core/
  agg.py: load-based scaling only), so it is given the plan's SLO (``ttft``, ``itl`` in
  ms; ITL is the time per output token), ``min_endpoint`` and ``max_gpu_budget``; the
  per-replica threshold is for the other two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from autoplan.errors import InputError
from autoplan.serving.autoscale import Autoscale, ScalingMetric
from autoplan.serving.deployment import ServingPlan

# kube-prometheus-stack's Prometheus service (Dynamo's planner defaults to it: planner_config.py)
DEFAULT_PROMETHEUS = "http://prometheus-kube-prometheus-prometheus.monitoring.svc.cluster.local:9090"
HPA_FILE = "hpa.yaml"
KEDA_FILE = "keda-scaledobject.yaml"
DYNAMO_FILE = "dynamo-planner.yaml"


@dataclass(frozen=True, slots=True)
class Gauges:
    """An engine's Prometheus gauges: requests running and waiting, the KV cache's share used."""

    running: str
    waiting: str
    kv_usage: str


ENGINE_GAUGES = {
    "vllm": Gauges("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
    "sglang": Gauges("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"),
}


def _autoscale(plan: ServingPlan) -> Autoscale:
    if plan.autoscale is None:
        raise InputError.single("autoscale", "", "the plan has no autoscale block: `autoplan serve "
                                                 "--traffic FILE.csv --out plan.yaml` writes one")
    return plan.autoscale


def resource_name(plan: ServingPlan) -> str:
    """The workload's name: the model and the engine, as a DNS-1123 label (lower case,
    digits and '-', at most 63 characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"{plan.model.name}-{plan.engine.value}".lower()).strip("-")
    return name[:63].rstrip("-") or "autoplan"


def scale_target(plan: ServingPlan, name: str) -> dict[str, str]:
    """The replicas' workload: a LeaderWorkerSet where a replica spans nodes, else a Deployment."""
    if plan.nodes_per_replica > 1:
        return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}


def _gauges(plan: ServingPlan) -> Gauges:
    found = ENGINE_GAUGES.get(plan.engine.value)
    if found is None:
        raise InputError.single("engine", "", (
            f"{plan.engine.value} exports no Prometheus gauge of requests in flight or KV cache use "
            "(trtllm-serve's /metrics is JSON): no HPA or KEDA trigger can read one; the Dynamo "
            "planner's settings are written"))
    return found


def metric_query(plan: ServingPlan, metric: ScalingMetric, namespace: str, name: str,
                 by_pod: bool = False) -> str:
    """The PromQL of ``metric`` over the target's pods: summed (KEDA divides by the
    replicas), or per pod (``by_pod``: an adapter's per-pod series)."""
    g = _gauges(plan)
    where = f'{{namespace="{namespace}",pod=~"{name}-.*"}}'
    agg = "sum by (namespace, pod)" if by_pod else "sum"
    if metric is ScalingMetric.REQUESTS_IN_FLIGHT:
        return f"{agg}({g.running}{where}) + {agg}({g.waiting}{where})"
    return f"{agg}({g.kv_usage}{where})"


def _quantity(value: float) -> str:
    """A Kubernetes quantity in thousandths (``162800m``): exact, as the API server writes it."""
    return f"{max(1, round(value * 1000))}m"


def horizontal_pod_autoscaler(plan: ServingPlan, *, name: str | None = None,
                              namespace: str = "default") -> dict[str, object]:
    """An autoscaling/v2 HorizontalPodAutoscaler holding the plan's metric at its
    per-replica target (module doc)."""
    a = _autoscale(plan)
    name = name or resource_name(plan)
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace, "annotations": {
            "autoplan/metric-query": metric_query(plan, a.metric, namespace, name, by_pod=True),
            "autoplan/at-capacity": (f"{a.capacity_rps:.4g} req/s, {a.requests_in_flight:.4g} requests "
                                     f"in flight, KV cache {a.kv_cache_usage:.1%} per replica")}},
        "spec": {
            "scaleTargetRef": scale_target(plan, name),
            "minReplicas": a.min_replicas, "maxReplicas": a.max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": a.metric.value},
                "target": {"type": "AverageValue", "averageValue": _quantity(a.target)}}}],
        },
    }


def keda_scaled_object(plan: ServingPlan, *, name: str | None = None, namespace: str = "default",
                       prometheus: str = DEFAULT_PROMETHEUS) -> dict[str, object]:
    """A keda.sh/v1alpha1 ScaledObject with a Prometheus trigger at the per-replica target."""
    a = _autoscale(plan)
    name = name or resource_name(plan)
    return {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "scaleTargetRef": scale_target(plan, name),
            "minReplicaCount": a.min_replicas, "maxReplicaCount": a.max_replicas,
            "triggers": [{"type": "prometheus", "metricType": "AverageValue", "metadata": {
                "serverAddress": prometheus,
                "query": metric_query(plan, a.metric, namespace, name),
                "threshold": f"{a.target:.6g}"}}],
        },
    }


def dynamo_planner_config(plan: ServingPlan) -> dict[str, object]:
    """The Dynamo planner's PlannerConfig for the plan (module doc)."""
    a = _autoscale(plan)
    d, slo = plan.deployment, plan.slo
    out: dict[str, object] = {
        "environment": "kubernetes", "backend": plan.engine.value, "mode": "agg",
        "optimization_target": "sla" if slo.any else "throughput",
        "enable_load_scaling": True, "enable_throughput_scaling": False,
        "min_endpoint": a.min_replicas, "max_gpu_budget": a.max_replicas * d.gpus_per_replica,
        "decode_engine_num_gpu": d.gpus_per_replica,
    }
    if slo.ttft_ms is not None:
        out["ttft"] = slo.ttft_ms
    if slo.tpot_ms is not None:
        out["itl"] = slo.tpot_ms
    return out


def _yaml(doc: object, head: str) -> str:
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)


def autoscale_files(plan: ServingPlan, *, name: str | None = None, namespace: str = "default",
                    prometheus: str = DEFAULT_PROMETHEUS) -> tuple[dict[str, str], tuple[str, ...]]:
    """``{file name: YAML}`` of every setting the plan's engine supports, and why any was
    left out (TensorRT-LLM: module doc)."""
    a = _autoscale(plan)
    if plan.deployment.disaggregated is not None:
        raise InputError.single("autoscale", "", "autoscaling a disaggregated deployment is not planned")
    q = f"p{plan.slo.percentile:g}"
    head = (f"# autoplan: {plan.model.name} on {plan.engine.value}, {a.min_replicas}..{a.max_replicas} "
            f"replicas of {plan.deployment.gpus_per_replica} GPU(s); at capacity a replica serves "
            f"{a.capacity_rps:.4g} req/s meeting the SLO at {q}\n")
    files = {DYNAMO_FILE: _yaml(dynamo_planner_config(plan), head)}
    notes: tuple[str, ...] = ()
    if plan.engine.value in ENGINE_GAUGES:
        files[HPA_FILE] = _yaml(horizontal_pod_autoscaler(plan, name=name, namespace=namespace), head)
        files[KEDA_FILE] = _yaml(keda_scaled_object(plan, name=name, namespace=namespace,
                                                    prometheus=prometheus), head)
    else:
        notes = (f"{plan.engine.value}: {HPA_FILE} and {KEDA_FILE} not written: trtllm-serve exports no "
                 "Prometheus gauge of requests in flight or KV cache use (its /metrics is JSON)",)
    return files, notes
