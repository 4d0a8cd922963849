"""Launch scripts for serving plans: vLLM, SGLang and TensorRT-LLM.

One script per plan, run once per replica (``REPLICA=0 .. replicas-1``): a replica takes
its own GPUs of a node (``CUDA_VISIBLE_DEVICES``) and its own port, and a load balancer in
front spreads requests over them, as the simulation assumed. A replica larger than a node
takes whole nodes, and the script runs on each (``NODE=0 ..``, ``MASTER_ADDR`` the address
of the replica's first node, which serves the API; vLLM and SGLang only). ``MODEL`` is the checkpoint
(a path or a HuggingFace id) and must be set: a descriptor does not say where weights live.
Every value passes through :func:`autoplan.export.shell.quote`.

Flags, from each engine's own argument definitions:

- vLLM (``vllm serve``, vllm/engine/arg_utils.py): ``--tensor-parallel-size``,
  ``--pipeline-parallel-size``, ``--data-parallel-size`` with ``--enable-expert-parallel``
  (attention data parallel; experts over TP x DP), ``--max-num-seqs``,
  ``--max-num-batched-tokens``, ``--enable-chunked-prefill`` / ``--no-enable-chunked-prefill``,
  ``--gpu-memory-utilization``, ``--kv-cache-dtype fp8``, ``--quantization fp8``,
  ``--max-model-len``; across nodes ``--nnodes``, ``--node-rank``, ``--master-addr``,
  ``--master-port`` and ``--headless`` past the first node (0.33's multiprocessing backend).
- SGLang (``python -m sglang.launch_server``, sglang/srt/server_args.py): ``--tp-size``,
  ``--pp-size``, ``--attn-dp-size`` (attention data parallel within the TP group), ``--ep-size``,
  ``--max-running-requests``, ``--chunked-prefill-size`` (-1 turns it off),
  ``--mem-fraction-static``, ``--kv-cache-dtype fp8_e4m3``, ``--quantization fp8``,
  ``--context-length``; across nodes ``--nnodes``, ``--node-rank``, ``--dist-init-addr``.
- TensorRT-LLM (``trtllm-serve``, tensorrt_llm/commands/common_llm_options.py): ``--tp_size``,
  ``--pp_size``, ``--ep_size``, ``--max_batch_size``, ``--max_num_tokens``, ``--max_seq_len``,
  ``--kv_cache_free_gpu_memory_fraction``, ``--extra_llm_api_options`` (a YAML of LLM API
  fields: ``enable_attention_dp``, ``enable_chunked_prefill``, ``kv_cache_config.dtype``).

The values the engines default to differ between releases (trtllm-serve's max_batch_size and
max_num_tokens among them), so every limit the prediction used is written out.
"""

from __future__ import annotations

import enum
import math

import yaml

from autoplan.errors import InputError, Problem
from autoplan.export.shell import Arg, bash_array, comment, slug
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import Engine, Precision, ServingPlan

BASE_PORT = 8000


class ServingTarget(str, enum.Enum):
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


def refusals(plan: ServingPlan, target: ServingTarget) -> list[tuple[str, str]]:
    """(field, why) for what the target cannot run as the plan says."""
    d, c = plan.deployment, plan.cluster
    out: list[tuple[str, str]] = []
    if d.disaggregated is not None:
        out.append(("deployment.disaggregated", "prefill/decode disaggregated launches (a KV "
                                                "connector per engine and a router in front) are not "
                                                "written by autoplan yet"))
        return out
    if target.value != plan.engine.value:
        out.append(("engine", f"the plan was predicted for {plan.engine.value}, whose batching and "
                              f"memory differ from {target.value}'s: run `autoplan serve --engine "
                              f"{target.value}` for a {target.value} plan"))
    if d.gpus_per_replica > c.gpus_per_node:
        if target is ServingTarget.TRTLLM:
            out.append(("deployment", f"a replica of {d.gpus_per_replica} GPUs spans nodes of "
                                      f"{c.gpus_per_node}: TensorRT-LLM's multi-node launch (mpirun or "
                                      "Slurm with trtllm-llmapi-launch) is not written by autoplan"))
        elif d.gpus_per_replica % c.gpus_per_node:
            out.append(("deployment", f"a replica of {d.gpus_per_replica} GPUs spans nodes of "
                                      f"{c.gpus_per_node} without filling them: a multi-node replica "
                                      "takes whole nodes"))
    if target is ServingTarget.TRTLLM:
        if d.attention_dp > 1 and d.tp > 1:
            out.append(("deployment.attention_dp", "TensorRT-LLM's enable_attention_dp runs attention "
                                                   "data parallel over the whole TP group: give tp 1 "
                                                   "with attention_dp, not both above 1"))
        if d.weights not in (Precision.BF16, Precision.FP16, Precision.FP8, Precision.FP4):
            out.append(("deployment.weights", f"{d.weights.value} weights: TensorRT-LLM's PyTorch "
                                              "backend loads fp8/fp4 (ModelOpt) or 16-bit checkpoints"))
    if target is ServingTarget.VLLM and d.ep not in (1, d.tp * d.attention_dp):
        out.append(("deployment.ep", f"vLLM's --enable-expert-parallel spreads experts over all "
                                     f"tp x data-parallel ranks ({d.tp * d.attention_dp}), got ep {d.ep}"))
    return out


