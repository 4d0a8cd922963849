"""``export --to llm-d``: a serving plan as the values of llm-d's model service chart
(llm-d-incubation/llm-d-modelservice v0.4.12: ``helm install NAME llm-d-modelservice/
llm-d-modelservice -f llm-d-values.yaml --set modelArtifacts.name=<HuggingFace id>``).

llm-d serves with vLLM, so the plan must be a vLLM plan. The values, as the chart reads them
(its values.yaml, templates/_helpers.tpl):

- ``decode`` (an aggregated plan's replicas, or the decode pool) and ``prefill`` (the prefill
  pool; none when aggregated): ``replicas``, ``parallelism.tensor`` (and ``data``/``dataLocal``
  for attention data parallel), which the chart writes as ``--tensor-parallel-size`` and
  ``--data-parallel-size[-local]`` after ``vllm serve <model> --port`` (``modelCommand:
  vllmServe``); the container's ``args`` are the rest of the flags the launch scripts write;
  ``nvidia.com/gpu`` set to the instance's GPUs (the chart's own count, tensor x dataLocal,
  leaves out pipeline stages); readiness on vLLM's ``/health``.
- An instance across nodes: ``multinode: true`` makes every pool a LeaderWorkerSet of
  ``parallelism.workers`` pods (templates/decode-lws.yaml), one template for leader and
  workers, so the container runs a shell line that picks its role from ``LWS_WORKER_INDEX``
  (vLLM's multiprocessing backend across nodes, ``--headless`` past the first: as
  :mod:`autoplan.export.k8s` writes it).
- Disaggregated: the NIXL connector on both pools (``--kv-transfer-config``, the side channel
  on the pod's address), and the chart's routing sidecar on the decode pods
  (``routing.proxy``, connector nixlv2: it sends a request's prefill to the prefill pod the
  scheduler names, then decodes), vLLM behind it on ``routing.proxy.targetPort``.
- Routing through llm-d's inference scheduler (the endpoint picker, EPP): this chart labels
  the pods (``modelArtifacts.labels``, ``llm-d.ai/model: <name>``) and serves on
  ``routing.servicePort``; the Gateway API Inference Extension's ``inferencepool`` chart
  deploys the scheduler over the pods with those labels and that port (the chart's README,
  "Routing"), which the header names.
- The checkpoint: ``modelArtifacts.name``, a HuggingFace id the chart downloads into the pod's
  model cache (``size``: room for the 16-bit checkpoint); a descriptor names no checkpoint, so
  the values leave it empty and ``helm install`` refuses until ``--set`` gives it (the
  ``required`` in ``modelArtifacts.uri``, which the chart renders as a template).
"""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

from autoplan.export import kube
from autoplan.export.engines import launch
from autoplan.serving.deployment import ServingPlan
from autoplan.units import GiB

FILE = "llm-d-values.yaml"
CHART = "llm-d-modelservice v0.4.12"
PROXY_PORT = 8200  # routing.proxy.targetPort's default: vLLM's port behind the decode sidecar
MASTER_PORT = "29500"
# flags the chart writes itself from parallelism (vllmServe): left out of the container's args
CHART_FLAGS = {"--tensor-parallel-size", "--data-parallel-size"}
REQUIRED = ('hf://{{ required "set modelArtifacts.name to the checkpoint\'s HuggingFace id '
            '(helm install ... --set modelArtifacts.name=<id>)" .Values.modelArtifacts.name }}')


def export(plan: ServingPlan, source: str) -> dict[str, str]:
    problems = kube.refusals(plan, "llm-d", disaggregation=True, multi_node=True)
    if plan.engine.value != "vllm":
        problems.insert(0, ("engine", f"llm-d's model service runs vLLM (its routing sidecar's KV "
                                      f"connectors and its scheduler's metrics are vLLM's), not "
                                      f"{plan.engine.value}: predict the plan with --engine vllm"))
    kube.refuse(source, "llm-d", problems)
    disagg = plan.deployment.disaggregated is not None
    name = kube.base_name(plan)
    by_role = dict(kube.pools(plan))
    values: dict[str, Any] = {
        "multinode": any(kube.nodes_of(pool) > 1 for pool in by_role.values()),
        "modelArtifacts": {"name": "", "uri": REQUIRED, "size": _cache_size(plan),
                           "labels": {"llm-d.ai/inference-serving": "true", "llm-d.ai/model": name}},
        "routing": {"servicePort": kube.PORT, "proxy": {"enabled": disagg}},
        "decode": _pool(by_role["decode" if disagg else ""], "decode", disagg),
        "prefill": (_pool(by_role["prefill"], "prefill", disagg) if disagg
                    else {"create": False, "replicas": 0}),
    }
    head = _header(plan, name)
    if plan.autoscale is not None:  # the chart's pools take autoscaling: {enabled} and no more
        head.append(f"autoscale ({plan.autoscale.min_replicas} to {plan.autoscale.max_replicas} "
                    f"replicas): {CHART}'s values take no autoscaler's settings; apply the "
                    "HorizontalPodAutoscaler or KEDA ScaledObject `autoplan serve --traffic ... "
                    "--autoscale-out DIR` writes to the decode pool's Deployment")
    return {FILE: kube.dump([values], head)}


