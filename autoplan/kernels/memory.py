"""Memory per GPU.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation
in Large Transformer Models"), Sec. 4.1: per layer, in bytes, with s tokens,
b microbatch, h hidden, a heads, t tensor-parallel degree,
    no SP:  s*b*h*(10 + 24/t + 5*a*s/(h*t))      (eq. 2)
    SP:     s*b*h*(34 + 5*a*s/h)/t               (eq. 4)
generalised here term by term to GQA (K and V of kv_heads), gated MLPs
(Megatron's fused SwiGLU keeps fc1's 2f-wide output), flash attention (no
s x s tensors: the softmax statistics instead) and no dropout.

Weights, gradients and optimizer states follow Megatron-LM's
docs/distrib_optimizer.md table (bytes per parameter): bf16 params with fp32
grads 2 + 4 + 12, fp16 params and grads 2 + 2 + 16; the states a plan keeps
(``Plan.states``: bf16 gradients, int16 master remainders or none, bf16 moments)
take their bytes off it. ZeRO stages (Rajbhandari et al. 2020) divide optimizer
states (1), also gradients (2), also parameters (3) by the sharding group.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.descriptors.model import (
    COMPRESSED_MIXERS,
    DENSE,
    FULL,
    LINEAR_MIXERS,
    MOE,
    NO_MIXER,
    NO_MLP,
    SPARSE,
    Model,
)
from autoplan.descriptors.precision import FP32_STATES, StatePrecision
from autoplan.descriptors.stack import AttentionKernel
from autoplan.kernels import mixers
from autoplan.kernels.layer import BF16_BYTES, Shard
from autoplan.vocab import Dtype, MasterWeights, Recompute, RecomputeModule, StateDtype, ZeroStage

# What the search leaves free on a device by default, beyond a plan's predicted peak (whose
# ``other`` already holds the device's fixed reserve): PyTorch's caching allocator splits
# and caches blocks, so a step needs more than its live tensors. GMLake (Guo et al.,
# ASPLOS 2024) measured 9.2 GB (up to 25 GB) of that fragmentation on average over eight
# LLM trainings on A100-80GB with the default allocator; expandable segments
# (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which Megatron-LM recommends) remove
# most of it. Half the measured mean, 5% of the device (4 GiB of 80), is the default:
# an assumption between the two, stated here; `search --min-headroom` overrides it.
DEFAULT_HEADROOM_FRACTION = 0.05


def default_headroom_bytes(device_mem_bytes: float) -> float:
    return DEFAULT_HEADROOM_FRACTION * device_mem_bytes


@dataclass(frozen=True, slots=True)
class BytesPerParam:
    weights: float
    grads: float
    optimizer: float


# Megatron-LM docs/distrib_optimizer.md: fp16 keeps fp16 grads and an fp32 grad copy in
# the optimizer (20 B/param); bf16 (and fp8, whose master weights are bf16 in Transformer
# Engine) accumulates grads in fp32 (18 B/param).
_FP16_STATES = BytesPerParam(weights=2, grads=2, optimizer=16)
_BF16_STATES = BytesPerParam(weights=2, grads=4, optimizer=12)


# Bytes per parameter of the master weights a sharded optimizer keeps (vocab.MasterWeights):
# a full fp32 copy; the int16 remainder beside the bf16 weight (apex DistributedFusedAdam
# StateBucket, apex 810ffae3 L448-453: param_remainders_shard int16); none
MASTER_BYTES = {MasterWeights.FP32: 4.0, MasterWeights.REMAINDERS: 2.0, MasterWeights.NONE: 0.0}


def bytes_per_param(dtype: Dtype, states: StatePrecision = FP32_STATES) -> BytesPerParam:
    """Bytes per parameter of weights, gradients and optimizer states by training dtype
    (``_FP16_STATES``, ``_BF16_STATES``: fp32 master, fp32 moments) and the states kept
    (``Plan.states``): bf16 gradients (Megatron-LM --grad-reduce-in-bf16, NeMo 1.x
    grad_sync_dtype bf16) hold 2 bytes where fp32 ones hold 4; the master weights
    ``MASTER_BYTES`` of the fp32 copy's 4; bf16 moments (--exp-avg-dtype bf16
    --exp-avg-sq-dtype bf16; NeMo 1.x optim.dtype bf16) 2 + 2 of Adam's 8."""
    per = _FP16_STATES if dtype is Dtype.FP16 else _BF16_STATES
    grads = 2.0 if states.main_grads is StateDtype.BF16 else per.grads
    optimizer = (per.optimizer - (4.0 - MASTER_BYTES[states.master_weights])
                 - (4.0 if states.optimizer_states is StateDtype.BF16 else 0.0))
    return BytesPerParam(weights=per.weights, grads=grads, optimizer=optimizer)