def export_serving(plan: ServingPlan, target: ServingTarget, source: str) -> dict[str, str]:
    """``{filename: text}`` for the target, or InputError with every refusal."""
    problems = refusals(plan, target)
    if problems:
        raise InputError([Problem(source, field, f"--to {target.value}: {why}") for field, why in problems])
    step = StepModel(plan.model, plan.cluster, plan.deployment, plan.engine)
    if target is ServingTarget.VLLM:
        return {"serve-vllm.sh": _script(plan, step, "vllm serve \"$MODEL\"", _vllm_args(plan, step), {})}
    if target is ServingTarget.SGLANG:
        launch = 'python -m sglang.launch_server --model-path "$MODEL"'
        return {"serve-sglang.sh": _script(plan, step, launch, _sglang_args(plan, step), {})}
    extra = _trtllm_extra(plan, step)
    return {"serve-trtllm.sh": _script(plan, step, "trtllm-serve \"$MODEL\"", _trtllm_args(plan, step),
                                       {"extra-llm-api-options.yaml": extra}),
            "extra-llm-api-options.yaml": extra}


def _max_len(plan: ServingPlan) -> int:
    w = plan.workload
    return min(plan.model.max_seq_len, math.ceil(w.input_len.ceiling + w.output_len.ceiling))


def _vllm_args(plan: ServingPlan, step: StepModel) -> list[Arg]:
    d = plan.deployment
    args: list[Arg] = [("--tensor-parallel-size", str(d.tp)), ("--pipeline-parallel-size", str(d.pp))]
    if d.attention_dp > 1:
        args.append(("--data-parallel-size", str(d.attention_dp)))
    if d.ep > 1:
        args.append(("--enable-expert-parallel",))
    args += [("--max-num-seqs", str(step.max_num_seqs)),
             ("--max-num-batched-tokens", str(step.max_batched_tokens)),
             ("--enable-chunked-prefill",) if step.chunked_prefill else ("--no-enable-chunked-prefill",),
             ("--gpu-memory-utilization", f"{step.defaults.memory_fraction:g}"),
             ("--max-model-len", str(_max_len(plan)))]
    if d.kv_cache is Precision.FP8:
        args.append(("--kv-cache-dtype", "fp8"))
    if d.weights is Precision.FP8:
        args.append(("--quantization", "fp8"))
    return args


def _sglang_args(plan: ServingPlan, step: StepModel) -> list[Arg]:
    d = plan.deployment
    args: list[Arg] = [("--tp-size", str(d.tp * d.attention_dp)), ("--pp-size", str(d.pp))]
    if d.attention_dp > 1:  # SGLang's DP attention splits its TP group into attention-DP ranks
        # (--attn-dp-size since 0.5.23, which deprecates --dp-size N --enable-dp-attention)
        args.append(("--attn-dp-size", str(d.attention_dp)))
    if d.ep > 1:
        args.append(("--ep-size", str(d.ep)))
    args += [("--max-running-requests", str(step.max_num_seqs)),
             ("--chunked-prefill-size", str(step.max_batched_tokens) if step.chunked_prefill else "-1"),
             ("--mem-fraction-static", f"{step.defaults.memory_fraction:g}"),
             ("--context-length", str(_max_len(plan)))]
    if d.kv_cache is Precision.FP8:
        args.append(("--kv-cache-dtype", "fp8_e4m3"))
    if d.weights is Precision.FP8:
        args.append(("--quantization", "fp8"))
    return args


def _trtllm_args(plan: ServingPlan, step: StepModel) -> list[Arg]:
    d = plan.deployment
    args: list[Arg] = [("--backend", "pytorch"), ("--tp_size", str(d.tp * d.attention_dp)),
                       ("--pp_size", str(d.pp))]
    if d.ep > 1:
        args.append(("--ep_size", str(d.ep)))
    args += [("--max_batch_size", str(step.max_num_seqs)), ("--max_num_tokens", str(step.max_batched_tokens)),
             ("--max_seq_len", str(_max_len(plan))),
             ("--kv_cache_free_gpu_memory_fraction", f"{step.defaults.memory_fraction:g}")]
    return args


def _trtllm_extra(plan: ServingPlan, step: StepModel) -> str:
    d = plan.deployment
    doc: dict[str, object] = {"enable_chunked_prefill": step.chunked_prefill}
    if d.attention_dp > 1:
        doc["enable_attention_dp"] = True
    if d.kv_cache is Precision.FP8:
        doc["kv_cache_config"] = {"dtype": "fp8"}
    head = comment(f"LLM API options for {plan.model.name}, written by autoplan export")
    return head + "\n" + yaml.safe_dump(doc, sort_keys=False)


