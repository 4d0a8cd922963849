"""How vLLM (``vllm serve``) launches a serving plan: its flags from vllm/engine/arg_utils.py,
a draft checkpoint's ``--speculative-config``, the NIXL connector and ``vllm-router`` of a
prefill/decode disaggregated deployment, 0.33's multi-node flags, its image and pip pin.
What a deployment costs on it: :mod:`autoplan.serving.engines.vllm`."""

from __future__ import annotations

import json

from autoplan.descriptors.model import GDN
from autoplan.export.engines.launch import Disaggregation, LaunchSpec, register_launch
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import Precision, ServingPlan, SpecMethod
from autoplan.serving.engine import StateReuse, uses_recurrent
from autoplan.serving.engines.vllm import ALIGN_SINCE, FIRST_RELEASE, VLLM
from autoplan.serving.versions import parse_version
from autoplan.shell import Arg, quote


def args(plan: ServingPlan, step: StepModel) -> list[Arg]:
    """Flags from vllm/engine/arg_utils.py: ``--tensor-parallel-size``,
    ``--pipeline-parallel-size``, ``--data-parallel-size`` with ``--enable-expert-parallel``
    (attention data parallel; experts over TP x DP), ``--max-num-seqs``,
    ``--max-num-batched-tokens``, ``--enable-chunked-prefill`` / ``--no-enable-chunked-prefill``,
    ``--gpu-memory-utilization``, ``--kv-cache-dtype fp8``, ``--quantization fp8``,
    ``--max-model-len``, ``--enable-prefix-caching`` (a workload with a shared prefix),
    ``--speculative-config`` (n-gram and MTP proposals here; a checkpoint's in
    :func:`launch_lines`)."""
    d = plan.deployment
    out: list[Arg] = [("--tensor-parallel-size", str(d.tp)), ("--pipeline-parallel-size", str(d.pp))]
    if d.attention_dp > 1:
        out.append(("--data-parallel-size", str(d.attention_dp)))
    if d.ep > 1:
        out.append(("--enable-expert-parallel",))
    out += [("--max-num-seqs", str(step.max_num_seqs)),
            ("--max-num-batched-tokens", str(step.max_batched_tokens)),
            ("--enable-chunked-prefill",) if step.chunked_prefill else ("--no-enable-chunked-prefill",),
            ("--gpu-memory-utilization", f"{step.memory_fraction:g}"),
            ("--max-model-len", str(plan.max_model_len))]
    v4 = plan.model.is_v4_attention
    if d.kv_cache is Precision.FP8:
        # DeepSeek-V4's cache in its own fp8 layout (LMCache's DeepSeek-V4-Flash recipe, after
        # vLLM's: "--kv-cache-dtype fp8_ds_mla and --tokenizer-mode deepseek_v4 are required")
        out.append(("--kv-cache-dtype", "fp8_ds_mla" if v4 else "fp8"))
    if v4:
        out.append(("--tokenizer-mode", "deepseek_v4"))
    if d.weights is Precision.FP8:
        out.append(("--quantization", "fp8"))
    if plan.workload.prefix is not None:  # on by default in V1; said, as the prediction counts on it
        out.append(("--enable-prefix-caching",))
        if uses_recurrent(plan.model) and parse_version(plan.engine_release) >= ALIGN_SINCE:
            # what the prediction reused of the recurrent states (hybrid_cache)
            mode = "all" if step.hybrid_cache.reuse is StateReuse.BLOCKS else "align"
            out.append(("--mamba-cache-mode", mode))
    if uses_recurrent(plan.model) and parse_version(plan.engine_release) >= FIRST_RELEASE[GDN]:
        # the states in fp32, as predicted (serving.kinds.STATE_BYTES; vllm/config/cache.py
        # mamba_ssm_cache_dtype, "auto" the model's dtype; vllm/engine/arg_utils.py's cache
        # group). Taken to exist from the release that runs Qwen3-Next (not pinned further):
        # an older release keeps them in the model's dtype, half what is predicted
        out.append(("--mamba-ssm-cache-dtype", "float32"))
    if plan.workload.images_per_request:  # vllm/config/multimodal.py limit_per_prompt
        out.append(("--limit-mm-per-prompt", json.dumps({"image": plan.workload.images_per_request})))
    spec = d.speculative
    if spec is not None and spec.method in (SpecMethod.NGRAM, SpecMethod.MTP):  # no checkpoint of its own
        out.append(("--speculative-config", json.dumps({"method": SPEC_METHOD[spec.method],
                                                        "num_speculative_tokens": spec.tokens})))
    return out


