"""What a serving replica holds and reads per layer kind, for models whose layers differ
(``Model.mixers`` / ``Model.mlps``: descriptors/model.py; the sizes per kind are
:mod:`autoplan.kernels.mixers`'s).

On one GPU of a pipeline stage, a sequence of ``context`` tokens holds (:class:`CacheShape`):

- full-attention layers (A): K and V of every token (MLA: its latent), as a dense model's;
- sparse-attention layers (D, DeepSeek sparse attention): the MLA latent of every token and
  the lightning indexer's fp8 key (the indexer scores every earlier token);
- sliding-window layers (W): the last ``sliding_window`` tokens' K and V where the engine
  frees what falls out of the window (vLLM's hybrid KV cache manager, ``SlidingWindowSpec``;
  SGLang's SWA pool; TensorRT-LLM's per-window pools: each engine file's ``hybrid_cache``
  says from which release), else every token's, as a full layer;
- DeepSeek-V4's compressed layers (C, H): their sliding window's raw key-value head, a
  pooled key per ``csa_ratio`` (``hca_ratio``) tokens beyond (C: and its indexer's FP4 key),
  and each compressor's fp32 buffers of the tokens not yet pooled, a constant per sequence;
  its sliding layers (W) the window alone (an engine that runs the model keeps its layout);
- recurrent layers (G Gated DeltaNet, K Kimi Delta Attention, M Mamba-2): a constant state per
  running sequence, whatever its length: the d_k x d_v matrix per value head (Mamba-2: head
  width x state per head) in the engine's state dtype (fp32: ``STATE_BYTES``), and the
  depthwise conv's last kernel - 1 inputs in 16 bits.

Sequences that fit the KV budget: budget / (per-sequence state + window-bounded sliding KV
+ per-token KV x context). The scheduler's pool counts it in units of one token's KV of the
stage's full and sparse layers (:meth:`CacheShape.pool_unit`), each sequence charged its
state and its sliding layers' whole window as ``seq_units`` more: a sequence shorter than
the window is charged the window (as vLLM's allocator does once a sequence has filled it).
vLLM pads a recurrent layer's state up to one attention page (``mamba_page_size_padded``):
at most one block's worth, left out here.

Decode per kind (per iteration, ``n`` sequences holding ``C`` tokens of context in all):
full layers read all of C; sliding layers min(C, n w); sparse layers the indexer's key of
every token and the latent of min(C, n index_topk) tokens; compressed layers min(C, n w)
raw keys and C / r pooled ones (C: the indexer's key of each, min(C / r, n index_topk) of
them); recurrent layers read and write
each sequence's state once (2 n state bytes). Prefill core FLOPs per kind are
:func:`autoplan.kernels.mixers.core_flops_per_token`'s (the chunked delta rule, SSD, the
indexer, windowed attention), projections :func:`autoplan.kernels.mixers.mixer_gemms`.

Measured kernels: where the serving door attached the device's measured mixer tables of the
plan's engine (``Device.mixer_kernels``: AIConfigurator's Gated DeltaNet kernels, Mamba-2
conv, DeepSeek Sparse Attention block and DeepSeek-V4's compressed-attention modules, C and
H; autoplan/measured/mixer_tables.py), a layer whose
shape on one GPU they hold (:func:`table_key`) takes their time in the phases they apply to
instead of the roofline's (``StepModel._init_tables``); the prediction says which
(``serving.trust``).

Prefix caching (``StepModel.prefix_block``): full, sparse and sliding layers' KV is reused in
whole KV blocks (a sliding layer needs only the prefix's last window cached: vLLM's
``SlidingWindowManager``, SGLang's ``SWARadixCache``); a recurrent layer's state only where
the engine release keeps one (``EngineSpec.hybrid_cache``: nowhere, at every state-sized
block, or at the end of each block-aligned scheduler step), so a model with recurrent layers
reuses a prefix only in those units.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from autoplan.descriptors.model import (
    COMPRESSED_MIXERS,
    CSA,
    FULL,
    GDN,
    HCA,
    LINEAR_MIXERS,
    MAMBA,
    MIXERS,
    MOE,
    NO_MIXER,
    SLIDING,
    SPARSE,
    Model,
)
from autoplan.kernels import mixers
from autoplan.kernels.layer import (
    BF16_BYTES,
    expert_params_per_rank,
)

STATE_BYTES = mixers.STATE_BYTES  # the recurrent state's element (fp32), conv inputs in 16 bits
# tokens of a vLLM KV block: attention backends take multiples of 16 (vllm/model_executor/
# models/config.py, HybridAttentionMambaModelConfig: "only support setting block size to
# multiple of 16")
VLLM_BLOCK_ALIGN = 16
# a pool unit where no layer keeps per-token KV (a model of recurrent and windowed layers
# alone): a sequence's state is this many units, a token one (a token's share of nothing)
STATE_UNITS = 1 << 20


def stage_layers(layers: int, pp: int) -> list[range]:
    """The layers of each pipeline stage, as vLLM splits them (vllm/distributed/utils.py
    ``get_pp_indices``: layers // pp each, the remainder one more each to the stages before
    the last)."""
    per = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        per[-i] += 1
    out, start = [], 0
    for n in per:
        out.append(range(start, start + n))
        start += n
    return out


def layer_weights_per_rank(model: Model, kind: tuple[str, str], tp: int, ep: int, etp: int) -> float:
    """One layer of ``kind`` on one GPU: what training holds of it
    (``mixers.kind_params_per_rank``: mixer, norms, dense MLP or router and shared experts)
    and an MoE layer's share of the routed experts."""
    experts = expert_params_per_rank(model, ep, etp) if kind[1] == MOE else 0.0
    return mixers.kind_params_per_rank(model, tp, kind) + experts


