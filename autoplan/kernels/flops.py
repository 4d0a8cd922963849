"""FLOP counts.

Model FLOPs follow the accounting of Megatron-LM's MFU formula (Narayanan et
al., SC'21, Appendix "Floating-point operations", and Megatron-LM
``training.num_floating_point_operations``): every GEMM is counted 2*m*n*k
once forward and twice backward (input-grad and weight-grad), the attention
core 2*2*s*d per token and head forward, halved when the model is causal, the
logit GEMM included; norms and elementwise ops are not counted.
"""

from __future__ import annotations

from autoplan.descriptors.model import LINEAR_MIXERS, MOE, NO_MLP, Model
from autoplan.kernels import mixers
from autoplan.vocab import RecomputeModule


def attention_gemm_params(model: Model) -> int:
    """Weights of one layer's attention GEMMs: Q, K, V and output projections, or MLA's
    down and up projections (its latent RMSNorms are not GEMMs)."""
    if model.is_mla:
        return model.params_mla - model.q_lora_rank - model.kv_lora_rank
    if model.is_v4_attention:  # less its two norms and the sinks
        return model.params_v4_attention - model.q_lora_rank - model.kv_channels - model.heads
    return 2 * model.hidden * model.q_dim + 2 * model.hidden * model.kv_dim


def mlp_gemm_params(model: Model, moe: bool) -> int:
    """Weights one token's MLP GEMMs touch: the dense MLP, or (MoE; Megatron-LM's formula
    with --num-experts) the router, top_k routed experts and the shared experts."""
    if not moe:
        return model.mlp_matrices * model.hidden * model.ffn_hidden
    return (model.params_router + model.top_k * model.params_expert + model.params_shared_experts
            + model.params_latent - (model.moe_latent if model.moe_latent_norm else 0))


def gemm_params_per_layer(model: Model, moe: bool = False) -> int:
    return attention_gemm_params(model) + mlp_gemm_params(model, moe)


def attention_core_flops_per_token(model: Model, seq_len: int, causal: bool = True) -> float:
    """Forward QK^T and softmax(.)V for one token in one layer: 2*s*d_qk + 2*s*d_v per head
    (4*s*d_head for standard attention; MLA's keys are wider than its values).

    Causal masking halves the useful work (Megatron-LM's formula since 2024
    counts it so; the SC'21 paper counts the full s x s square).
    """
    full = 2 * seq_len * model.heads * (model.qk_head_dim + model.v_channels)
    return full / 2 if causal else full


def layer_forward_flops_per_token(model: Model, seq_len: int, causal: bool = True,
                                  moe: bool = False) -> float:
    return (2 * gemm_params_per_layer(model, moe)
            + attention_core_flops_per_token(model, seq_len, causal))


def kind_forward_flops_per_token(model: Model, kind: tuple[str, str], seq_len: int) -> float:
    """One layer of a hybrid model's ``kind`` (mixer, MLP), causal: 2 FLOPs per weight its
    GEMMs touch (the mixer's projections, ``mixers.mixer_gemms``; the MLP's as
    :func:`mlp_gemm_params`; hyper-connection maps, ``mixers.hc_gemms``) and its mixer's
    core as it really runs
    (``mixers.core_flops_per_token``: a window, the indexer's top-k, a linear scan)."""
    mixer, mlp = kind
    weights = sum(g.n * g.k for g in mixers.mixer_gemms(model, mixer, 1, 1))
    weights += sum(g.n * g.k for g in mixers.hc_gemms(model, kind, 1))
    if mlp != NO_MLP:
        weights += mlp_gemm_params(model, mlp == MOE)
    core = mixers.core_flops_per_token(model, mixer, seq_len)
    if mixer in LINEAR_MIXERS:
        core += mixers.conv_flops_per_token(model, mixer)
    return 2 * weights + core