def sharded_state_bytes(params: float, dtype: Dtype, zero: ZeroStage, shard_group: int,
                        states: StatePrecision = FP32_STATES) -> BytesPerParam:
    """Bytes on one rank for ``params`` parameters under a ZeRO stage over ``shard_group``
    ranks. The master weights and moments are optimizer states, sharded from ZeRO-1 on;
    the gradients from ZeRO-2: a stack whose persistent gradient buffer is whole on every
    rank (Megatron-Core's distributed optimizer; apex DistributedFusedAdam, whose
    contiguous grad buffer is unsharded, apex 810ffae3 ``_init_grad_buffer`` L1075-1097,
    though it calls itself ZeRO-2) runs at zero 1."""
    per = bytes_per_param(dtype, states)
    d = shard_group
    return BytesPerParam(
        weights=params * per.weights / (d if zero >= ZeroStage.PARAMETERS else 1),
        grads=params * per.grads / (d if zero >= ZeroStage.GRADIENTS else 1),
        optimizer=params * per.optimizer / (d if zero >= ZeroStage.OPTIMIZER else 1),
    )


def layer_activation_bytes(
    model: Model, shard: Shard, recompute: Recompute, flash: bool | None = None, moe: bool = False,
    modules: frozenset[RecomputeModule] = frozenset(), kind: tuple[str, str] | None = None,
) -> float:
    """Activations one layer keeps for backward, per microbatch, on one rank. ``flash``:
    whether attention is a fused kernel that keeps no s x s scores (None: as the shard's
    stack runs it; unfused attention keeps Korthikanti et al.'s 5 a s b bytes per layer).
    ``modules``: what selective recompute recomputes (Megatron-Core's recompute_modules;
    empty: the attention core), each dropping what its forward would have kept: a
    checkpointed module keeps its input (already counted as the previous op's output), an
    output-discarding one (layernorm, moe_act, mla_up_proj) frees its output. ``kind``:
    a hybrid model's (mixer, MLP) layer (:func:`kind_activation_bytes`)."""
    if kind is not None and kind not in ((FULL, DENSE), (FULL, MOE)):
        return kind_activation_bytes(model, shard, recompute, kind, flash, modules)
    if recompute is Recompute.SELECTIVE and not modules:
        modules = frozenset((RecomputeModule.CORE_ATTN,))
    if flash is None:
        flash = shard.attention_kernel is not AttentionKernel.UNFUSED
    if recompute is Recompute.FULL:
        # only the layer input is checkpointed (Korthikanti et al. 2022, Sec. 4.2: 2sbh)
        return BF16_BYTES * shard.norm_tokens * model.hidden
    s_b = shard.tokens  # s*b on this rank (the sequence already split by cp)
    h, t, e = model.hidden, shard.tp, BF16_BYTES
    mask = 1 if model.dropout else 0  # 1-byte dropout masks
    # outside the TP region: replicated across TP ranks unless sequence parallel
    norm_outputs = 0 if RecomputeModule.LAYERNORM in modules else 2 * e
    outside = shard.norm_tokens * h * (
        2 * e  # the two norms' inputs
        + norm_outputs  # inputs of the QKV and MLP-up GEMMs (norm outputs)
        + 2 * mask  # dropout masks after attention and MLP
    )
    if shard.sequence_parallel and shard.sp_saves_gathered:
        # those two GEMM inputs are kept all-gathered, s*b*h instead of s*b*h/t (Stack's
        # sp_saves_gathered; measured on an H200: benchmarks/gpu_validate.py)
        outside += 2 * e * (s_b - shard.norm_tokens) * h
    # inside the TP region: split by t
    attention = _attention_part(model, shard, recompute, flash, moe, modules)
    fc1 = 2 if model.activation.gated else 1  # fc1 output width, in units of the MLP width
    if not moe:
        mlp = 0.0 if RecomputeModule.MLP in modules else (
            s_b * e * (fc1 + 1) * model.ffn_hidden / t)  # activation input and fc2 input
        return outside + attention + mlp
    if RecomputeModule.MOE in modules:
        return outside + attention
    return outside + attention + moe_mlp_activation_bytes(model, shard, modules)


