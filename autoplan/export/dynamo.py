"""``export --to dynamo``: a serving plan as NVIDIA Dynamo's ``DynamoGraphDeployment``
(apiVersion nvidia.com/v1alpha1), for Dynamo 1.1.0's operator (``kubectl apply -f dynamo.yaml``).

Its structure is that of Dynamo's own examples (ai-dynamo/dynamo examples/backends/{vllm,
sglang,trtllm}/deploy/{agg,disagg,disagg-multinode}.yaml at the 1.1.0 branch point): a
``Frontend`` service (``python3 -m dynamo.frontend``, the OpenAI API on port 8000, which routes
each request to a worker and, disaggregated, through a prefill worker to a decode worker),
and the workers, ``componentType: worker``: one service ``worker`` for an aggregated plan, or
``prefill`` and ``decode`` (``subComponentType``) with their replicas. Each worker runs
Dynamo's wrapper of the engine (``python3 -m dynamo.vllm``, ``dynamo.sglang``, ``dynamo.trtllm``)
in Dynamo's runtime image of the release, ``resources.limits.gpu`` GPUs a pod, and where an
instance spans nodes ``multinode.nodeCount`` pods of a node's GPUs each: Dynamo's operator
then adds the engine's own multi-node launch (deploy/operator/internal/dynamo/backend_vllm.go:
vLLM's ``--nnodes``/``--node-rank``/``--master-addr``, or Ray; backend_sglang.go: SGLang's
``--dist-init-addr``/``--nnodes``/``--node-rank``).

The engine's flags: vLLM's and SGLang's are the engine's own arguments (Dynamo's wrappers
parse them with the engine's parser), the same the launch scripts write; SGLang's workers
also take ``--skip-tokenizer-init`` (Dynamo's frontend tokenizes; every SGLang example).
``dynamo.trtllm`` has arguments of its own (components/src/dynamo/trtllm/backend_args.py):
the widths and limits under their names there, and the LLM API options the launch scripts'
YAML holds as ``--override-engine-args`` JSON, applied over the worker's own settings
(workers/llm_worker.py, ``deep_update``: so a ``kv_cache_config`` there carries the memory
fraction too). KV transfer, disaggregated: vLLM's NIXL connector (``--disaggregation-mode``,
``--kv-transfer-config``, which dynamo.vllm requires of a prefill worker: components/src/dynamo/
vllm/args.py), SGLang's ``--disaggregation-mode`` over NIXL with a bootstrap port, TensorRT-LLM's
``--disaggregation-mode`` with ``cache_transceiver_config`` (and no overlap scheduler on prefill
workers, as Dynamo's engine_configs/*/prefill.yaml say).

The runtime images carry Dynamo's engine builds: 1.1.0's hold vLLM 0.19.0, SGLang 0.5.10.post1
and TensorRT-LLM 1.3.0rc11 (Dynamo's support matrix, :data:`autoplan.serving.versions.DYNAMO`);
the manifest says so where the plan was predicted for another release.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from autoplan.export import kube
from autoplan.export.engines import launch
from autoplan.serving.deployment import ServingPlan
from autoplan.serving.versions import dynamo_engine_version, parse_version

FILE = "dynamo.yaml"
RELEASE = "1.1.0"  # the Dynamo release written for (its CRD: tests/data/schemas/README.md)
IMAGE = {"vllm": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:{release}",
         "sglang": "nvcr.io/nvidia/ai-dynamo/sglang-runtime:{release}",
         "trtllm": "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{release}"}
# the worker's module and the flag naming the checkpoint (dynamo.vllm: vLLM's own --model;
# dynamo.sglang: SGLang's --model-path; dynamo.trtllm: --model, backend_args.py)
WORKER = {"vllm": ("dynamo.vllm", "--model"), "sglang": ("dynamo.sglang", "--model-path"),
          "trtllm": ("dynamo.trtllm", "--model")}
SGLANG_BOOTSTRAP_PORT = "12345"  # examples/backends/sglang/deploy/disagg.yaml
# trtllm-serve's flags (the launch scripts') under dynamo.trtllm's names (backend_args.py);
# --backend is not one: dynamo.trtllm runs the PyTorch backend (llm_worker.py Backend.PYTORCH)
TRTLLM_FLAGS = {"--tp_size": "--tensor-parallel-size", "--pp_size": "--pipeline-parallel-size",
                "--ep_size": "--expert-parallel-size", "--max_batch_size": "--max-batch-size",
                "--max_num_tokens": "--max-num-tokens", "--max_seq_len": "--max-seq-len",
                "--kv_cache_free_gpu_memory_fraction": "--free-gpu-memory-fraction"}
DROPPED = {"--backend"}


def export(plan: ServingPlan, source: str) -> dict[str, str]:
    problems = kube.refusals(plan, "dynamo", disaggregation=True, multi_node=True)
    if plan.engine.value not in WORKER:
        problems.insert(0, ("engine", f"Dynamo's workers run {', '.join(WORKER)}, not {plan.engine.value}"))
    kube.refuse(source, "dynamo", problems)
    engine = plan.engine.value
    image = IMAGE[engine].format(release=RELEASE)
    services: dict[str, Any] = {"Frontend": {
        "componentType": "frontend", "replicas": 1,
        "extraPodSpec": {"mainContainer": {"image": image, "command": ["python3", "-m", "dynamo.frontend"],
                                           "args": ["--http-port", str(kube.PORT)]}}}}
    for role, pool in kube.pools(plan):
        services[role or "worker"] = _worker(pool, role, image)
    envs = [kube.model_env(plan), *kube.draft_env(plan),
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": kube.HF_SECRET, "key": "HF_TOKEN",
                                                                "optional": True}}}]
    doc = {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
           "metadata": {"name": kube.base_name(plan)},
           "spec": {"backendFramework": engine, "envs": envs, "services": services}}
    return {FILE: kube.dump([doc, *kube.autoscaling_manifests(plan, "dynamo")], _header(plan, image))}


def _header(plan: ServingPlan, image: str) -> list[str]:
    engine = plan.engine.value
    held = dynamo_engine_version(engine, RELEASE)
    lines = [kube.release_line(plan),
             f"NVIDIA Dynamo {RELEASE} (DynamoGraphDeployment nvidia.com/v1alpha1): image {image}, which "
             f"holds {engine} {held} (Dynamo's support matrix)"]
    if held is not None and parse_version(held) != parse_version(plan.engine_release):
        lines.append(f"The plan was predicted for {engine} {plan.engine_release}: predict it with "
                     f"--engine-version {held} to match the image, or give an image with that release.")
    lines += kube.setup_lines(plan, FILE)
    lines.append(f"then kubectl apply -f {FILE} (Dynamo's operator installed); the Frontend serves the "
                 f"OpenAI API on port {kube.PORT}.")
    return lines + launch(plan.engine).notes(plan)


def _worker(pool: ServingPlan, role: str, image: str) -> dict[str, Any]:
    engine = pool.engine.value
    module, model_flag = WORKER[engine]
    out: dict[str, Any] = {"componentType": "worker"}
    if role:
        out["subComponentType"] = role
    out["replicas"] = pool.deployment.replicas
    out["resources"] = {"limits": {"gpu": str(kube.gpus_per_pod(pool))}}
    if kube.nodes_of(pool) > 1:
        out["multinode"] = {"nodeCount": kube.nodes_of(pool)}
    out["extraPodSpec"] = {"mainContainer": {
        "image": image, "command": ["python3", "-m", module],
        "args": [model_flag, "$(MODEL)", *_engine_args(pool, role)]}}
    return out


def _engine_args(pool: ServingPlan, role: str) -> list[str]:
    engine = pool.engine.value
    if engine == "trtllm":
        return _trtllm_args(pool, role)
    out = kube.flat(launch(pool.engine).args(pool, kube.step_of(pool))) + kube.draft_args(pool)
    if engine == "sglang":
        out.append("--skip-tokenizer-init")
    if role and engine == "vllm":
        out += ["--disaggregation-mode", role,
                "--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})]
    elif role:
        out += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl",
                "--disaggregation-bootstrap-port", SGLANG_BOOTSTRAP_PORT, "--host", "0.0.0.0"]
    return out


def _trtllm_args(pool: ServingPlan, role: str) -> list[str]:
    """dynamo.trtllm's flags for what trtllm-serve's say, and the LLM API options as JSON."""
    spec = launch(pool.engine)
    step = kube.step_of(pool)
    out: list[str] = []
    fraction = None
    for flag, *values in spec.args(pool, step):
        if flag in DROPPED:
            continue
        out += [TRTLLM_FLAGS[flag], *values]
        if flag == "--kv_cache_free_gpu_memory_fraction":
            fraction = float(values[0])
    options: dict[str, Any] = {}
    for text in spec.side_files(pool, step).values():
        options.update(yaml.safe_load(text) or {})
    if "kv_cache_config" in options and fraction is not None:  # replaces the worker's own KvCacheConfig
        options["kv_cache_config"] = {"free_gpu_memory_fraction": fraction, **options["kv_cache_config"]}
    if role:
        options["cache_transceiver_config"] = {"backend": "DEFAULT"}
        if role == "prefill":
            options["disable_overlap_scheduler"] = True
        out += ["--disaggregation-mode", role]
    if options:
        out += ["--override-engine-args", json.dumps(options)]
    return out