def model_layers_forward_flops_per_token(model: Model, seq_len: int, causal: bool = True) -> float:
    """Every transformer layer, dense and MoE (a hybrid model's by kind, each counting
    what it computes), plus the MTP modules (DeepSeek-V3 Sec. 2.2: each runs one more
    layer, a 2h -> h projection and the shared output head)."""
    if model.is_hybrid:
        out = sum(n * kind_forward_flops_per_token(model, kind, seq_len)
                  for kind, n in model.kinds.items())
    else:
        dense = model.layers - model.moe_layers
        out = dense * layer_forward_flops_per_token(model, seq_len, causal)
        out += model.moe_layers * layer_forward_flops_per_token(model, seq_len, causal, moe=True)
    if model.mtp_layers:
        mtp = (kind_forward_flops_per_token(model, model.mtp_kind, seq_len) if model.is_hybrid
               else layer_forward_flops_per_token(model, seq_len, causal, moe=model.is_moe))
        mtp += 2 * 2 * model.hidden * model.hidden + logit_forward_flops_per_token(model)
        out += model.mtp_layers * mtp
    return out


def logit_forward_flops_per_token(model: Model) -> float:
    return 2 * model.hidden * model.vocab


def model_flops_per_step(model: Model, tokens: int, seq_len: int, causal: bool = True) -> float:
    """Model FLOPs of one training step: 3x the forward (fwd + dgrad + wgrad), no recompute.
    For MoE models only the routed experts a token uses count (active parameters)."""
    per_token = model_layers_forward_flops_per_token(model, seq_len, causal)
    per_token += logit_forward_flops_per_token(model)
    return 3 * per_token * tokens


def recompute_flops_per_token(model: Model, seq_len: int, full: bool, causal: bool = True) -> float:
    """Extra forward work of activation recomputation, per token over all layers.

    Full recompute reruns each layer's forward; selective reruns only the
    attention core (Korthikanti et al. 2022, Sec. 4.2).
    """
    if model.is_hybrid:
        return sum(n * (kind_forward_flops_per_token(model, kind, seq_len) if full else
                        mixers.core_flops_per_token(model, kind[0], seq_len))
                   for kind, n in model.kinds.items())
    if full:
        dense = model.layers - model.moe_layers
        return (dense * layer_forward_flops_per_token(model, seq_len, causal)
                + model.moe_layers * layer_forward_flops_per_token(model, seq_len, causal, moe=True))
    return model.layers * attention_core_flops_per_token(model, seq_len, causal)


def module_recompute_flops_per_token(model: Model, seq_len: int, modules: frozenset[RecomputeModule],
                                     causal: bool = True) -> float:
    """Extra forward work of selective recompute by module (Megatron-Core's
    recompute_modules), per token over all layers: 2 FLOPs per weight a recomputed GEMM
    touches (the dense MLP; an MoE layer's router, top_k experts and shared experts, or
    its shared experts alone; MLA's up projections), and the attention core's FLOPs;
    norms and activation functions are not GEMMs and count nothing."""
    dense_n, moe_n = model.layers - model.moe_layers, model.moe_layers
    total = 0.0
    if RecomputeModule.CORE_ATTN in modules:
        total += model.layers * attention_core_flops_per_token(model, seq_len, causal)
    if RecomputeModule.MLP in modules:
        total += dense_n * 2 * mlp_gemm_params(model, False)
    if RecomputeModule.MOE in modules:
        total += moe_n * 2 * mlp_gemm_params(model, True)
    elif RecomputeModule.SHARED_EXPERTS in modules:
        total += moe_n * 2 * model.params_shared_experts
    if RecomputeModule.MLA_UP_PROJ in modules and model.is_mla:
        up = model.kv_lora_rank * model.heads * (model.qk_nope_head_dim + model.v_head_dim)
        if model.q_lora_rank:
            up += model.q_lora_rank * model.attn_widths[0]
        total += model.layers * 2 * up
    return total
