"""Token mixers other than the model's full causal attention, as both halves cost them.

A model's layers each mix tokens one way (``Model.mixers``: descriptors/model.py).
This module says, per mixer kind and on one rank of a TP group: its projection GEMMs,
the FLOPs of its core (the part that mixes tokens: attention over keys, or a linear
recurrence's chunked scan), the state a sequence keeps while it is served (KV cache
per token, or a constant recurrent state) and the activations a layer keeps for its
backward. ``kernels.layer`` keeps the full-attention layer's own; this module
answers for every kind, full attention through ``kernels.layer``.

Sharding: linear-attention and Mamba layers split by heads over TP as attention
does (Megatron-Core ``GatedDeltaNet``, ``MambaMixer``; vLLM's ``MambaMixer2`` and
``Qwen3NextGatedDeltaNet``): their projections by columns, the output projection by
rows; each rank keeps its heads' recurrent states. The DSA indexer's single key
head and its per-head weights are small: kept whole on every rank (vLLM's
``Indexer`` is replicated), its query heads split. DeepSeek-V4's compressors (plain
``Linear`` layers in its inference code) run whole on every rank, in fp32.

DeepSeek-V4 (``Model.is_v4_attention``; DeepSeek-V4 inference code, ``Attention``,
``Compressor``, ``Indexer``): every attention layer attends to its last
``sliding_window`` tokens' keys; a C layer also to the ``index_topk`` of the keys its
compressor pooled from every ``csa_ratio`` tokens (overlapping windows) that its indexer
picks, an H layer to every key pooled from ``hca_ratio`` tokens. Its one key-value head
is cached raw for the window and pooled beyond it.
"""

from __future__ import annotations

from autoplan.descriptors.model import (
    COMPRESSED_MIXERS,
    CSA,
    DENSE,
    FULL,
    GDN,
    HCA,
    KDA,
    LINEAR_MIXERS,
    MAMBA,
    MOE,
    NO_MIXER,
    NO_MLP,
    SLIDING,
    SPARSE,
    Model,
)
from autoplan.kernels.layer import (
    BF16_BYTES,
    Gemm,
    attention_gemms,
    attention_params_per_rank,
    kv_bytes_per_token_layer,
    mlp_gemms,
)

# Chunk lengths of the chunked scans, as the kernels run them: flash-linear-attention's
# chunked gated delta rule and KDA kernels work in 64-token chunks (fla/ops/
# gated_delta_rule/chunk.py, BT = 64); Mamba-2's SSD in the config's chunk_size, 128 in
# every Nemotron-H and Mamba-2 release (Dao & Gu 2024, Sec. 6).
LINEAR_CHUNK = 64
SSD_CHUNK = 128
# recurrent states are kept in fp32 by the engines (vLLM's mamba_ssm_cache_dtype
# default for Qwen3-Next/Qwen3.5 and Nemotron-H configs' "mamba_ssm_cache_dtype":
# "float32"); the conv window in the activations' 16-bit dtype
STATE_BYTES = 4


# ----------------------------------------------------------------------------- shapes

def linear_widths(model: Model) -> tuple[int, int]:
    """(key width, value width) over all heads of a GDN or KDA layer."""
    if model.linear_key_heads:  # GDN: q and k heads apart from v heads
        return model.linear_key_heads * model.linear_key_dim, model.linear_heads * model.linear_value_dim
    width = model.linear_heads * model.linear_key_dim  # KDA: every head the same width
    return width, width


def conv_width(model: Model, mixer: str) -> int:
    """Channels of the layer's depthwise causal conv: q, k, v (GDN, KDA) or x, B, C
    (Mamba-2)."""
    if mixer == MAMBA:
        return model.mamba_inner + 2 * model.ssm_groups * model.ssm_state
    if mixer in (GDN, KDA):
        key, value = linear_widths(model)
        return 2 * key + value
    return 0