kind_gemms = mixers.kind_gemms  # the one home of a layer kind's GEMMs (kernels/mixers.py)


@dataclass(frozen=True, slots=True)
class CacheShape:
    """Bytes a sequence holds on one GPU of a stage (module doc): ``kv_per_token`` for each
    token of context (full and sparse layers, and sliding ones the engine does not window),
    ``sliding_per_token`` up to ``window`` tokens (windowed sliding layers), and
    ``state_per_sequence`` whatever its length (recurrent layers)."""

    kv_per_token: float
    sliding_per_token: float
    window: int
    state_per_sequence: float

    def per_sequence(self, context: float) -> float:
        """Bytes a sequence of ``context`` tokens holds."""
        return (self.state_per_sequence + self.sliding_per_token * min(context, float(self.window))
                + self.kv_per_token * context)

    @property
    def seq_bytes(self) -> float:
        """What the scheduler charges a sequence beside its tokens: its state and its
        sliding layers' whole window."""
        return self.state_per_sequence + self.sliding_per_token * self.window

    @property
    def pool_unit(self) -> float:
        """Bytes of one unit of the scheduler's pool: one token's KV of the full and sparse
        layers; where none keeps per-token KV, a 2^-20 share of a sequence's state."""
        if self.kv_per_token > 0:
            return self.kv_per_token
        return self.seq_bytes / STATE_UNITS if self.seq_bytes > 0 else 1.0

    @property
    def seq_units(self) -> int:
        """Pool units a running sequence holds beside its tokens (:attr:`seq_bytes`)."""
        return math.ceil(self.seq_bytes / self.pool_unit) if self.seq_bytes > 0 else 0


def cache_shape(model: Model, layers: Iterable[int], tp: int, kv_bytes: float, windowed: bool,
                state_bytes: float = STATE_BYTES) -> CacheShape:
    """The :class:`CacheShape` of these layers on one GPU of a TP group, the KV cache in
    ``kv_bytes`` per element; ``windowed``: the engine keeps a sliding layer's window only."""
    kv = sliding = state = 0.0
    # an engine that runs DeepSeek-V4 keeps its windows only (the model's own cache layout)
    windowed = windowed or model.is_v4_attention
    for i in layers:
        mixer = model.mixer(i)
        per_token = mixers.kv_bytes_per_token(model, mixer, tp, kv_bytes)
        if mixer == SLIDING and windowed:
            sliding += per_token
        else:
            kv += per_token
        sliding += mixers.window_bytes_per_token(model, mixer, kv_bytes)
        state += mixers.state_bytes_per_sequence(model, mixer, tp, state_bytes, BF16_BYTES)
    return CacheShape(kv, sliding, model.sliding_window, state)


