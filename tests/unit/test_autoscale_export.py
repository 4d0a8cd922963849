"""The autoscaler settings of an autoscaled serving plan (autoplan.export.autoscale), each
validated against the resource's published schema (tests/data/schemas/autoscale/README.md
names the releases): a Kubernetes HorizontalPodAutoscaler (autoscaling/v2), a KEDA
ScaledObject (keda.sh/v1alpha1) and the Dynamo planner's PlannerConfig."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.errors import InputError
from autoplan.export.autoscale import (
    DYNAMO_FILE,
    HPA_FILE,
    KEDA_FILE,
    autoscale_files,
    dynamo_planner_config,
    horizontal_pod_autoscaler,
    keda_scaled_object,
    resource_name,
)
from autoplan.serving.autoscale import Autoscale, ScalingMetric, ScalingPeriod
from autoplan.serving.deployment import (
    Arrival,
    ArrivalKind,
    Deployment,
    Lengths,
    ServingPlan,
    Slo,
    Workload,
)
from autoplan.serving.engine import Engine

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas" / "autoscale"


def _schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / name).read_text())


def _closed(schema: Any) -> Any:
    """Every object that lists its properties closed to others: what ``kubectl apply
    --validate=strict`` does with a CRD (the API server would prune an unknown field)."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


HPA = _schema("hpa-autoscaling-v2.json")
KEDA = _closed(_schema("keda-scaledobject-v1alpha1.json"))
DYNAMO = _schema("dynamo-planner-config.json")


def _valid(doc: Any, schema: dict[str, Any]) -> None:
    jsonschema.validators.validator_for(schema)(schema).validate(doc)