def mixer_gemms(model: Model, mixer: str, tokens: float, tp: int) -> list[Gemm]:
    """The mixer's projection GEMMs on one rank for ``tokens`` rows (module doc)."""
    h = model.hidden
    if mixer in (FULL, SLIDING):
        if mixer == SLIDING or not (model.global_head_dim or model.global_kv_heads):
            gemms = attention_gemms(model, tokens, tp)
        else:  # a full layer with its own heads (Gemma 4): Q, its K (and V), output
            d = model.global_head_dim or model.kv_channels
            kv = max(1.0, (model.global_kv_heads or model.kv_heads) / tp) * d
            kvs = 1 if model.global_k_eq_v else 2
            gemms = [Gemm(tokens, model.heads * d / tp + kvs * kv, h),
                     Gemm(tokens, h, model.heads * d / tp)]
        if model.attn_output_gate:  # the gate over the heads' output (Qwen3-Next: q_proj's
            # second half; Kimi-K3's MLA: g_proj)
            gemms.append(Gemm(tokens, model.attn_widths[3] / tp, h))
        return gemms
    if mixer in COMPRESSED_MIXERS:
        gemms = attention_gemms(model, tokens, tp)
        ratio = model.csa_ratio if mixer == CSA else model.hca_ratio
        gemms.append(compressor_gemm(model, ratio, model.kv_channels, tokens))
        if mixer == CSA:  # the indexer: query heads from the q latent, head weights, its keys
            gemms += [Gemm(tokens, model.index_heads * model.index_head_dim / tp, model.q_lora_rank),
                      Gemm(tokens, model.index_heads, h),
                      compressor_gemm(model, ratio, model.index_head_dim, tokens)]
        return gemms
    if mixer == SPARSE:
        gemms = attention_gemms(model, tokens, tp)
        q_in = model.q_lora_rank or h
        gemms += [Gemm(tokens, model.index_heads * model.index_head_dim / tp, q_in),
                  Gemm(tokens, model.index_head_dim + model.index_heads, h)]  # wk, weights
        return gemms
    if mixer == GDN:
        key, value = linear_widths(model)
        return [Gemm(tokens, (2 * key + 2 * value + 2 * model.linear_heads) / tp, h),
                Gemm(tokens, h, value / tp)]
    if mixer == KDA:
        d, width = model.linear_key_dim, model.linear_heads * model.linear_key_dim
        if model.kda_full_gate:  # q, k, v, beta and the full-rank gate; the decay's low-rank pair
            return [Gemm(tokens, (4 * width + model.linear_heads) / tp, h),
                    Gemm(tokens, d, h), Gemm(tokens, width / tp, d),
                    Gemm(tokens, h, width / tp)]
        return [Gemm(tokens, (3 * width + model.linear_heads) / tp, h),
                Gemm(tokens, 2 * d, h),  # the decay's and the gate's low-rank down projections
                Gemm(tokens, 2 * width / tp, d),  # and their up projections
                Gemm(tokens, h, width / tp)]
    if mixer == MAMBA:
        inner, bc = model.mamba_inner, 2 * model.ssm_groups * model.ssm_state
        return [Gemm(tokens, (2 * inner + bc + model.mamba_heads) / tp, h),
                Gemm(tokens, h, inner / tp)]
    return []


def compressor_gemm(model: Model, ratio: int, d: int, tokens: float) -> Gemm:
    """A DeepSeek-V4 compressor's kv and gate projections, fused, in fp32 (its inference code
    upcasts the input and keeps wkv and wgate in fp32): 2 x d per token, twice that for the
    CSA ratio's overlapping windows."""
    coff = 2 if ratio == model.csa_ratio else 1
    return Gemm(tokens, 2 * coff * d, model.hidden, quantized=False)


def hc_gemms(model: Model, kind: tuple[str, str], tokens: float) -> list[Gemm]:
    """A layer's hyper-connection maps, one per block (DeepSeek-V4 inference code,
    ``hc_pre``): the (2 + m) m mixes projected from the m x hidden stream in fp32, on every
    rank's tokens (outside TP, as the norms)."""
    m = model.hc_mult
    if m <= 1:
        return []
    blocks = (kind[0] != NO_MIXER) + (kind[1] != NO_MLP)
    return [Gemm(tokens, (2 + m) * m, m * model.hidden, quantized=False)] * blocks


