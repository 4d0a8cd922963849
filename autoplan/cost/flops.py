"""FLOP counts.

Model FLOPs follow the accounting of Megatron-LM's MFU formula (Narayanan et
al., SC'21, Appendix "Floating-point operations", and Megatron-LM
``training.num_floating_point_operations``): every GEMM is counted 2*m*n*k
once forward and twice backward (input-grad and weight-grad), the attention
core 2*2*s*d per token and head forward, halved when the model is causal, the
logit GEMM included; norms and elementwise ops are not counted.
"""

from __future__ import annotations

from autoplan.descriptors.model import Model


def gemm_params_per_layer(model: Model) -> int:
    """Weights of one layer's GEMMs: Q, K, V, output projection and MLP matrices."""
    attn = 2 * model.hidden * model.q_dim + 2 * model.hidden * model.kv_dim
    return attn + model.mlp_matrices * model.hidden * model.ffn_hidden


def attention_core_flops_per_token(model: Model, seq_len: int, causal: bool = True) -> float:
    """Forward QK^T and softmax(.)V for one token in one layer: 2 GEMMs of 2*s*d_q each.

    Causal masking halves the useful work (Megatron-LM's formula since 2024
    counts it so; the SC'21 paper counts the full s x s square).
    """
    full = 2 * 2 * seq_len * model.q_dim
    return full / 2 if causal else full


def layer_forward_flops_per_token(model: Model, seq_len: int, causal: bool = True) -> float:
    return 2 * gemm_params_per_layer(model) + attention_core_flops_per_token(model, seq_len, causal)


def logit_forward_flops_per_token(model: Model) -> float:
    return 2 * model.hidden * model.vocab


def model_flops_per_step(model: Model, tokens: int, seq_len: int, causal: bool = True) -> float:
    """Model FLOPs of one training step: 3x the forward (fwd + dgrad + wgrad), no recompute."""
    per_token = model.layers * layer_forward_flops_per_token(model, seq_len, causal)
    per_token += logit_forward_flops_per_token(model)
    return 3 * per_token * tokens


def recompute_flops_per_token(model: Model, seq_len: int, full: bool, causal: bool = True) -> float:
    """Extra forward work of activation recomputation, per token over all layers.

    Full recompute reruns each layer's forward; selective reruns only the
    attention core (Korthikanti et al. 2022, Sec. 4.2).
    """
    if full:
        return model.layers * layer_forward_flops_per_token(model, seq_len, causal)
    return model.layers * attention_core_flops_per_token(model, seq_len, causal)