# vllm/config/speculative.py's SpeculativeMethod for each proposer (EAGLE-3 heads take "eagle3")
SPEC_METHOD = {SpecMethod.DRAFT: "draft_model", SpecMethod.EAGLE: "eagle", SpecMethod.MTP: "mtp",
               SpecMethod.NGRAM: "ngram"}


def launch_lines(plan: ServingPlan) -> list[str]:
    """A draft model's or EAGLE head's ``--speculative-config``, naming the checkpoint in
    DRAFT_MODEL (a JSON string: the path may hold no quote or backslash)."""
    spec = plan.deployment.speculative
    if spec is None or spec.method not in (SpecMethod.DRAFT, SpecMethod.EAGLE):
        return []
    what = "the draft model" if spec.method is SpecMethod.DRAFT else "the EAGLE head"
    config = ('{\\"method\\": \\"' + SPEC_METHOD[spec.method] + '\\", \\"model\\": \\"$DRAFT_MODEL\\", '
              '\\"num_speculative_tokens\\": ' + str(spec.tokens) + '}')
    return [': "${DRAFT_MODEL:?set DRAFT_MODEL to the checkpoint of ' + what + ' (path or HuggingFace id)}"',
            r"""case "$DRAFT_MODEL" in *'"'*|*'\'*) echo "DRAFT_MODEL may hold no quote or backslash" >&2; """
            "exit 2;; esac",
            f'ARGS+=(--speculative-config "{config}")']


def role_lines(plan: ServingPlan, role: str) -> list[str]:
    """Both roles run the NIXL connector (docs.vllm.ai, "NixlConnector Usage Guide":
    ``--kv-transfer-config`` with ``kv_role`` kv_both), each instance on a side-channel
    port of its own."""
    config = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    return ['export VLLM_NIXL_SIDE_CHANNEL_PORT="$(( 5600 + PORT - 8000 ))"',
            f"ARGS+=(--kv-transfer-config {quote(config)})"]


DISAGGREGATION = Disaggregation(
    role_lines=role_lines, router="vllm-router",
    router_flags=("--vllm-pd-disaggregation", "--kv-connector", "nixl"),
    parser="vllm_router.launch_router:parse_router_args")


def refusals(plan: ServingPlan) -> list[tuple[str, str]]:
    d = plan.deployment
    out: list[tuple[str, str]] = []
    if d.ep not in (1, d.tp * d.attention_dp):
        out.append(("deployment.ep", f"vLLM's --enable-expert-parallel spreads experts over all "
                                     f"tp x data-parallel ranks ({d.tp * d.attention_dp}), got ep {d.ep}"))
    return out


def multi_node(plan: ServingPlan, nodes: int) -> list[str]:
    """0.33's multiprocessing backend across nodes: ``--nnodes``, ``--node-rank``,
    ``--master-addr``, ``--master-port``; the nodes after the first run ``--headless``
    (no API server)."""
    return [f'ARGS+=(--nnodes {nodes} --node-rank "$NODE" --master-addr "$MASTER_ADDR" '
            '--master-port "$DIST_PORT")',
            'if (( NODE > 0 )); then ARGS+=(--headless); fi']


VLLM_LAUNCH = register_launch(LaunchSpec(
    engine=VLLM,
    # the project's images on Docker Hub (tags v<release>) and its wheel on PyPI
    image="vllm/vllm-openai:v{version}", pip="pip install vllm=={version}",
    command='vllm serve "$MODEL"', args=args, refusals=refusals, multi_node=multi_node,
    launch_lines=launch_lines, disaggregation=DISAGGREGATION,
    parser="vllm.entrypoints.cli.serve:ServeSubcommand"))