def latent_gemms(model: Model, tokens: float) -> list[Gemm]:
    """An MoE layer's projections into and out of its experts' latent space, whole on every
    rank over its tokens (as the router; Kimi-K3 modeling code, ``KimiSparseMoeBlock``)."""
    if not model.moe_latent:
        return []
    return [Gemm(tokens, model.moe_latent, model.hidden), Gemm(tokens, model.hidden, model.moe_latent)]


def mixer_params_per_rank(model: Model, mixer: str, tp: int) -> float:
    """The mixer's weights on one rank: split by TP, except what every rank keeps whole:
    K/V heads replicated past kv_heads and MLA's down projections
    (``layer.attention_params_per_rank``), the indexer's key head and weights projection,
    KDA's low-rank down projections."""
    if mixer == NO_MIXER:
        return 0.0
    if model.is_v4_attention and mixer in (FULL, SLIDING, *COMPRESSED_MIXERS):
        whole = float(model.params_mixer(mixer) - model.params_attention)  # compressors, indexer
        if mixer == CSA:  # the indexer's query heads split
            whole -= model.q_lora_rank * model.index_heads * model.index_head_dim * (1 - 1 / tp)
        return attention_params_per_rank(model, tp) + whole
    standard = not (model.global_head_dim or model.global_kv_heads) or model.is_mla
    if mixer in (FULL, SLIDING, SPARSE) and standard:
        index = indexer_params_per_rank(model, tp) if mixer == SPARSE else 0.0
        return attention_params_per_rank(model, tp) + index
    downs = 1 if model.kda_full_gate else 2  # the low-rank down projections, whole
    whole = downs * model.hidden * model.linear_key_dim if mixer == KDA else 0.0
    return (model.params_mixer(mixer) - whole) / tp + whole


def indexer_params_per_rank(model: Model, tp: int) -> float:
    """The DSA indexer's weights on one rank: its query heads split, its key head, key
    norm and head-weights projection whole."""
    d = model.index_head_dim
    whole = model.hidden * d + 2 * d + model.hidden * model.index_heads
    return (model.params_indexer - whole) / tp + whole


def kind_gemms(model: Model, kind: tuple[str, str], tokens: float, tp: int,
               router_tokens: float | None = None) -> list[Gemm]:
    """A layer of ``kind``'s forward GEMMs on one rank for ``tokens`` rows, the routed
    experts excepted (as ``layer.layer_gemms``): its mixer's projections, and a dense MLP or
    an MoE layer's router (16-bit, on ``router_tokens``: sequence parallelism routes each
    rank's share) and its shared experts fused into one MLP."""
    mixer, mlp = kind
    gemms = mixer_gemms(model, mixer, tokens, tp)
    gemms += hc_gemms(model, kind, tokens if router_tokens is None else router_tokens)
    if mlp == DENSE:
        return gemms + mlp_gemms(model, tokens, tp, model.ffn_hidden)
    if mlp == MOE:
        routed = tokens if router_tokens is None else router_tokens
        gemms.append(Gemm(routed, model.experts, model.hidden, quantized=False))
        gemms += latent_gemms(model, routed)
        if model.shared_experts:
            gemms += mlp_gemms(model, tokens, tp, model.shared_experts * model.shared_width)
    return gemms


def kind_params_per_rank(model: Model, tp: int, kind: tuple[str, str]) -> float:
    """Non-expert weights of one layer of ``kind`` on one rank: its mixer's
    (:func:`mixer_params_per_rank`), its norms (replicated), a dense MLP split by TP, or an
    MoE layer's router (replicated) and shared experts (split)."""
    mixer, mlp = kind
    blocks = (mixer != NO_MIXER) + (mlp != NO_MLP)
    out = mixer_params_per_rank(model, mixer, tp)
    out += blocks * ((2 if model.sandwich_norms else 1) * model.params_norm
                     + model.params_hyper_connections + model.params_attn_res)
    if mlp == DENSE:
        out += model.params_mlp / tp
    elif mlp == MOE:
        out += model.params_shared_experts / tp + model.params_router + model.params_latent
    return out


# ----------------------------------------------------------------------------- core FLOPs

