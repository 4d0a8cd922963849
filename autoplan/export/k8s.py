"""``export --to k8s``: a serving plan as plain Kubernetes manifests, one YAML stream
(``kubectl apply -f k8s.yaml``).

- An instance within a node is a Deployment's pod: its GPUs (``nvidia.com/gpu``, the NVIDIA
  device plugin's resource), the engine's command with every flag the launch script writes
  (:mod:`autoplan.export.serving`), ``/dev/shm`` in memory (the engines' tensor-parallel
  workers share it), and readiness on the engine's health endpoint: ``GET /health``, which
  vLLM (vllm/entrypoints/openai/api_server.py), SGLang (sglang/srt/entrypoints/http_server.py)
  and trtllm-serve (tensorrt_llm/serve/openai_server.py) answer once the model is loaded.
- An instance across nodes (multi-node TP x PP) is a LeaderWorkerSet group
  (leaderworkerset.x-k8s.io/v1, kubernetes-sigs/lws): ``size`` pods of a node's GPUs each; the
  leader serves the API and the workers join it through the variables LWS sets in every pod
  (``LWS_LEADER_ADDRESS``, ``LWS_WORKER_INDEX``: lws api/leaderworkerset/v1/
  leaderworkerset_types.go). vLLM runs its multiprocessing backend across nodes without Ray
  (``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``, and ``--headless`` on
  the workers: vllm/engine/arg_utils.py, as the launch scripts run it); SGLang ``--nnodes``,
  ``--node-rank`` and ``--dist-init-addr`` (sglang/srt/server_args.py; LWS's own SGLang
  example, docs/examples/sglang/lws.yaml). A group's pods restart together
  (``RecreateGroupOnPodRestart``): one lost rank stalls the rest.
- A Service in front (``<name>``, port 8000) spreads requests over the replicas, as the
  prediction's round-robin router did.
- A disaggregated plan: every prefill and decode instance its own Deployment and Service
  (the router lists each by address, as the launch scripts' router does), or a pool's
  LeaderWorkerSet where its instances span nodes (leader ``r`` at
  ``<lws>-<r>.<lws>``: LWS's headless Service carries the set's name,
  pkg/controllers/leaderworkerset_controller.go), with the engine's KV connector; and the
  engine's own router (vllm-router ``--vllm-pd-disaggregation``, ``sglang_router.launch_router
  --pd-disaggregation``) as a Deployment behind the Service ``<name>``.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from autoplan.export import kube
from autoplan.export.engines import launch, launch_of
from autoplan.serving.deployment import Precision, ServingPlan

FILE = "k8s.yaml"
MASTER_PORT = "29500"  # vLLM's --master-port across nodes (torch's default rendezvous port)
DIST_PORT = "20000"  # SGLang's --dist-init-addr port (LWS's SGLang example)
NIXL_PORT = "5600"  # VLLM_NIXL_SIDE_CHANNEL_PORT's default (vllm/envs.py)
CONFIG_DIR = "/etc/autoplan"  # where TensorRT-LLM's LLM API options are mounted


# the engines whose flags for a pool's role and for a group's ranks are written here
# (another registered engine's are refused, naming the field)
WRITTEN = ("vllm", "sglang")


def export(plan: ServingPlan, source: str) -> dict[str, str]:
    spec = launch_of(plan.engine)  # None: kube.refusals refuses the engine
    known = plan.engine.value in WRITTEN
    problems = kube.refusals(
        plan, "k8s", disaggregation=known and spec is not None and spec.disaggregation is not None,
        multi_node=known and spec is not None and spec.multi_node is not None)
    if spec is not None and not spec.image_of(plan.engine_release):
        problems.insert(0, ("engine", f"{plan.engine.value} names no container image (its engine file's "
                                      "image) for the pods to run"))
    kube.refuse(source, "k8s", problems)
    name = kube.base_name(plan)
    docs: list[dict[str, Any]] = []
    urls: dict[str, list[str]] = {"prefill": [], "decode": []}
    for role, pool in kube.pools(plan):
        docs += _config(pool, role)
        if not role:  # aggregated: one workload behind the Service
            # a LeaderWorkerSet's own headless Service takes its name: the set is <name>-group
            workload = f"{name}-group" if kube.nodes_of(pool) > 1 else name
            docs += _workload(pool, workload, role, pool.deployment.replicas)
            docs.append(_service(name, {"app.kubernetes.io/name": workload, **_leader(pool)}))
        elif kube.nodes_of(pool) > 1:  # a pool of multi-node instances: one set, a leader per group
            lws = f"{name}-{role}"
            docs += _workload(pool, lws, role, pool.deployment.replicas)
            urls[role] += [f"http://{lws}-{r}.{lws}:{kube.PORT}" for r in range(pool.deployment.replicas)]
        else:  # every instance addressable: a Deployment and a Service each
            for r in range(pool.deployment.replicas):
                one = f"{name}-{role}-{r}"
                docs += _workload(pool, one, role, 1)
                docs.append(_service(one, {"app.kubernetes.io/name": one}))
                urls[role].append(f"http://{one}:{kube.PORT}")
    if plan.deployment.disaggregated is not None:
        docs += _router(plan, name, urls)
    else:  # the replicas' workload scales (serve --traffic's autoscale block)
        workload = f"{name}-group" if kube.nodes_of(plan) > 1 else name
        docs += kube.autoscaling_manifests(plan, "k8s", workload)
    return {FILE: kube.dump(docs, _header(plan, name))}


def _header(plan: ServingPlan, name: str) -> list[str]:
    spec = launch(plan.engine)
    lines = [kube.release_line(plan),
             f"image {spec.image_of(plan.engine_release)} (the release the plan was predicted for)",
             *kube.setup_lines(plan, FILE),
             f"then kubectl apply -f {FILE}; the Service {name} (port {kube.PORT}) serves the OpenAI API."]
    if plan.deployment.disaggregated is not None and plan.engine.value == "vllm":
        lines.append("The router runs vllm-router (pip install vllm-router), which its image must carry: "
                     "the manifest names the vLLM image; where it lacks the router, give one with it.")
    if any(kube.nodes_of(pool) > 1 for _, pool in kube.pools(plan)):
        lines.append("Instances across nodes run as LeaderWorkerSets: install LWS "
                     "(kubernetes-sigs/lws) in the cluster first.")
    if plan.deployment.weights in (Precision.INT8, Precision.INT4, Precision.FP4):
        w = plan.deployment.weights.value
        lines.append(f"{w} weights: MODEL must be a checkpoint quantized to {w}.")
    return lines + spec.notes(plan)


def _labels(name: str, role: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/component": role or "engine",
            "app.kubernetes.io/managed-by": "autoplan"}


def _leader(pool: ServingPlan) -> dict[str, str]:
    """The label a Service selects a multi-node group's leader by (LWS's own examples')."""
    return {"role": "leader"} if kube.nodes_of(pool) > 1 else {}