def nodes_per_replica(plan: ServingPlan) -> int:
    """Nodes one replica spans: 1, or whole nodes (``refusals`` turns down the rest)."""
    return max(1, plan.deployment.gpus_per_replica // plan.cluster.gpus_per_node)


def _multi_node_args(plan: ServingPlan) -> list[str]:
    """Shell lines adding a multi-node replica's launch flags to ARGS (they read the node's
    NODE, MASTER_ADDR and DIST_PORT, so they are expansions, not quoted words):
    vLLM's multiprocessing backend across nodes (``--nnodes``, ``--node-rank``,
    ``--master-addr``, ``--master-port``; the nodes after the first run ``--headless``, no
    API server), SGLang's ``--nnodes``, ``--node-rank`` and ``--dist-init-addr``."""
    nodes = nodes_per_replica(plan)
    if plan.engine is Engine.VLLM:
        return [f'ARGS+=(--nnodes {nodes} --node-rank "$NODE" --master-addr "$MASTER_ADDR" '
                '--master-port "$DIST_PORT")',
                'if (( NODE > 0 )); then ARGS+=(--headless); fi']
    return [f'ARGS+=(--nnodes {nodes} --node-rank "$NODE" --dist-init-addr "$MASTER_ADDR:$DIST_PORT")']


def _script(plan: ServingPlan, step: StepModel, command: str, args: list[Arg],
            side_files: dict[str, str]) -> str:
    d, c = plan.deployment, plan.cluster
    per, nodes = d.gpus_per_replica, nodes_per_replica(plan)
    lines = [
        "#!/usr/bin/env bash",
        comment(f"{plan.model.name} on {d.gpus} x {c.device.name}: {d.label()}, weights {d.weights.value}, "
                f"KV cache {d.kv_cache.value} ({plan.engine.value}; written by autoplan export)"),
    ]
    if nodes == 1:
        lines.append(comment(f"Run once per replica: REPLICA=0 .. {d.replicas - 1}, {per} GPUs each, on "
                             f"the node that holds them; replica r listens on port {BASE_PORT} + r."))
    else:
        lines.append(comment(f"Run on each of a replica's {nodes} nodes: REPLICA=0 .. {d.replicas - 1}, "
                             f"NODE=0 .. {nodes - 1}, MASTER_ADDR the address of the replica's NODE 0, "
                             f"which listens on port {BASE_PORT} + r; all {c.gpus_per_node} GPUs of "
                             "each node."))
    lines += [
        "set -euo pipefail",
        ': "${MODEL:?set MODEL to the checkpoint (path or HuggingFace id) of '
        + slug(plan.model.name) + '}"',
        'REPLICA="${REPLICA:-0}"',
        f"if (( REPLICA < 0 || REPLICA >= {d.replicas} )); then",
        f'  echo "REPLICA must be 0..{d.replicas - 1}" >&2; exit 2',
        "fi",
        f"PER_NODE={c.gpus_per_node}",
    ]
    if nodes == 1:
        lines += [f"FIRST=$(( (REPLICA * {per}) % PER_NODE ))",
                  f'export CUDA_VISIBLE_DEVICES="$(seq -s, "$FIRST" "$(( FIRST + {per} - 1 ))")"']
    else:
        lines += ['NODE="${NODE:-0}"',
                  f"if (( NODE < 0 || NODE >= {nodes} )); then",
                  f'  echo "NODE must be 0..{nodes - 1}" >&2; exit 2',
                  "fi",
                  ': "${MASTER_ADDR:?set MASTER_ADDR to the address of NODE 0 of this replica}"',
                  'DIST_PORT="${DIST_PORT:-$(( 29500 + REPLICA ))}"',
                  'export CUDA_VISIBLE_DEVICES="$(seq -s, 0 "$(( PER_NODE - 1 ))")"']
    lines.append(f"PORT=$(( {BASE_PORT} + REPLICA ))")
    if d.weights in (Precision.INT8, Precision.INT4, Precision.FP4):
        lines.append(comment(f"{d.weights.value} weights: MODEL must be a checkpoint quantized to "
                             f"{d.weights.value} (the engine reads its format from the checkpoint)"))
    if d.weights is Precision.FP8 and plan.engine is Engine.TRTLLM:
        lines.append(comment("fp8 weights: MODEL must be an fp8 checkpoint (NVIDIA ModelOpt)"))
    lines.append(bash_array("ARGS", args))
    if nodes > 1:
        lines += _multi_node_args(plan)
    extra = ""
    for name in side_files:
        extra = f' --extra_llm_api_options "$(dirname "$0")/{name}"'
    lines.append(f'exec {command} --host 0.0.0.0 --port "$PORT" "${{ARGS[@]}}"{extra}')
    return "\n".join(lines) + "\n"