def keys_per_query(seq_len: float, window: float) -> float:
    """Mean keys a causal query attends to over a sequence of ``seq_len``, at most
    ``window`` (0: all before it): s/2 for full causal attention; w - w^2 / (2 s) past
    the first w tokens, each later query seeing w keys and the first w a growing prefix."""
    if not window or seq_len <= window:
        return seq_len / 2
    return window - window * window / (2 * seq_len)


def core_flops_per_token(model: Model, mixer: str, seq_len: float) -> float:
    """Forward FLOPs of the mixer's core for one token of a causal sequence of
    ``seq_len``, all heads (before TP).

    - full attention: QK^T and AV over the s/2 keys a causal query sees on average
      (kernels/flops.py's count), with a full layer's own heads where they differ;
    - sliding window: the same over at most ``sliding_window`` keys;
    - DeepSeek-V4's compressed layers: the window's keys, and of the keys pooled from every
      r tokens (a query at t sees t / r of them) every one (H) or the index_topk its
      indexer picks (C), the indexer scoring every pooled key with its heads (as DSA's);
    - sparse (DSA): the indexer scores every earlier key with index_heads heads of
      index_head_dim (DeepSeek-V3.2-Exp report, Sec. 2.1: O(L^2) but light), then MLA
      over at most index_topk keys;
    - GDN and KDA: the chunked delta rule (Yang et al. 2024, "Parallelizing Linear
      Transformers with the Delta Rule", Sec. 3.2, chunk C): per value head, QK^T and
      KK^T within the chunk (2 C d_k each), the WY factors W = T K and U = T V (2 C d_k,
      2 C d_v), the chunk's masked attention times U (2 C d_v), and three d_k x d_v
      products with the state (U - W S, Q S, S += K^T U): 2C(3 d_k + 2 d_v) + 6 d_k d_v;
    - Mamba-2: SSD in chunks of Q (Dao & Gu 2024, Sec. 6): per group C^T B within the
      chunk (2 Q N), per head its masked product with X (2 Q P), and the state's
      B^T X and C S (2 N P each).
    """
    if mixer in (FULL, SLIDING):
        global_dims = mixer == FULL and not model.is_mla and model.global_head_dim
        d = model.global_head_dim if global_dims else None
        qk = d or model.qk_head_dim
        v = d or model.v_channels
        window = model.sliding_window if mixer == SLIDING else 0
        return 2 * keys_per_query(seq_len, window) * model.heads * (qk + v)
    if mixer in COMPRESSED_MIXERS:
        per_key = 2 * model.heads * (model.qk_head_dim + model.v_channels)
        seen = keys_per_query(seq_len, model.sliding_window)
        ratio = model.csa_ratio if mixer == CSA else model.hca_ratio
        if mixer == HCA:
            return per_key * (seen + keys_per_query(seq_len / ratio, 0))
        index = 2 * keys_per_query(seq_len / ratio, 0) * model.index_heads * model.index_head_dim
        return index + per_key * (seen + keys_per_query(seq_len / ratio, model.index_topk))
    if mixer == SPARSE:
        index = 2 * keys_per_query(seq_len, 0) * model.index_heads * model.index_head_dim
        attend = 2 * keys_per_query(seq_len, model.index_topk) * model.heads * (
            model.qk_head_dim + model.v_channels)
        return index + attend
    if mixer in (GDN, KDA):
        dk = model.linear_key_dim
        dv = model.linear_value_dim if mixer == GDN else dk
        c = LINEAR_CHUNK
        return model.linear_heads * (2 * c * (3 * dk + 2 * dv) + 6 * dk * dv)
    if mixer == MAMBA:
        q, n, p = SSD_CHUNK, model.ssm_state, model.mamba_head_dim
        return 2 * q * n * model.ssm_groups + model.mamba_heads * (2 * q * p + 4 * n * p)
    return 0.0


def conv_flops_per_token(model: Model, mixer: str) -> float:
    """The depthwise causal conv: kernel multiply-adds per channel."""
    return 2.0 * conv_width(model, mixer) * model.conv_kernel


# ----------------------------------------------------------------------------- serving state