def _plan(model: str = "llama3.1-8b", tp: int = 1, pp: int = 1, replicas: int = 3,
          engine: Engine = Engine.VLLM, slo: Slo | None = None,
          metric: ScalingMetric = ScalingMetric.REQUESTS_IN_FLIGHT) -> ServingPlan:
    base = resolve_cluster("dgx-h100")
    gpus = replicas * tp * pp
    cluster = with_gpus(base, gpus if gpus < base.gpus_per_node else -(-gpus // 8) * 8)
    autoscale = Autoscale(
        min_replicas=1, max_replicas=replicas, metric=metric, target=162.8 if metric.value.startswith("req")
        else 0.41, capacity_rps=23.9, requests_in_flight=179.1, kv_cache_usage=0.45,
        periods=(ScalingPeriod(start_h=0, hours=8, rate_rps=3, replicas=1),
                 ScalingPeriod(start_h=8, hours=16, rate_rps=60, replicas=replicas)))
    workload = Workload(Lengths(1024), Lengths(256), Arrival(ArrivalKind.RATE, rate_rps=60.0))
    return ServingPlan(resolve_model(model), cluster, engine, Deployment(replicas=replicas, tp=tp, pp=pp),
                       workload, slo or Slo(1000.0, 40.0), autoscale=autoscale)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
@pytest.mark.parametrize("metric", list(ScalingMetric))
def test_the_hpa_and_the_scaledobject_validate_and_hold_the_per_replica_target(
        engine: Engine, metric: ScalingMetric) -> None:
    plan = _plan(engine=engine, metric=metric)
    hpa = horizontal_pod_autoscaler(plan, namespace="serving")
    _valid(hpa, HPA)
    spec: Any = hpa["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 3)
    target = spec["metrics"][0]["pods"]["target"]
    assert target["type"] == "AverageValue"
    assert int(target["averageValue"][:-1]) / 1000 == pytest.approx(plan.autoscale.target, abs=1e-3)  # type: ignore[union-attr]
    assert spec["metrics"][0]["pods"]["metric"]["name"] == metric.value
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": resource_name(plan)}
    so = keda_scaled_object(plan, namespace="serving")
    _valid(so, KEDA)
    keda: Any = so["spec"]
    assert keda["minReplicaCount"] <= keda["maxReplicaCount"]  # the CRD's CEL rule
    trigger = keda["triggers"][0]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert float(trigger["metadata"]["threshold"]) == pytest.approx(plan.autoscale.target, rel=1e-5)  # type: ignore[union-attr]
    gauge = {"vllm": "vllm:", "sglang": "sglang:"}[engine.value]
    assert gauge in trigger["metadata"]["query"] and 'namespace="serving"' in trigger["metadata"]["query"]


def test_a_replica_across_nodes_is_scaled_as_a_leaderworkerset() -> None:
    plan = _plan(model="llama3-405b", tp=8, pp=2, replicas=2)
    assert plan.nodes_per_replica == 2
    for doc, schema in ((horizontal_pod_autoscaler(plan), HPA), (keda_scaled_object(plan), KEDA)):
        _valid(doc, schema)
        ref: Any = doc["spec"]
        assert ref["scaleTargetRef"]["kind"] == "LeaderWorkerSet"
        assert ref["scaleTargetRef"]["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    planner = dynamo_planner_config(plan)
    _valid(planner, DYNAMO)
    assert (planner["decode_engine_num_gpu"], planner["max_gpu_budget"]) == (16, 32)


def test_the_dynamo_planner_gets_the_slo_and_the_replica_bounds() -> None:
    plan = _plan(slo=Slo(800.0, 30.0, 90.0))
    planner = dynamo_planner_config(plan)
    _valid(planner, DYNAMO)
    assert planner["mode"] == "agg" and planner["optimization_target"] == "sla"
    # the aggregated planner runs load-based scaling only (its core/agg.py refuses the other)
    assert (planner["enable_load_scaling"], planner["enable_throughput_scaling"]) == (True, False)
    got = (planner["ttft"], planner["itl"], planner["min_endpoint"], planner["max_gpu_budget"])
    assert got == (800, 30, 1, 3)
    no_slo = dynamo_planner_config(_plan(slo=Slo()))
    _valid(no_slo, DYNAMO)
    assert no_slo["optimization_target"] == "throughput" and "ttft" not in no_slo


def test_the_schemas_refuse_what_the_resources_refuse() -> None:
    plan = _plan()
    hpa = copy.deepcopy(horizontal_pod_autoscaler(plan))
    hpa["spec"]["maxReplica"] = hpa["spec"].pop("maxReplicas")  # type: ignore[attr-defined]
    with pytest.raises(jsonschema.ValidationError):
        _valid(hpa, HPA)
    so = copy.deepcopy(keda_scaled_object(plan))
    so["spec"]["triggers"] = []  # type: ignore[index]
    with pytest.raises(jsonschema.ValidationError):
        _valid(so, KEDA)
    planner = dynamo_planner_config(plan) | {"max_gpu_budjet": 3}
    with pytest.raises(jsonschema.ValidationError):
        _valid(planner, DYNAMO)


def test_the_files_are_yaml_of_the_same_documents_and_trtllm_gets_the_planner_alone() -> None:
    plan = _plan()
    written, notes = autoscale_files(plan)
    assert set(written) == {HPA_FILE, KEDA_FILE, DYNAMO_FILE} and notes == ()
    assert yaml.safe_load(written[HPA_FILE]) == horizontal_pod_autoscaler(plan)
    assert yaml.safe_load(written[KEDA_FILE]) == keda_scaled_object(plan)
    assert yaml.safe_load(written[DYNAMO_FILE]) == dynamo_planner_config(plan)
    trt = _plan(engine=Engine.TRTLLM)
    written, notes = autoscale_files(trt)
    assert set(written) == {DYNAMO_FILE} and "trtllm" in notes[0]
    _valid(yaml.safe_load(written[DYNAMO_FILE]), DYNAMO)
    with pytest.raises(InputError, match="no Prometheus gauge"):
        horizontal_pod_autoscaler(trt)


def test_a_plan_without_an_autoscale_block_is_refused() -> None:
    import dataclasses

    with pytest.raises(InputError, match="no autoscale block"):
        autoscale_files(dataclasses.replace(_plan(), autoscale=None))


def test_the_k8s_and_dynamo_exports_carry_an_autoscaled_plans_autoscaler() -> None:
    from autoplan.export import deploy

    plan = _plan()
    docs = list(yaml.safe_load_all(deploy.export_deployment(plan, "k8s", "p.yaml")["k8s.yaml"]))
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    _valid(hpa, HPA)
    workload = [d for d in docs if d["kind"] == "Deployment"][0]["metadata"]["name"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == workload  # the export's own Deployment
    dgd = list(yaml.safe_load_all(deploy.export_deployment(plan, "dynamo", "p.yaml")["dynamo.yaml"]))
    (config,) = [d for d in dgd if d["kind"] == "ConfigMap"]
    _valid(json.loads(config["data"]["planner.json"]), DYNAMO)
    fixed = dataclasses.replace(plan, autoscale=None)
    assert not [d for d in yaml.safe_load_all(deploy.export_deployment(fixed, "k8s", "p.yaml")["k8s.yaml"])
                if d["kind"] == "HorizontalPodAutoscaler"]


def test_the_llm_d_values_of_an_autoscaled_plan_say_where_its_autoscaler_goes() -> None:
    from autoplan.export import deploy

    text = deploy.export_deployment(_plan(), "llm-d", "p.yaml")["llm-d-values.yaml"]
    assert "autoscale (1 to 3 replicas)" in text and "--autoscale-out" in text
    assert yaml.safe_load(text)["decode"]["replicas"] == 3