def _config(pool: ServingPlan, role: str) -> list[dict[str, Any]]:
    """A ConfigMap of the engine's side files (TensorRT-LLM's LLM API options), if any."""
    files = launch(pool.engine).side_files(pool, kube.step_of(pool))
    if not files:
        return []
    return [{"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": _config_name(pool, role), "labels": _labels(kube.base_name(pool), role)},
             "data": files}]


def _config_name(pool: ServingPlan, role: str) -> str:
    return f"{kube.base_name(pool)}{'-' + role if role else ''}-config"


def _container(pool: ServingPlan, role: str, node: str) -> dict[str, Any]:
    """The engine's container; ``node``: "" (an instance in one pod), "leader" or "worker"."""
    spec = launch(pool.engine)
    step = kube.step_of(pool)
    command = [w.replace("$MODEL", "$(MODEL)") for w in shlex.split(spec.command)]
    args = ["--host", "0.0.0.0", "--port", str(kube.PORT), *kube.flat(spec.args(pool, step)),
            *kube.draft_args(pool)]
    env: list[dict[str, Any]] = [kube.model_env(pool), *kube.draft_env(pool)]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if role:
        args += _role_args(pool, role)
        env += _role_env(pool)
    if node:
        args += _multi_node_args(pool, node)
    for file in spec.side_files(pool, step):  # beside the flags, as the launch script names it
        args += [spec.side_flag, f"{CONFIG_DIR}/{file}"]
        mounts.append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
    gpus = str(kube.gpus_per_pod(pool))
    out: dict[str, Any] = {
        "name": "engine", "image": spec.image_of(pool.engine_release), "command": command, "args": args,
        "env": env, "envFrom": [{"secretRef": {"name": kube.HF_SECRET, "optional": True}}],
        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
        "volumeMounts": list({m["name"]: m for m in mounts}.values())}
    if node != "worker":  # the pod that serves the API
        out["ports"] = [{"name": "http", "containerPort": kube.PORT}]
        out["readinessProbe"] = {"httpGet": {"path": kube.HEALTH, "port": kube.PORT},
                                 "periodSeconds": 10, "failureThreshold": 3}
    return out


