"""``export --to dynamo|llm-d|k8s`` (issue 52, "Deploy where serving runs"): every manifest is
checked against the resource's own published schema, vendored in tests/data/schemas/ (its
README names each repository, path and release): Dynamo 1.1.0's DynamoGraphDeployment CRD,
LWS v0.10.0's LeaderWorkerSet CRD, llm-d-modelservice v0.4.12's values.schema.json (and its
values.yaml's keys), Kubernetes 1.35's Deployment, Service, ConfigMap and the objects they
hold. A CRD's schema lets unknown fields through (the API server prunes them silently), so
validation here is strict: an object's property its schema does not name is an error."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.helpers import REPO, autoplan

SCHEMAS = REPO / "tests" / "data" / "schemas"
PLAN = """\
autoplan: 1
kind: serving
model: {model}
cluster: {cluster}
engine: {engine}
deployment: {deployment}
workload: {{input_len: 1500, output_len: 250, arrival: {{rate_rps: 4}}, requests: 100}}
slo: {{ttft_ms: 2000, tpot_ms: 50, percentile: 90}}
"""
AGGREGATED = ("{name: dgx-h100, nodes: 1}", "{replicas: 2, tp: 4}")
DISAGGREGATED = ("{name: dgx-h100, nodes: 1}", "{disaggregated: {prefill: {replicas: 2, tp: 2}, "
                                               "decode: {replicas: 1, tp: 4}}}")
MULTI_NODE = ("{name: dgx-h100, nodes: 4}", "{replicas: 2, tp: 8, pp: 2}")  # TP 8 x PP 2: two nodes each
# a decode pool of two-node instances beside a prefill pool of one-node ones
MULTI_NODE_POOL = ("{name: dgx-h100, nodes: 3}", "{disaggregated: {prefill: {replicas: 2, tp: 4}, "
                                                 "decode: {replicas: 1, tp: 8, pp: 2}}}")
SHAPES = {"aggregated": AGGREGATED, "disaggregated": DISAGGREGATED, "multi-node": MULTI_NODE,
          "multi-node pool": MULTI_NODE_POOL}
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # a Service's name (Kubernetes' validation)


def _plan(shape: str, engine: str = "vllm", model: str = "llama3.1-70b") -> Any:
    from autoplan.serving.planfile import read_serving_plan

    cluster, deployment = SHAPES[shape]
    text = PLAN.format(model=model, cluster=cluster, engine=engine, deployment=deployment)
    return read_serving_plan(yaml.safe_load(text), "plan.yaml", correct=False)


def _export(shape: str, target: str, engine: str = "vllm") -> list[dict[str, Any]]:
    from autoplan.export.deploy import export_deployment

    files = export_deployment(_plan(shape, engine), target, "plan.yaml")
    assert len(files) == 1
    return [d for d in yaml.safe_load_all(next(iter(files.values()))) if d is not None]


# ------------------------------------------------------------------------------ the schemas


def _strict(node: Any) -> Any:
    """The schema with every object closed: a property it does not name is refused (as
    kubeconform -strict does), save where the schema keeps unknown fields on purpose."""
    if isinstance(node, list):
        return [_strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def _json(name: str) -> Any:
    return json.loads((SCHEMAS / name).read_text(encoding="utf-8"))


def _k8s_validator(kind: str) -> Any:
    bundle = _json("kubernetes.json")
    schema = {"$defs": _strict(bundle["$defs"]), "$ref": f"#/$defs/{kind}"}
    return jsonschema.Draft202012Validator(schema)


@cache
def _validator(kind: str) -> Any:
    if kind == "DynamoGraphDeployment":
        return jsonschema.Draft202012Validator(_strict(_json("dynamo-dynamographdeployment-v1alpha1.json")))
    if kind == "LeaderWorkerSet":
        return jsonschema.Draft202012Validator(_strict(_json("lws-leaderworkerset-v1.json")))
    return _k8s_validator({"Deployment": "deployment-apps-v1", "Service": "service-v1",
                           "ConfigMap": "configmap-v1",
                           "ObjectMeta": "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
                           "Container": "io.k8s.api.core.v1.Container",
                           "Volume": "io.k8s.api.core.v1.Volume"}[kind])


def _errors(validator: Any, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def _check(doc: dict[str, Any]) -> None:
    """The document against its kind's schema, its metadata against ObjectMeta's."""
    assert not _errors(_validator(doc["kind"]), doc), _errors(_validator(doc["kind"]), doc)
    assert not _errors(_validator("ObjectMeta"), doc["metadata"])
    name = doc["metadata"]["name"]
    assert DNS_1035.match(name), name


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]
    if doc["kind"] == "Deployment":
        return spec["template"]["spec"]["containers"]
    if doc["kind"] == "LeaderWorkerSet":
        t = spec["leaderWorkerTemplate"]
        return t["leaderTemplate"]["spec"]["containers"] + t["workerTemplate"]["spec"]["containers"]
    return []


def _args(container: dict[str, Any]) -> str:
    return " ".join(container.get("command", []) + container.get("args", []))


# --------------------------------------------------------------------------------- k8s


@pytest.mark.parametrize(("shape", "engine"), [
    ("aggregated", "vllm"), ("aggregated", "sglang"), ("aggregated", "trtllm"),
    ("disaggregated", "vllm"), ("disaggregated", "sglang"),
    ("multi-node", "vllm"), ("multi-node", "sglang"), ("multi-node pool", "vllm")])
def test_k8s_manifests_validate_against_kubernetes_and_lws_schemas(shape: str, engine: str) -> None:
    docs = _export(shape, "k8s", engine)
    for doc in docs:
        _check(doc)
    kinds = [d["kind"] for d in docs]
    assert ("LeaderWorkerSet" in kinds) == shape.startswith("multi-node")
    assert kinds.count("Service") >= 1


def test_k8s_aggregated_plan_is_a_deployment_of_its_replicas_with_gpus_and_readiness() -> None:
    docs = _export("aggregated", "k8s")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    (c,) = _containers(deployment)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert "vllm serve $(MODEL)" in _args(c) and "--tensor-parallel-size 4" in _args(c)
    assert c["env"][0]["valueFrom"]["configMapKeyRef"] == {"name": "llama3-1-70b-vllm-model", "key": "MODEL"}
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": deployment["metadata"]["name"]}


def test_k8s_multi_node_replica_is_a_leaderworkerset_whose_workers_join_the_leader() -> None:
    docs = _export("multi-node", "k8s")
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    t = lws["spec"]["leaderWorkerTemplate"]
    assert lws["spec"]["replicas"] == 2 and t["size"] == 2  # TP 8 x PP 2 over two 8-GPU nodes
    leader, worker = (_args(c) for c in _containers(lws))
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2" in leader
    assert "--nnodes 2 --master-addr $(LWS_LEADER_ADDRESS) --master-port 29500 --node-rank 0" in leader
    assert "--node-rank $(LWS_WORKER_INDEX) --headless" in worker and "--headless" not in leader
    assert "readinessProbe" in t["leaderTemplate"]["spec"]["containers"][0]
    assert "readinessProbe" not in t["workerTemplate"]["spec"]["containers"][0]
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"]["role"] == "leader"
    assert service["metadata"]["name"] != lws["metadata"]["name"]  # LWS's own headless Service has its name


def test_k8s_disaggregated_plan_runs_each_instance_and_the_engines_router() -> None:
    docs = _export("disaggregated", "k8s", "sglang")
    names = [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"]
    assert names == ["llama3-1-70b-sglang-prefill-0", "llama3-1-70b-sglang-prefill-1",
                     "llama3-1-70b-sglang-decode-0", "llama3-1-70b-sglang-router"]
    prefill = _args(_containers(docs[0])[0])
    assert "--disaggregation-mode prefill --disaggregation-transfer-backend nixl" in prefill
    router = _args(_containers(next(d for d in docs if d["metadata"]["name"].endswith("router")))[0])
    assert router.startswith("python -m sglang_router.launch_router --pd-disaggregation")
    assert ("--prefill http://llama3-1-70b-sglang-prefill-0:8000 8998 "
            "--prefill http://llama3-1-70b-sglang-prefill-1:8000 8998 "
            "--decode http://llama3-1-70b-sglang-decode-0:8000") in router


def test_k8s_pool_of_multi_node_instances_is_addressed_through_its_leaders() -> None:
    docs = _export("multi-node pool", "k8s")
    router = next(d for d in docs if d["metadata"]["name"].endswith("router"))
    assert "--decode http://llama3-1-70b-vllm-decode-0.llama3-1-70b-vllm-decode:8000" in _args(
        _containers(router)[0])
    vllm = [c for d in docs for c in _containers(d) if c["name"] == "engine"]
    assert all("--kv-transfer-config" in _args(c) for c in vllm)


def test_k8s_trtllm_options_travel_in_a_configmap_mounted_beside_the_flags() -> None:
    docs = _export("aggregated", "k8s", "trtllm")
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    options = yaml.safe_load(config["data"]["extra-llm-api-options.yaml"])
    assert options["enable_chunked_prefill"] is True
    (c,) = _containers(next(d for d in docs if d["kind"] == "Deployment"))
    assert "--extra_llm_api_options /etc/autoplan/extra-llm-api-options.yaml" in _args(c)


# ------------------------------------------------------------------------------ dynamo


@pytest.mark.parametrize(("shape", "engine"), [
    ("aggregated", "vllm"), ("aggregated", "sglang"), ("aggregated", "trtllm"),
    ("disaggregated", "vllm"), ("disaggregated", "sglang"), ("disaggregated", "trtllm"),
    ("multi-node", "vllm"), ("multi-node", "sglang"), ("multi-node pool", "vllm")])
def test_dynamo_graph_deployment_validates_against_dynamos_crd(shape: str, engine: str) -> None:
    (doc,) = _export(shape, "dynamo", engine)
    assert doc["apiVersion"] == "nvidia.com/v1alpha1" and doc["kind"] == "DynamoGraphDeployment"
    _check(doc)
    services = doc["spec"]["services"]
    assert services["Frontend"]["componentType"] == "frontend"
    workers = {k: v for k, v in services.items() if v["componentType"] == "worker"}
    assert set(workers) == ({"prefill", "decode"} if "disagg" in shape or "pool" in shape else {"worker"})
    runtime = "tensorrtllm" if engine == "trtllm" else engine
    for w in workers.values():
        image = w["extraPodSpec"]["mainContainer"]["image"]
        assert image == f"nvcr.io/nvidia/ai-dynamo/{runtime}-runtime:1.1.0"


def test_dynamo_workers_carry_replicas_gpus_multinode_and_kv_transfer() -> None:
    (doc,) = _export("multi-node pool", "dynamo")
    s = doc["spec"]["services"]
    assert s["prefill"]["replicas"] == 2 and s["prefill"]["resources"]["limits"]["gpu"] == "4"
    assert "multinode" not in s["prefill"]
    assert s["decode"]["multinode"] == {"nodeCount": 2} and s["decode"]["resources"]["limits"]["gpu"] == "8"
    for role in ("prefill", "decode"):
        args = _args(s[role]["extraPodSpec"]["mainContainer"])
        assert args.startswith("python3 -m dynamo.vllm --model $(MODEL)")
        assert f"--disaggregation-mode {role} --kv-transfer-config" in args
    assert "--nnodes" not in _args(s["decode"]["extraPodSpec"]["mainContainer"])  # the operator adds them


def test_dynamo_trtllm_flags_are_dynamo_trtllms_and_the_llm_api_options_json() -> None:
    (doc,) = _export("disaggregated", "dynamo", "trtllm")
    prefill = doc["spec"]["services"]["prefill"]["extraPodSpec"]["mainContainer"]["args"]
    assert "--tp_size" not in prefill and "--backend" not in prefill
    assert prefill[prefill.index("--tensor-parallel-size") + 1] == "2"
    options = json.loads(prefill[prefill.index("--override-engine-args") + 1])
    assert options["cache_transceiver_config"] == {"backend": "DEFAULT"}
    assert options["disable_overlap_scheduler"] is True
    assert prefill[prefill.index("--disaggregation-mode") + 1] == "prefill"


def test_dynamo_names_the_engine_release_its_image_holds_against_the_plans() -> None:
    from autoplan.export.deploy import export_deployment

    text = export_deployment(_plan("aggregated"), "dynamo", "plan.yaml")["dynamo.yaml"]
    assert "holds vllm 0.19.0" in text and "--engine-version 0.19.0" in text


# ------------------------------------------------------------------------------- llm-d


@cache
def _values_keys() -> frozenset[str]:
    return frozenset((SCHEMAS / "llm-d-modelservice-values-keys.txt").read_text(encoding="utf-8").split())


# keys of a pool's container the chart reads itself (templates/_helpers.tpl), not Kubernetes'
CHART_CONTAINER_KEYS = {"modelCommand", "mountModelVolume", "extraConfig"}


def _check_llmd(values: dict[str, Any]) -> None:
    schema = _json("llm-d-modelservice-values.schema.json")
    validator = jsonschema.Draft7Validator(schema)
    assert not _errors(validator, values), _errors(validator, values)
    # the chart's own keys: every key path is one its values.yaml has (its schema lets a
    # pool's unknown keys through)
    for role in ("decode", "prefill"):
        for key in values[role]:
            assert f"{role}.{key}" in _values_keys(), f"{role}.{key}"
        for key in values[role].get("parallelism", {}):
            assert f"{role}.parallelism.{key}" in _values_keys(), key
        for c in values[role].get("containers", []):
            assert set(c) - CHART_CONTAINER_KEYS <= {k.split(".")[-1] for k in _values_keys()
                                                     if k.startswith(f"{role}.containers[].")} | {"command"}
            # what the chart passes on to the pod: a Kubernetes Container
            pod_container = {k: v for k, v in c.items() if k not in CHART_CONTAINER_KEYS}
            pod_container.update(c.get("extraConfig", {}))
            assert not _errors(_validator("Container"), pod_container), _errors(_validator("Container"),
                                                                                   pod_container)
        for volume in values[role].get("volumes", []):
            assert not _errors(_validator("Volume"), volume)
    for key in values["modelArtifacts"]:
        assert f"modelArtifacts.{key}" in _values_keys()


@pytest.mark.parametrize("shape", ["aggregated", "disaggregated", "multi-node", "multi-node pool"])
def test_llm_d_values_validate_against_the_charts_schema(shape: str) -> None:
    (values,) = _export(shape, "llm-d")
    _check_llmd(values)
    assert values["multinode"] == shape.startswith("multi-node")
    assert values["prefill"]["create"] == (shape in ("disaggregated", "multi-node pool"))
    assert values["routing"]["proxy"]["enabled"] == values["prefill"]["create"]


def test_llm_d_pools_leave_the_charts_own_flags_to_it_and_set_every_gpu() -> None:
    (values,) = _export("disaggregated", "llm-d")
    decode, prefill = values["decode"], values["prefill"]
    assert (decode["replicas"], decode["parallelism"]["tensor"]) == (1, 4)
    assert (prefill["replicas"], prefill["parallelism"]["tensor"]) == (2, 2)
    (c,) = decode["containers"]
    assert c["modelCommand"] == "vllmServe" and "--tensor-parallel-size" not in c["args"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert "--kv-transfer-config" in c["args"]
    assert c["extraConfig"]["readinessProbe"]["httpGet"]["port"] == 8200  # behind the routing sidecar
    assert "required" in values["modelArtifacts"]["uri"] and values["modelArtifacts"]["name"] == ""


def test_llm_d_multi_node_pool_picks_each_pods_role_from_its_worker_index() -> None:
    (values,) = _export("multi-node", "llm-d")
    (c,) = values["decode"]["containers"]
    assert c["modelCommand"] == "custom" and c["command"] == ["/bin/sh", "-c"]
    assert values["decode"]["parallelism"]["workers"] == 2
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2" in c["args"][0]
    assert '--nnodes 2 --master-addr "$LWS_LEADER_ADDRESS"' in c["args"][0] and "--headless" in c["args"][0]


# ----------------------------------------------------------------------- hook and hostile input


def test_autoscaling_hook_gives_no_objects_until_plans_hold_an_autoscale_block() -> None:
    from autoplan.export.kube import autoscaling_manifests

    assert autoscaling_manifests(_plan("aggregated")) == []


@pytest.mark.parametrize(("engine", "target", "field"), [
    ("sglang", "llm-d", "engine"), ("trtllm", "k8s", "deployment.disaggregated")])
def test_what_a_target_cannot_run_exits_2_naming_the_field_and_writes_nothing(
        tmp_path: Path, engine: str, target: str, field: str) -> None:
    cluster, deployment = DISAGGREGATED
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN.format(model="llama3.1-70b", cluster=cluster, engine=engine, deployment=deployment))
    out = tmp_path / "out"
    r = autoplan("export", plan, "--to", target, "--out", f"{out}/")
    assert r.returncode == 2 and f"{plan}: {field}" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_a_bad_plan_file_exits_2_naming_file_and_field(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN.format(model="llama3.1-70b", cluster=AGGREGATED[0], engine="vllm",
                                deployment="{replicas: 2, tp: four}"))
    for target in ("dynamo", "llm-d", "k8s"):
        r = autoplan("export", plan, "--to", target, "--out", tmp_path / "x.yaml")
        assert r.returncode == 2 and f"{plan}: deployment.tp" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and not (tmp_path / "x.yaml").exists()


def test_out_to_a_special_file_is_refused(tmp_path: Path) -> None:
    import socket

    plan = REPO / "examples" / "serving" / "chat-plan.yaml"
    sock = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        r = autoplan("export", plan, "--to", "k8s", "--out", sock)
    assert r.returncode == 2 and "cannot write" in r.stderr and "Traceback" not in r.stderr


def test_the_strict_validation_refuses_what_a_schema_does_not_name() -> None:
    """The checks above would catch a misspelt or misplaced field: each schema, closed."""
    import copy

    (dgd,) = _export("aggregated", "dynamo")
    bad = copy.deepcopy(dgd)
    bad["spec"]["services"]["worker"]["resources"]["limits"]["nvidia.com/gpu"] = "8"  # Dynamo's is `gpu`
    assert _errors(_validator("DynamoGraphDeployment"), bad)
    lws = next(d for d in _export("multi-node", "k8s") if d["kind"] == "LeaderWorkerSet")
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["gpus"] = 1
    assert _errors(_validator("LeaderWorkerSet"), bad)
    (values,) = _export("aggregated", "llm-d")
    bad = copy.deepcopy(values)
    bad["decode"]["parallelism"]["pipeline"] = 2
    with pytest.raises(AssertionError):
        _check_llmd(bad)


@pytest.mark.parametrize("target", ["k8s", "dynamo"])
def test_an_eagle_plan_names_its_head_from_the_configmap(target: str) -> None:
    from autoplan.descriptors.strict import read_yaml
    from autoplan.export.deploy import export_deployment
    from autoplan.serving.planfile import read_serving_plan

    path = REPO / "examples" / "serving" / "chat-eagle-plan.yaml"
    plan = read_serving_plan(read_yaml(path), str(path), correct=False)
    text = next(iter(export_deployment(plan, target, str(path)).values()))
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        _check(doc)
    assert '"model": "$(DRAFT_MODEL)"' in text and "key: DRAFT_MODEL" in text
    assert "--from-literal=DRAFT_MODEL=" in text  # the header says how to give it


def test_a_registered_engine_of_its_own_exports_where_its_file_says_enough(tmp_path: Path) -> None:
    """An engine registered in one file (tests/unit/test_engine_registry.py's toy: its cost
    spec and its launch spec) runs on plain Kubernetes with its image and flags; Dynamo and
    llm-d, which run named engines, refuse it naming the field, as k8s does the disaggregated
    launch it has no flags for."""
    from autoplan import caches
    from autoplan.errors import InputError
    from autoplan.export.deploy import export_deployment
    from autoplan.export.engines import LaunchSpec, register_launch, unregister_launch
    from autoplan.serving.engine import register, unregister
    from tests.unit.test_engine_registry import TOY, args

    engine = register(TOY)
    register_launch(LaunchSpec(engine=engine, command='toyserve "$MODEL"', args=args,
                               image="example.org/toyserve:{version}"))
    try:
        docs = [d for d in yaml.safe_load_all(export_deployment(_plan("aggregated", "toyserve"), "k8s",
                                                                "p.yaml")["k8s.yaml"]) if d]
        for doc in docs:
            _check(doc)
        (c,) = _containers(docs[0])
        assert _args(c).startswith("toyserve $(MODEL) --host 0.0.0.0 --port 8000 --tp 4 --max-seqs")
        for target, shape, field in (("dynamo", "aggregated", "engine"), ("llm-d", "aggregated", "engine"),
                                     ("k8s", "disaggregated", "deployment.disaggregated")):
            with pytest.raises(InputError, match=f"p.yaml: {field}"):
                export_deployment(_plan(shape, "toyserve"), target, "p.yaml")
    finally:
        caches.clear()
        unregister_launch(engine)
        unregister(engine)