def _header(plan: ServingPlan, name: str) -> list[str]:
    return [kube.release_line(plan),
            f"Values of llm-d's model service chart ({CHART}), vLLM image "
            f"{launch(plan.engine).image_of(plan.engine_release)} (the release the plan was predicted for; "
            "llm-d's own ghcr.io/llm-d/llm-d-cuda carries its vLLM build)",
            f"helm install {name} llm-d-modelservice/llm-d-modelservice -f {FILE} "
            "--set modelArtifacts.name=<HuggingFace id of the checkpoint>",
            f"and, for a gated checkpoint first, kubectl create secret generic {kube.HF_SECRET} "
            "--from-literal=HF_TOKEN=<token>",
            "Routing through llm-d's inference scheduler: install the Gateway API Inference Extension's "
            f"inferencepool chart with inferencePool.modelServers.matchLabels llm-d.ai/model={name} and "
            f"target port {kube.PORT}"
            + (" (its prefill/decode profile sends each prompt to a prefill pod)"
               if plan.deployment.disaggregated is not None else "") + ".",
            *launch(plan.engine).notes(plan)]


def _cache_size(plan: ServingPlan) -> str:
    """Room for the checkpoint in the pod's model cache, at 16 bits a weight (an fp8 plan may
    quantize a 16-bit checkpoint as it loads), with a tenth to spare, in whole GiB."""
    d = plan.deployment
    if d.disaggregated is not None:
        plan = kube.pools(plan)[1][1]
    step = kube.step_of(plan)
    per_gpu = step.memory_weights() * 2.0 / min(plan.deployment.weights.bytes, 2.0)
    return f"{math.ceil(per_gpu * plan.deployment.gpus_per_replica * 1.1 / GiB)}Gi"


def _port(role: str, disagg: bool) -> int:
    """Where vLLM listens: behind the routing sidecar on a disaggregated decode pod
    (_helpers.tpl ``vllmPort``), else the service port."""
    return PROXY_PORT if disagg and role == "decode" else kube.PORT


def _pool(pool: ServingPlan, role: str, disagg: bool) -> dict[str, Any]:
    d = pool.deployment
    nodes = kube.nodes_of(pool)
    port = _port(role, disagg)
    args = [a for a in launch(pool.engine).args(pool, kube.step_of(pool))
            if not (nodes == 1 and a[0] in CHART_FLAGS)]
    flags = kube.flat(args) + kube.draft_args(pool)
    env: list[dict[str, Any]] = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": kube.HF_SECRET, "key": "HF_TOKEN",
                                                            "optional": True}}},
        *[{**e, "valueFrom": {"configMapKeyRef": {**e["valueFrom"]["configMapKeyRef"], "optional": True}}}
          for e in kube.draft_env(pool)]]
    ports = [{"containerPort": port, "protocol": "TCP"}]
    if disagg:
        flags += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})]
        env += [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                 "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "5600"}]
        ports.append({"containerPort": 5600, "protocol": "TCP"})
    gpus = str(kube.gpus_per_pod(pool))
    container: dict[str, Any] = {
        "name": "vllm", "image": launch(pool.engine).image_of(pool.engine_release),
        "env": env, "ports": ports, "mountModelVolume": True,
        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
    if nodes == 1:
        container.update(modelCommand="vllmServe", args=flags)
        container["extraConfig"] = {"readinessProbe": {"httpGet": {"path": kube.HEALTH, "port": port},
                                                       "periodSeconds": 10, "failureThreshold": 3}}
        parallelism = {"tensor": d.tp, "data": d.attention_dp, "dataLocal": d.attention_dp, "workers": 1}
    else:  # one template for every pod of the group: the role from LWS_WORKER_INDEX
        container.update(modelCommand="custom", command=["/bin/sh", "-c"],
                         args=[_multi_node_line(flags, nodes, port)])
        container["env"] = [{"name": "MODEL", "value": "{{ .Values.modelArtifacts.name }}"}, *env]
        parallelism = {"tensor": d.tp, "workers": nodes}
    return {"create": True, "replicas": d.replicas, "parallelism": parallelism, "containers": [container],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}


def _multi_node_line(flags: list[str], nodes: int, port: int) -> str:
    """``vllm serve`` across a group's nodes: rank 0 serves the API, the others run headless."""
    fixed = " ".join(shlex.quote(f) for f in flags)
    return ('if [ "${LWS_WORKER_INDEX:-0}" = 0 ]; then RANK="--node-rank 0"; '
            'else RANK="--node-rank $LWS_WORKER_INDEX --headless"; fi\n'
            f'exec vllm serve "$MODEL" --host 0.0.0.0 --port {port} {fixed} --nnodes {nodes} '
            f'--master-addr "$LWS_LEADER_ADDRESS" --master-port {MASTER_PORT} $RANK\n')