def state_block_tokens(model: Model, tp: int, kv_bytes: float, state_bytes: float = STATE_BYTES) -> int:
    """vLLM's KV block for a model with recurrent layers: the fewest tokens, a multiple of
    16, whose one layer's attention page holds one recurrent layer's state
    (``HybridAttentionMambaModelConfig.verify_and_update_config``:
    ``attn_block_size = 16 * cdiv(mamba_page_size, 16 * attn_page_size_1_token)``; the largest
    recurrent state of the model's kinds, against its full-attention layer's page)."""
    recurrent = {m for m in model.mixers if m in LINEAR_MIXERS}
    if not recurrent:
        return 0
    page = max(mixers.state_bytes_per_sequence(model, m, tp, state_bytes, BF16_BYTES) for m in recurrent)
    attn = {m for m in model.mixers if m in (FULL, SPARSE, SLIDING)}
    token = max((mixers.kv_bytes_per_token(model, m, tp, kv_bytes) for m in attn), default=0.0)
    if token <= 0:
        return VLLM_BLOCK_ALIGN
    return VLLM_BLOCK_ALIGN * math.ceil(page / (VLLM_BLOCK_ALIGN * token))


# the measured mixer tables' kinds (autoplan.measured.mixer_tables) of the mixers they time
TABLE_KINDS = {GDN: "gdn", MAMBA: "mamba2", SPARSE: "dsa", CSA: "dsv4_csa", HCA: "dsv4_hca"}
# a DeepSeek-V4 compressed layer's dims, as a key's first part (v4_dims; the C layer's
# indexer too)
V4_DIMS, V4_INDEX_DIMS, v4_dims = mixers.V4_DIMS, mixers.V4_INDEX_DIMS, mixers.v4_dims


def table_key(model: Model, mixer: str, tp: int, kv_cache: str, weights: str) -> str | None:
    """The key a measured mixer table (``Device.mixer_kernels``) files one GPU's share of a
    ``mixer`` layer under, or None where none could: Gated DeltaNet by its key and value
    heads on the GPU, their widths and the conv kernel; Mamba-2 by the conv's channels on
    the GPU and its kernel (the tables time its conv alone); sparse attention by the
    architecture's dims (hidden, q_lora_rank, kv_lora_rank, qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim, index_topk, index_heads, index_head_dim), its query heads
    on the GPU and the KV cache's dtype (bf16, fp8), for 16-bit or fp8 weights (the GEMM
    dtypes the tables measured); DeepSeek-V4's compressed layers (C, H) by their dims
    (:func:`v4_dims`), their query heads on the GPU and an fp8 KV cache (the only one the
    tables hold: vLLM runs the model on ``fp8_ds_mla`` alone), for any weights (their
    projections are taken off the block at the GEMM dtype it was timed with, fp8:
    ``StepModel._block_gemms``). A split that leaves a fraction of a head has no key."""
    if mixer == GDN:
        nk, nv = model.linear_key_heads, model.linear_heads
        if not nk or nk % tp or nv % tp:
            return None
        return f"{nk // tp}/{nv // tp}/{model.linear_key_dim}/{model.linear_value_dim}/{model.conv_kernel}"
    if mixer == MAMBA:
        channels = mixers.conv_width(model, MAMBA)
        if channels % tp:
            return None
        return f"{channels // tp}/{model.conv_kernel}"
    if mixer == SPARSE:
        kv = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8"}.get(kv_cache)
        if kv is None or weights not in ("bf16", "fp16", "fp8") or model.heads % tp:
            return None
        dims = ":".join(str(int(v)) for v in (
            model.hidden, model.q_lora_rank, model.kv_lora_rank, model.qk_nope_head_dim,
            model.qk_rope_head_dim, model.v_head_dim, model.index_topk, model.index_heads,
            model.index_head_dim))
        return f"{dims}/{model.heads // tp}/{kv}"
    if mixer in COMPRESSED_MIXERS:
        if kv_cache != "fp8" or not model.is_v4_attention or model.heads % tp:
            return None
        return f"{v4_dims(model, mixer)}/{model.heads // tp}/fp8"
    return None


def mixer_names(model: Model) -> list[str]:
    """The model's token mixers, in words, in model order of first appearance."""
    seen: list[str] = []
    for i in range(model.layers):
        name = MIXERS[model.mixer(i)]
        if model.mixer(i) != NO_MIXER and name not in seen:
            seen.append(name)
    return seen