def kind_activation_bytes(model: Model, shard: Shard, recompute: Recompute,
                          kind: tuple[str, str], flash: bool | None = None,
                          modules: frozenset[RecomputeModule] = frozenset()) -> float:
    """:func:`layer_activation_bytes` of a hybrid model's layer of ``kind``: the standard
    layer's, less what a missing block would keep (its norm's input and output, its
    attention or MLP activations), a linear or Mamba mixer's
    (``mixers.recurrent_activation_bytes``) in place of attention's, the DSA indexer's
    query, key and head weights beside sparse attention's, DeepSeek-V4's compressors and
    indexer beside a compressed layer's (``mixers.compressed_activation_bytes``), and with
    hyper-connections each block's m-wide input stream, with attention residuals a share
    of the block snapshots (one per attn_res_block layers) and each mix's weights.
    Sliding-window attention keeps
    what full attention keeps (flash attention saves no scores either way)."""
    mixer, mlp = kind
    streams = model.residual_streams  # the layer's input: hc_mult copies of hidden
    # attention residuals keep each block's snapshot once (one per attn_res_block layers)
    bank = (BF16_BYTES * shard.norm_tokens * model.hidden / model.attn_res_block
            if model.attn_res_block else 0.0)
    if recompute is Recompute.FULL:
        return BF16_BYTES * shard.norm_tokens * model.hidden * streams + bank
    moe = mlp == MOE
    out = layer_activation_bytes(model, shard, recompute, flash, moe, modules)
    # the standard layer's MLP part: what recomputing the MLP (or the MoE) would drop
    mlp_part = out - layer_activation_bytes(model, shard, recompute, flash, moe,
                                            modules | {RecomputeModule.MLP, RecomputeModule.MOE})
    attention = _attention_part(model, shard, recompute, flash, moe, modules)
    norm = 2 * BF16_BYTES * shard.norm_tokens * model.hidden  # a norm's input and output
    if mlp == NO_MLP:
        out -= mlp_part + norm
    if mixer == NO_MIXER:
        out -= attention + norm
    elif mixer in LINEAR_MIXERS:
        out += mixers.recurrent_activation_bytes(model, mixer, shard.tokens, shard.tp) - attention
    elif mixer == SPARSE:
        width = model.index_heads * model.index_head_dim / shard.tp + model.index_head_dim + model.index_heads
        out += shard.tokens * BF16_BYTES * width
    elif mixer in COMPRESSED_MIXERS:
        out += mixers.compressed_activation_bytes(model, mixer, shard.tokens, shard.tp)
    if streams > 1:  # each block's hyper-connections keep its m-wide input stream (hc_pre's
        # mixes and weighted sum, hc_post's residual) and their fp32 mixes
        blocks = (mixer != NO_MIXER) + (mlp != NO_MLP)
        mixes = (2 + streams) * streams
        out += blocks * shard.norm_tokens * (BF16_BYTES * streams * model.hidden + 4 * mixes)
    if model.attn_res_block:  # the bank's share and each mix's fp32 weights over its candidates
        blocks = (mixer != NO_MIXER) + (mlp != NO_MLP)
        out += bank + blocks * shard.norm_tokens * 4 * model.attn_res_candidates
    return max(0.0, out)