def kv_bytes_per_token(model: Model, mixer: str, tp: int, element_bytes: float) -> float:
    """Cache bytes one context token leaves in one layer of ``mixer`` on one rank: K and V
    for attention (MLA's latent), the indexer's fp8 key too for sparse attention
    (DeepSeek-V3.2: one index_head_dim key per token, stored in FP8 with a 4-byte scale per
    128 channels), nothing per token for linear and Mamba layers (their state is per
    sequence: :func:`state_bytes_per_sequence`). A sliding layer's cache holds at most its
    window: :func:`cached_tokens`."""
    if mixer in COMPRESSED_MIXERS:  # pooled keys; the window's raw ones: window_bytes_per_token
        ratio = model.csa_ratio if mixer == CSA else model.hca_ratio
        index = v4_index_key_bytes(model) if mixer == CSA else 0.0
        return (model.kv_channels * element_bytes + index) / ratio
    if mixer in (FULL, SLIDING):
        if mixer == FULL and (model.global_head_dim or model.global_kv_heads) and not model.is_mla:
            d = model.global_head_dim or model.kv_channels
            kv = max(1.0, (model.global_kv_heads or model.kv_heads) / tp)
            return (1 if model.global_k_eq_v else 2) * kv * d * element_bytes
        return kv_bytes_per_token_layer(model, tp, element_bytes)
    if mixer == SPARSE:
        index = model.index_head_dim * 1 + 4 * max(1, model.index_head_dim // 128)
        return kv_bytes_per_token_layer(model, tp, element_bytes) + index
    return 0.0


def v4_index_key_bytes(model: Model) -> float:
    """One pooled key of DeepSeek-V4's indexer cache: index_head_dim values in FP4
    (AIConfigurator's ``deepseek_v4_indexer_cache_entry_bytes``: index_head_dim x 0.5)."""
    return model.index_head_dim * 0.5


V4_DIMS = "hidden:heads:q_lora_rank:head_dim:o_groups:o_lora_rank:sliding_window:ratio"
V4_INDEX_DIMS = "index_heads:index_head_dim:index_topk"


def v4_dims(model: Model, mixer: str) -> str:
    """The dims a DeepSeek-V4 module table files a C or H layer under (:data:`V4_DIMS`, and
    :data:`V4_INDEX_DIMS` for C): the import writes those of the configs AIConfigurator timed
    (autoplan.measured.aiconfigurator_mixers) through this same function; serving.kinds keys
    its lookups with it."""
    ratio = model.csa_ratio if mixer == CSA else model.hca_ratio
    values = [model.hidden, model.heads, model.q_lora_rank, model.kv_channels, model.o_groups,
              model.o_lora_rank, model.sliding_window, ratio]
    if mixer == CSA:
        values += [model.index_heads, model.index_head_dim, model.index_topk]
    return ":".join(str(int(v)) for v in values)


def window_bytes_per_token(model: Model, mixer: str, element_bytes: float) -> float:
    """Cache bytes a DeepSeek-V4 compressed layer keeps per token of its sliding window
    (its raw key-value head, on every rank; beyond the window its keys are pooled:
    :func:`kv_bytes_per_token`)."""
    if mixer in COMPRESSED_MIXERS:
        return model.kv_channels * element_bytes
    return 0.0


def cached_tokens(model: Model, mixer: str, context: float) -> float:
    """Tokens of a ``context``-long sequence one layer keeps in its cache: all of them for
    full and sparse attention (the indexer picks among all), the last ``sliding_window``
    for a sliding layer, none for a recurrent one; a compressed layer's pooled keys cover
    all of them (their bytes per token are a 1/r share: :func:`kv_bytes_per_token`)."""
    if mixer == SLIDING:
        return min(context, float(model.sliding_window))
    if mixer in (FULL, SPARSE, *COMPRESSED_MIXERS):
        return context
    return 0.0


def state_bytes_per_sequence(model: Model, mixer: str, tp: int,
                             state_bytes: float = STATE_BYTES,
                             conv_bytes: float = BF16_BYTES) -> float:
    """The constant state one sequence keeps in one layer on one rank, whatever its
    length: a GDN or KDA layer's d_k x d_v matrix per value head, a Mamba-2 layer's
    head_dim x state per head (both in ``state_bytes``), and the last conv_kernel - 1
    inputs of the depthwise conv (vLLM's MambaSpec: conv state and temporal state)."""
    if mixer in COMPRESSED_MIXERS:
        return compressor_state_bytes(model, mixer)
    if mixer not in LINEAR_MIXERS:
        return 0.0
    if mixer == MAMBA:
        ssm = model.mamba_heads * model.mamba_head_dim * model.ssm_state
    else:
        dv = model.linear_value_dim if mixer == GDN else model.linear_key_dim
        ssm = model.linear_heads * model.linear_key_dim * dv
    conv = (model.conv_kernel - 1) * conv_width(model, mixer)
    return (ssm * state_bytes + conv * conv_bytes) / tp


def compressor_state_bytes(model: Model, mixer: str) -> float:
    """A DeepSeek-V4 compressed layer's decode state per sequence, on every rank: each
    compressor's fp32 kv and score buffers of the tokens not yet pooled (ratio x coff x d
    each, coff = 2 for the CSA ratio's overlapping windows), and the indexer's compressor's
    beside a C layer's (AIConfigurator's ``DeepSeekV4Model.get_kvcache_bytes_per_sequence``)."""
    def buffers(ratio: int, d: int) -> float:
        coff = 2 if ratio == model.csa_ratio else 1
        return 2 * ratio * coff * d * 4.0
    if mixer == HCA:
        return buffers(model.hca_ratio, model.kv_channels)
    if mixer == CSA:
        return buffers(model.csa_ratio, model.kv_channels) + buffers(model.csa_ratio, model.index_head_dim)
    return 0.0


def compressed_activation_bytes(model: Model, mixer: str, tokens: float, tp: int) -> float:
    """What a DeepSeek-V4 compressed layer keeps for backward beside attention's, per
    ``tokens`` on one rank: its compressor's fp32 kv and gate outputs (the softmax pooling's
    inputs) and the pooled keys; a C layer's indexer also its query heads (16-bit), head
    weights, its own compressor's outputs and the top-k indices it picked (int32 per query:
    the sparse attention's gather)."""
    def compressor(ratio: int, d: int) -> float:
        coff = 2 if ratio == model.csa_ratio else 1
        return tokens * (4 * 2 * coff * d + BF16_BYTES * d / ratio)
    if mixer == HCA:
        return compressor(model.hca_ratio, model.kv_channels)
    if mixer != CSA:
        return 0.0
    n, d = model.index_heads, model.index_head_dim
    index = tokens * (BF16_BYTES * (n * d / tp + n) + 4 * model.index_topk)
    return (compressor(model.csa_ratio, model.kv_channels) + compressor(model.csa_ratio, d) + index)


# ----------------------------------------------------------------------------- training memory

def recurrent_activation_bytes(model: Model, mixer: str, tokens: float, tp: int) -> float:
    """Activations a GDN, KDA or Mamba-2 mixer keeps for backward on one rank, per
    ``tokens`` (16-bit unless said): the input projection's output (the conv's input and
    the gates), the conv's output (the scan's q, k, v or x, B, C), the scan's output and
    the gated norm's output (the output projection's input); and for the delta rule the
    chunk-local WY matrix (fp32, chunk x chunk per value head: flash-linear-attention
    saves ``A`` and recomputes the chunk states ``h`` in backward, as Mamba-2's
    ``mamba_chunk_scan_combined`` recomputes its states)."""
    e = BF16_BYTES
    if mixer == MAMBA:
        proj = 2 * model.mamba_inner + 2 * model.ssm_groups * model.ssm_state + model.mamba_heads
        value, wy = model.mamba_inner, 0.0
    else:
        key, value = linear_widths(model)
        proj = 2 * key + 2 * value + 2 * model.linear_heads
        wy = STATE_BYTES * model.linear_heads * LINEAR_CHUNK
    conv = conv_width(model, mixer)
    return tokens * (e * (proj + conv + 2 * value) + wy) / tp
