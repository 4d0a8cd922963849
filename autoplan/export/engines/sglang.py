"""How SGLang (``python -m sglang.launch_server``) launches a serving plan: its flags from
sglang/srt/server_args.py, speculative decoding's, the ``--disaggregation-mode`` of a
prefill/decode disaggregated deployment behind ``sglang_router``, its multi-node flags, its
image and pip pin. What a deployment costs on it: :mod:`autoplan.serving.engines.sglang`."""

from __future__ import annotations

from autoplan.export.engines.launch import Disaggregation, LaunchSpec, register_launch
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import Precision, ServingPlan, SpecMethod
from autoplan.serving.engine import uses_recurrent
from autoplan.serving.engines.sglang import SGLANG
from autoplan.serving.versions import parse_version
from autoplan.shell import Arg

# 0.5.23 (its release line in autoplan/serving/engines/sglang.py): attention data parallelism
# as --attn-dp-size, deprecating --dp-size N --enable-dp-attention (sglang/srt/server_args.py)
ATTN_DP_SIZE_SINCE = parse_version("0.5.23")


def args(plan: ServingPlan, step: StepModel) -> list[Arg]:
    """Flags from sglang/srt/server_args.py: ``--tp-size``, ``--pp-size``, ``--attn-dp-size``
    (attention data parallel within the TP group), ``--ep-size``, ``--max-running-requests``,
    ``--chunked-prefill-size`` (-1 turns it off), ``--mem-fraction-static``,
    ``--kv-cache-dtype fp8_e4m3``, ``--quantization fp8``, ``--context-length``;
    ``--speculative-algorithm``, ``--speculative-num-steps``, ``--speculative-eagle-topk``,
    ``--speculative-num-draft-tokens`` (speculative decoding)."""
    d = plan.deployment
    out: list[Arg] = [("--tp-size", str(d.tp * d.attention_dp)), ("--pp-size", str(d.pp))]
    if d.attention_dp > 1:  # SGLang's DP attention splits its TP group into attention-DP ranks
        # (--attn-dp-size since 0.5.23, which deprecates --dp-size N --enable-dp-attention)
        if parse_version(plan.engine_release) >= ATTN_DP_SIZE_SINCE:
            out.append(("--attn-dp-size", str(d.attention_dp)))
        else:
            out += [("--dp-size", str(d.attention_dp)), ("--enable-dp-attention",)]
    if d.ep > 1:
        out.append(("--ep-size", str(d.ep)))
    out += [("--max-running-requests", str(step.max_num_seqs)),
            ("--chunked-prefill-size", str(step.max_batched_tokens) if step.chunked_prefill else "-1"),
            ("--mem-fraction-static", f"{step.memory_fraction:g}"),
            ("--context-length", str(plan.max_model_len))]
    if d.kv_cache is Precision.FP8:
        out.append(("--kv-cache-dtype", "fp8_e4m3"))
    if d.weights is Precision.FP8:
        out.append(("--quantization", "fp8"))
    if uses_recurrent(plan.model):  # the states in fp32, as predicted (serving.kinds.STATE_BYTES)
        out.append(("--mamba-ssm-dtype", "float32"))
    if plan.workload.images_per_request:  # the model's image processor and vision encoder
        out.append(("--enable-multimodal",))
    spec = d.speculative
    if spec is not None:  # one chain of proposals (top-k 1), verified k + 1 positions at once
        out += [("--speculative-algorithm", SPEC_ALGORITHM[spec.method]),
                ("--speculative-num-steps", str(spec.tokens)), ("--speculative-eagle-topk", "1"),
                ("--speculative-num-draft-tokens", str(spec.tokens + 1))]
    return out


# sglang/srt/speculative/spec_info.py's SpeculativeAlgorithm for each proposer (NEXTN: the
# model's own MTP module; STANDALONE: a separate draft model)
SPEC_ALGORITHM = {SpecMethod.DRAFT: "STANDALONE", SpecMethod.EAGLE: "EAGLE", SpecMethod.MTP: "NEXTN",
                  SpecMethod.NGRAM: "NGRAM"}


def launch_lines(plan: ServingPlan) -> list[str]:
    """The draft model's or EAGLE head's checkpoint, from DRAFT_MODEL."""
    spec = plan.deployment.speculative
    if spec is None or spec.method not in (SpecMethod.DRAFT, SpecMethod.EAGLE):
        return []
    what = "the draft model" if spec.method is SpecMethod.DRAFT else "the EAGLE head"
    return [': "${DRAFT_MODEL:?set DRAFT_MODEL to the checkpoint of ' + what + ' (path or HuggingFace id)}"',
            'ARGS+=(--speculative-draft-model-path "$DRAFT_MODEL")']


BOOTSTRAP_PORT = 8998  # --disaggregation-bootstrap-port's default, the first prefill instance's


def role_lines(plan: ServingPlan, role: str) -> list[str]:
    """``--disaggregation-mode prefill|decode`` over NIXL (``--disaggregation-transfer-backend``);
    each prefill instance of a node on a bootstrap port of its own."""
    line = f"ARGS+=(--disaggregation-mode {role} --disaggregation-transfer-backend nixl"
    if role == "prefill":
        line += f' --disaggregation-bootstrap-port "$(( {BOOTSTRAP_PORT} + REPLICA ))"'
    return [line + ")"]


DISAGGREGATION = Disaggregation(
    role_lines=role_lines, router="python -m sglang_router.launch_router",
    router_flags=("--pd-disaggregation",),
    bootstrap_port=lambda replica: BOOTSTRAP_PORT + replica,
    parser="sglang_router.launch_router:parse_router_args")


def multi_node(plan: ServingPlan, nodes: int) -> list[str]:
    """``--nnodes``, ``--node-rank`` and ``--dist-init-addr``."""
    return [f'ARGS+=(--nnodes {nodes} --node-rank "$NODE" --dist-init-addr "$MASTER_ADDR:$DIST_PORT")']


SGLANG_LAUNCH = register_launch(LaunchSpec(
    engine=SGLANG,
    # the project's images on Docker Hub (tags v<release>) and its wheel on PyPI
    image="lmsysorg/sglang:v{version}", pip='pip install "sglang[all]=={version}"',
    command='python -m sglang.launch_server --model-path "$MODEL"', args=args,
    multi_node=multi_node, parser="sglang.srt.server_args:ServerArgs.add_cli_args",
    launch_lines=launch_lines, disaggregation=DISAGGREGATION))