def _role_args(pool: ServingPlan, role: str) -> list[str]:
    """The engine's flags for a pool of a disaggregated deployment (its file's ``role_lines``
    write the same): vLLM's NIXL connector (``--kv-transfer-config``, kv_role kv_both: vLLM's
    "NixlConnector Usage Guide"); SGLang's ``--disaggregation-mode`` over NIXL, each prefill pod
    on the default bootstrap port (sglang/srt/server_args.py)."""
    if pool.engine.value == "vllm":
        return ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})]
    return ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl"]


def _role_env(pool: ServingPlan) -> list[dict[str, Any]]:
    """vLLM's NIXL side channel on the pod's own address (vllm/envs.py
    VLLM_NIXL_SIDE_CHANNEL_HOST, VLLM_NIXL_SIDE_CHANNEL_PORT)."""
    if pool.engine.value != "vllm":
        return []
    return [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": NIXL_PORT}]


def _multi_node_args(pool: ServingPlan, node: str) -> list[str]:
    """A group's ranks across its nodes (module doc)."""
    nodes = str(kube.nodes_of(pool))
    if pool.engine.value == "vllm":
        rank = (["--node-rank", "0"] if node == "leader"
                else ["--node-rank", "$(LWS_WORKER_INDEX)", "--headless"])
        return ["--nnodes", nodes, "--master-addr", "$(LWS_LEADER_ADDRESS)", "--master-port", MASTER_PORT,
                *rank]
    return ["--nnodes", nodes, "--node-rank", "$(LWS_WORKER_INDEX)",
            "--dist-init-addr", f"$(LWS_LEADER_ADDRESS):{DIST_PORT}"]


def _pod(pool: ServingPlan, role: str, node: str) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if launch(pool.engine).side_files(pool, kube.step_of(pool)):
        volumes.append({"name": "config", "configMap": {"name": _config_name(pool, role)}})
    return {"containers": [_container(pool, role, node)], "volumes": volumes}


def _workload(pool: ServingPlan, name: str, role: str, replicas: int) -> list[dict[str, Any]]:
    """A Deployment of ``replicas`` one-pod instances, or a LeaderWorkerSet of ``replicas``
    groups where an instance spans nodes."""
    labels = _labels(name, role)
    nodes = kube.nodes_of(pool)
    if nodes == 1:
        return [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
                 "spec": {"replicas": replicas, "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                          "template": {"metadata": {"labels": labels}, "spec": _pod(pool, role, "")}}}]
    return [{"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
             "metadata": {"name": name, "labels": labels},
             "spec": {"replicas": replicas, "leaderWorkerTemplate": {
                 "size": nodes, "restartPolicy": "RecreateGroupOnPodRestart",
                 "leaderTemplate": {"metadata": {"labels": {**labels, "role": "leader"}},
                                    "spec": _pod(pool, role, "leader")},
                 "workerTemplate": {"metadata": {"labels": {**labels, "role": "worker"}},
                                    "spec": _pod(pool, role, "worker")}}}}]


def _service(name: str, selector: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "autoplan"}},
            "spec": {"selector": selector,
                     "ports": [{"name": "http", "port": kube.PORT, "targetPort": kube.PORT}]}}


def _router(plan: ServingPlan, name: str, urls: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The engine's router as the launch scripts run it (its launch file's ``DISAGGREGATION``):
    every prefill instance (with its bootstrap port, SGLang) and decode instance by address."""
    dis = launch(plan.engine).disaggregation
    assert dis is not None  # refusals turn down an engine without one
    args = [*dis.router_flags, "--host", "0.0.0.0", "--port", str(kube.PORT)]
    for url in urls["prefill"]:
        args += ["--prefill", url] + ([str(dis.bootstrap_port(0))] if dis.bootstrap_port is not None else [])
    for url in urls["decode"]:
        args += ["--decode", url]
    router = f"{name}-router"
    labels = _labels(router, "router")
    container = {"name": "router", "image": launch(plan.engine).image_of(plan.engine_release),
                 "command": shlex.split(dis.router), "args": args,
                 "ports": [{"name": "http", "containerPort": kube.PORT}]}
    return [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": router, "labels": labels},
             "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": router}},
                      "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}}},
            _service(name, {"app.kubernetes.io/name": router})]
