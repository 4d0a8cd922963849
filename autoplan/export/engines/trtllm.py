"""How TensorRT-LLM (``trtllm-serve``, the PyTorch backend) launches a serving plan: its flags
from tensorrt_llm/commands/common_llm_options.py, the LLM API options YAML beside the script,
what its launch cannot express, its image and pip pin. What a deployment costs on it:
:mod:`autoplan.serving.engines.trtllm`."""

from __future__ import annotations

import yaml

from autoplan.export.engines.launch import LaunchSpec, register_launch
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import Precision, ServingPlan, SpecMethod
from autoplan.serving.engines.trtllm import TRTLLM
from autoplan.shell import Arg, comment

EXTRA = "extra-llm-api-options.yaml"


def args(plan: ServingPlan, step: StepModel) -> list[Arg]:
    """Flags from tensorrt_llm/commands/common_llm_options.py: ``--tp_size``, ``--pp_size``,
    ``--ep_size``, ``--max_batch_size``, ``--max_num_tokens``, ``--max_seq_len``,
    ``--kv_cache_free_gpu_memory_fraction`` (and ``--extra_llm_api_options``:
    :func:`side_files`)."""
    d = plan.deployment
    out: list[Arg] = [("--backend", "pytorch"), ("--tp_size", str(d.tp * d.attention_dp)),
                      ("--pp_size", str(d.pp))]
    if d.ep > 1:
        out.append(("--ep_size", str(d.ep)))
    out += [("--max_batch_size", str(step.max_num_seqs)), ("--max_num_tokens", str(step.max_batched_tokens)),
            ("--max_seq_len", str(plan.max_model_len)),
            ("--kv_cache_free_gpu_memory_fraction", f"{step.memory_fraction:g}")]
    return out


def side_files(plan: ServingPlan, step: StepModel) -> dict[str, str]:
    """The LLM API options YAML: ``enable_chunked_prefill``, ``enable_attention_dp``,
    ``kv_cache_config.dtype`` and ``enable_block_reuse`` (a workload with a shared prefix;
    written through the YAML serializer, names as data)."""
    d = plan.deployment
    doc: dict[str, object] = {"enable_chunked_prefill": step.chunked_prefill}
    if d.attention_dp > 1:
        doc["enable_attention_dp"] = True
    kv: dict[str, object] = {}
    if d.kv_cache is Precision.FP8:
        kv["dtype"] = "fp8"
    if plan.workload.prefix is not None:  # block reuse: on by default, said as the prediction counts on it
        kv["enable_block_reuse"] = True
    if kv:
        doc["kv_cache_config"] = kv
    spec = d.speculative
    if spec is not None and spec.method is SpecMethod.MTP:  # the LLM API's MTPDecodingConfig
        doc["speculative_config"] = {"decoding_type": "MTP", "num_nextn_predict_layers": spec.tokens}
    elif spec is not None and spec.method is SpecMethod.NGRAM:  # NGramDecodingConfig
        doc["speculative_config"] = {"decoding_type": "NGram", "max_draft_len": spec.tokens}
    head = comment(f"LLM API options for {plan.model.name}, written by autoplan export")
    return {EXTRA: head + "\n" + yaml.safe_dump(doc, sort_keys=False)}


def refusals(plan: ServingPlan) -> list[tuple[str, str]]:
    d, c = plan.deployment, plan.cluster
    out: list[tuple[str, str]] = []
    if d.gpus_per_replica > c.gpus_per_node:
        out.append(("deployment", f"a replica of {d.gpus_per_replica} GPUs spans nodes of "
                                  f"{c.gpus_per_node}: TensorRT-LLM's multi-node launch (mpirun or "
                                  "Slurm with trtllm-llmapi-launch) is not written by autoplan"))
    if d.attention_dp > 1 and d.tp > 1:
        out.append(("deployment.attention_dp", "TensorRT-LLM's enable_attention_dp runs attention "
                                               "data parallel over the whole TP group: give tp 1 "
                                               "with attention_dp, not both above 1"))
    if d.speculative is not None and d.speculative.method in (SpecMethod.DRAFT, SpecMethod.EAGLE):
        out.append(("deployment.speculative", "TensorRT-LLM names the draft checkpoint inside its LLM API "
                                              "YAML (speculative_config.speculative_model_dir), a path "
                                              "the plan does not hold: write that config by hand, or "
                                              "give mtp or ngram"))
    if d.weights not in (Precision.BF16, Precision.FP16, Precision.FP8, Precision.FP4):
        out.append(("deployment.weights", f"{d.weights.value} weights: TensorRT-LLM's PyTorch "
                                          "backend loads fp8/fp4 (ModelOpt) or 16-bit checkpoints"))
    return out


def notes(plan: ServingPlan) -> list[str]:
    if plan.deployment.weights is Precision.FP8:
        return ["fp8 weights: MODEL must be an fp8 checkpoint (NVIDIA ModelOpt)"]
    return []


TRTLLM_LAUNCH = register_launch(LaunchSpec(
    engine=TRTLLM,
    # NVIDIA's release containers on NGC (tags <release>) and the wheel on PyPI
    image="nvcr.io/nvidia/tensorrt-llm/release:{version}", pip="pip install tensorrt_llm=={version}",
    command='trtllm-serve "$MODEL"', args=args, refusals=refusals, side_files=side_files,
    side_flag="--extra_llm_api_options", notes=notes, parser="tensorrt_llm.commands.serve"))