def _attention_part(model: Model, shard: Shard, recompute: Recompute, flash: bool | None,
                    moe: bool, modules: frozenset[RecomputeModule]) -> float:
    """What a standard layer keeps for its attention alone (the inputs and outputs of its
    projections and core), by difference with the core and projections recomputed away."""
    if recompute is Recompute.SELECTIVE and not modules:
        modules = frozenset((RecomputeModule.CORE_ATTN,))
    if flash is None:
        flash = shard.attention_kernel is not AttentionKernel.UNFUSED
    s_b, e, t = shard.tokens, BF16_BYTES, shard.tp
    q, k, v, out = model.attn_widths
    attention = 0.0
    if not (model.is_mla and RecomputeModule.MLA_UP_PROJ in modules):
        attention += s_b * e * (q + k + v) / t
    attention += s_b * e * out / t
    if model.is_mla:
        attention += s_b * e * (model.q_lora_rank + model.kv_lora_rank)
    if model.is_v4_attention:  # the q latent (whole), and wo_b's input (its groups' ranks)
        attention += s_b * e * (model.q_lora_rank + model.o_groups * model.o_lora_rank / t)
    heads = model.heads / t
    if RecomputeModule.CORE_ATTN not in modules:
        attention += (5 * heads * (shard.seq_len / shard.cp) * s_b) if not flash else 4 * heads * s_b
    return attention


def moe_mlp_activation_bytes(model: Model, shard: Shard,
                             modules: frozenset[RecomputeModule] = frozenset()) -> float:
    """An MoE layer's MLP activations on the busiest rank: the router's fp32 logits, and
    per routed token copy (Megatron-Core GroupedMLP with the all-to-all dispatcher) the
    permuted expert input, fc1's output, fc2's input and - where the combine scales the
    expert outputs by the router's probabilities - those outputs (a stack that scales the
    activation instead keeps none: ``Stack.moe_probs_in_activation``); the shared experts
    as a dense MLP; a latent MoE's latent before and after its experts. Recomputing
    ``shared_experts`` drops theirs, ``moe_act`` the activation's output (fc2's input)."""
    e, t = BF16_BYTES, shard.tp
    fc1 = 2 if model.activation.gated else 1
    router = shard.norm_tokens * model.experts * 4
    shared = 0.0 if RecomputeModule.SHARED_EXPERTS in modules else (
        shard.tokens * e * (fc1 + 1) * model.shared_experts * model.shared_width / t)
    routed = shard.routed_tokens(model)
    kept = fc1 + (0 if RecomputeModule.MOE_ACT in modules else 1)  # fc1 output, fc2 input
    # with expert TP the input and output are gathered over etp ranks, the widths split
    outputs = 0 if shard.moe_probs_in_activation else 1
    experts = routed * e * ((1 + outputs) * model.expert_hidden * shard.etp + kept * model.expert_width)
    # a latent MoE's down projection output, the combined latent and its norm (the up
    # projection's input), on the rank's tokens as the router's
    latent = shard.norm_tokens * e * 3 * model.moe_latent
    return router + shared + experts + latent


def full_recompute_working_bytes(model: Model, shard: Shard, moe: bool = False) -> float:
    """During backward with full recompute, one layer's activations exist at a time."""
    return layer_activation_bytes(model, shard, Recompute.NONE, moe=moe)


def logits_bytes(model: Model, shard: Shard) -> float:
    """The last stage's logits for one microbatch, vocab-parallel, upcast to fp32 for the
    cross-entropy (Megatron-LM ``vocab_parallel_cross_entropy``): 4*b*s*V/t."""
    return 4 * shard.tokens * model.vocab / shard.tp


def embedding_output_bytes(model: Model, shard: Shard) -> float:
    """The first stage's embedding output (+ dropout mask), one microbatch."""
    return shard.norm_tokens * model.hidden * (BF16_BYTES + (1 if model.dropout else 0))
