"""Time of one transformer layer's kernels on one rank, for one microbatch.

Hardware (the device file) says how fast a kernel can run; the software stack
(``descriptors/stack.py``, carried on the Shard) says which kernels run and what
each costs the host to launch.

Roofline (Williams et al. 2009): a kernel takes max(FLOPs / achievable FLOP/s,
bytes / achievable bytes/s). Achievable GEMM FLOP/s are the device's large-GEMM
efficiency of the dtype's peak (fp8 its own), reduced by wave quantization: a GEMM
runs in whole waves of output tiles over the SMs (the tile size is chosen as cuBLAS's
heuristics do, the one that finishes first). Devices without an SM count keep the older
size curve eff(F) = gemm_efficiency * F / (F + gemm_half_flop).

Fixed costs: every kernel pays the device's kernel gap on the GPU, and a layer pass
cannot run faster than the host dispatches its kernels (eager PyTorch; zero under
CUDA graphs): pass time = max(GPU time, kernels x host time per kernel).

A device calibrated on a measured profile carries a learned correction
(autoplan.measured.surrogate): the per-kernel primitives here (gemm_time,
grouped_gemm_time, attention_time, decode_attention_time, experts_time) multiply their
analytic time by its predicted measured/analytic ratio. The surrogate is fitted on these same
primitives, evaluated uncorrected for each profile row.

A device carrying measured kernel grids instead (``Device.kernels``: training's, attached by
the training door where autoplan ships them; autoplan.measured.kernels) takes a GEMM's time
from its grid (:func:`measured_gemm_time`), the backward's data- and weight-gradient GEMMs
each at its own shape (:func:`backward_gemm_times`); attention, grouped expert GEMMs and
elementwise passes keep the roofline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from autoplan.caches import memo
from autoplan.descriptors.hardware import Device
from autoplan.descriptors.model import (
    DENSE,
    FULL,
    MAMBA,
    MOE,
    NO_MIXER,
    NO_MLP,
    SLIDING,
    SPARSE,
    Model,
)
from autoplan.descriptors.stack import AttentionKernel
from autoplan.kernels import flops, mixers
from autoplan.kernels.layer import (
    BF16_BYTES,
    Gemm,
    Shard,
    distinct_experts,
    elementwise_bytes_forward,
    layer_gemms,
    mlp_gemms,
    rope_widths,
)
from autoplan.vocab import Dtype, Position, RecomputeModule


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """Seconds for one layer on one rank, one microbatch.

    Backward is split into input-grad (B) and weight-grad (W) as zero-bubble
    schedules need (Qi et al. 2024); attention and elementwise backward belong to B.
    """

    forward: float
    backward_input: float
    backward_weight: float
    attention_forward: float  # the attention-core part of ``forward`` (selective recompute)
    attention_backward: float  # the attention-core part of ``backward_input``

    @property
    def backward(self) -> float:
        return self.backward_input + self.backward_weight


# Output tiles cuBLAS / CUTLASS choose between on Ampere and Hopper (CUTLASS's
# profiler kernels: 128x256, 128x128 and 64x128 threadblock tiles), with the fraction
# of the large tile's per-SM rate each sustains: smaller tiles re-read more operand
# bytes per FLOP from shared memory (the rates are this model's assumption, checked
# only through the end-to-end fit; see docs/ACCURACY.md).
GEMM_TILES = ((128, 256, 1.0), (128, 128, 0.92), (64, 128, 0.80))


def wave_efficiency(m: float, n: float, sms: int) -> float:
    """Fraction of the large-GEMM rate an (m x n) output reaches in whole waves of tiles
    over ``sms`` SMs, with the tile that finishes first: tiles = ceil(m/tm) ceil(n/tn),
    time ~ ceil(tiles / sms) waves x tile work / tile rate."""
    if not sms:
        return 1.0
    best = math.inf
    for tm, tn, rate in GEMM_TILES:
        waves = math.ceil(math.ceil(m / tm) * math.ceil(n / tn) / sms)
        best = min(best, waves * tm * tn / rate)
    return m * n / (sms * best)


def gemm_roofline(work: float, bytes_moved: float, device: Device, dtype: Dtype,
                  m: float = 0.0, n: float = 0.0) -> float:
    """A GEMM-like kernel of ``work`` FLOPs moving ``bytes_moved`` bytes with an (m x n)
    output: roofline (Williams et al. 2009) at the device's large-GEMM efficiency for the
    dtype, times the wave quantization of its output tiles (devices with an SM count), or
    the older curve eff(F) = gemm_efficiency * F / (F + h) (devices without)."""
    eff = device.gemm_peak_efficiency(dtype) * work / (work + device.gemm_half_flop)
    if device.sms and m and n:
        eff *= wave_efficiency(m, n, device.sms)
    compute_s = work / (device.peak_flops(dtype) * eff)
    return max(compute_s, bytes_moved / (device.hbm_Bps * device.hbm_efficiency))


# Below one output-tile row (a decode batch) cuBLAS and the engines' small-batch kernels
# split K over every SM (split-K / GEMV) instead of tiling the output, so no wave of tiles
# idles SMs and reading the weights bounds them (the smallest tile of GEMM_TILES is 64 rows;
# 128 is where every tile of the table has a full row).
SMALL_BATCH_ROWS = 128


def curve_gemm_time(m: float, n: float, k: float, device: Device, dtype: Dtype,
                    weight_bytes: float = BF16_BYTES) -> float:
    """The roofline of one GEMM (:func:`gemm_time` without a correction or a table)."""
    moved = weight_bytes * k * n + BF16_BYTES * (m * k + m * n)
    tiled = m >= SMALL_BATCH_ROWS
    return gemm_roofline(2.0 * m * n * k, moved, device, dtype, m if tiled else 0.0, n if tiled else 0.0)


# TensorRT-LLM's fp8 Linear, whose times the measured fp8 GEMM tables hold, quantizes its
# 16-bit input per tensor before cuBLASLt's scaled GEMM (static_quantize_e4m3_per_tensor:
# read 2 bytes, write 1, per element of the m x k operand; tensorrt_llm/_torch/modules/
# linear.py, FP8QDQLinearMethod.apply). Transformer Engine's cast is charged on its own here
# (fp8_cast_seconds), so that pass is taken out of the table's time, at the device's HBM rate,
# and never below half the table's time.
TABLE_FP8_QUANTIZE_BYTES = 3


def measured_gemm_time(m: float, n: float, k: float, device: Device, dtype: Dtype,
                       weight_bytes: float = BF16_BYTES) -> float | None:
    """One GEMM from the device's measured grid (``Device.kernels``), or None where it has
    none in ``dtype``. Inside the grid, the table's time (interpolated in log space,
    autoplan.measured.kernels); outside it (a dim past the grid's edge), the time at the
    nearest shape inside times the curve's ratio between the two shapes
    (:func:`curve_gemm_time`), so the curve takes over from the grid's edge. fp8: less the
    table's own quantization pass (:data:`TABLE_FP8_QUANTIZE_BYTES`)."""
    assert device.kernels is not None
    found = device.kernels.gemm(m, n, k, dtype)
    if found is None:
        return None
    t, (tm, tn, tk) = found
    if dtype is Dtype.FP8:
        quantize = TABLE_FP8_QUANTIZE_BYTES * tm * tk / (device.hbm_Bps * device.hbm_efficiency)
        t = max(t - quantize, 0.5 * t)
    if (tm, tn, tk) != (m, n, k):
        t *= (curve_gemm_time(m, n, k, device, dtype, weight_bytes)
              / curve_gemm_time(tm, tn, tk, device, dtype, weight_bytes))
    return t


@memo(65536)  # layers of many shards share their shapes
def gemm_time(m: float, n: float, k: float, device: Device, dtype: Dtype,
              weight_bytes: float = BF16_BYTES) -> float:
    """One (m x k) @ (k x n) GEMM whose k x n operand is stored at ``weight_bytes`` per
    element (quantized weights are read at their precision and dequantized in the kernel):
    the roofline over its FLOPs and bytes, with wave quantization from
    :data:`SMALL_BATCH_ROWS` rows up, times the measured/analytic ratio the device's
    correction predicts for this shape (autoplan.measured.surrogate), if it has one. The
    surrogate is fitted on this same function (uncorrected) evaluated for each profile row.
    A device with measured kernel grids (``Device.kernels``, training's only: the door
    never attaches them with a correction) takes the grid's time where it has the dtype
    (:func:`measured_gemm_time`).
    Training's stage costs and serving's iterations both time their GEMMs here."""
    if device.kernels is not None and device.correction is None:
        measured = measured_gemm_time(m, n, k, device, dtype, weight_bytes)
        if measured is not None:
            return measured
    t = curve_gemm_time(m, n, k, device, dtype, weight_bytes)
    if device.correction is not None:
        t *= device.correction.gemm(m, n, k, dtype)
    return t


def backward_gemm_times(gemms: list[Gemm], device: Device, dtype: Dtype, forward: float
                        ) -> tuple[float, float]:
    """(input-grad, weight-grad) seconds of the backward GEMMs of ``gemms``, whose forward
    GEMMs take ``forward`` seconds in all. A forward (m x k) @ (k x n) has a data-gradient
    GEMM (m x n) @ (n x k), shape (m, k, n), and a weight-gradient GEMM (k x m) @ (m x n),
    shape (k, n, m): the same FLOPs. With measured grids (``Device.kernels``) each is looked
    up at its own shape in the forward's table (measured in the forward's layout, input
    times transposed weight: the backward's transposed operands are taken to run at the
    rate of the same shape there); on the curve, both take the forward's time."""
    if device.kernels is None or device.correction is not None:
        return forward, forward
    return (sum(gemm_time(g.m, g.k, g.n, device, dtype) for g in gemms),
            sum(gemm_time(g.k, g.n, g.m, device, dtype) for g in gemms))


GROUPED_GEMM_TILE = 128  # rows per CTA tile of grouped GEMM kernels (CUTLASS, MegaBlocks' 128 blocks)


@memo(65536)
def grouped_gemm_time(rows: float, n: float, k: float, groups: int, device: Device,
                      dtype: Dtype) -> float:
    """``groups`` GEMMs (rows x k) @ (k x n) in one grouped kernel (Gale et al. 2023,
    MegaBlocks). Each group's rows are padded to whole tiles, so few rows per group waste
    work; the efficiency curve applies to the whole kernel, which launches once, and so
    does the correction: that of one GEMM over all groups' padded rows."""
    padded = math.ceil(rows / GROUPED_GEMM_TILE) * GROUPED_GEMM_TILE
    work = 2.0 * padded * n * k * groups
    t = gemm_roofline(work, BF16_BYTES * groups * (rows * k + k * n + rows * n), device, dtype,
                      padded * groups, n)
    if device.correction is not None:
        t *= device.correction.gemm(padded * groups, n, k, dtype)
    return t


def batch_experts_time(model: Model, tokens: float, ep: int, etp: int, device: Device,
                       dtype: Dtype, weight_bytes: float) -> float:
    """Forward seconds of one rank's routed experts for an inference batch of ``tokens``
    tokens (every attention-DP rank's, gathered at the experts): :func:`experts_time` of
    the model's experts."""
    return experts_time(tokens, model.expert_hidden, model.expert_width, model.top_k, model.experts, ep, etp,
                        device, dtype, weight_bytes, model.mlp_matrices)


def experts_time(tokens: float, hidden: float, inter: float, top_k: int, experts: int, ep: int,
                 etp: int, device: Device, dtype: Dtype, weight_bytes: float,
                 matrices: int = 3) -> float:
    """Forward seconds of one rank's routed experts of an MoE layer (``experts`` experts of
    ``matrices`` hidden x ``inter`` matrices each, gated: 3) for ``tokens`` tokens: each
    token to ``top_k`` experts; of the experts/ep on this rank, those the batch hits
    (:func:`distinct_experts`, routing uniform) are read whole at ``weight_bytes`` per
    element, each split by etp; the routed copies move in and out in 16 bits. Wave
    quantization counts from a full tile row of tokens per expert
    (:data:`SMALL_BATCH_ROWS`). The device's correction: its measured ratio of the
    engine's fused MoE kernel (``Correction.moe``, a profile's ``moe`` rows), else that of
    one GEMM over every routed row of this rank. The surrogate is fitted on this same
    function (uncorrected) for each ``moe`` row."""
    local = experts / ep
    hit = distinct_experts(experts, top_k, tokens) / ep
    params_expert = matrices * hidden * inter
    work = 2.0 * tokens * top_k * params_expert / (ep * etp)
    moved = (hit * params_expert / etp * weight_bytes
             + BF16_BYTES * tokens * top_k / ep * hidden * 2)
    # rows per expert, on average: the tokens' top_k copies spread over all the experts (a
    # rank's tokens x top_k / ep over its experts / ep)
    rows = tokens * top_k / experts
    n = inter / etp
    tiled = rows >= SMALL_BATCH_ROWS
    grouped = rows * max(1.0, local)  # the rank's routed rows
    t = gemm_roofline(work, moved, device, dtype, rows if tiled else 0.0, n if tiled else 0.0)
    correction = device.correction
    if correction is not None:
        ratio = correction.moe(tokens, hidden, inter, top_k, experts, etp, ep, dtype)
        t *= ratio if ratio is not None else correction.gemm(max(1.0, grouped), n, hidden, dtype)
    return t


def expert_time(model: Model, shard: Shard, device: Device) -> float:
    """Forward seconds of the routed experts on the busiest rank: one grouped GEMM per
    matrix over its experts/ep local experts, the tokens gathered over the expert-TP
    group and each expert's width split by it."""
    local = model.experts // shard.ep
    if local == 0:  # no experts here (a dense model): nothing routed
        return 0.0
    rows = shard.routed_tokens(model) * shard.etp / local  # per local expert
    f, h = model.expert_width / shard.etp, model.expert_hidden
    return sum(grouped_gemm_time(rows, n, k, local, device, shard.dtype)
               for n, k in (((model.mlp_matrices - 1) * f, h), (h, f)))


class AttentionCall(NamedTuple):
    """One flash-attention kernel call, described as a profile row describes it
    (autoplan/measured/profile.py): the fields of :meth:`Correction.attention`."""

    batch_heads: float  # batch x query heads
    seq: float  # queries (= keys) per call
    head_dim: float  # query/key channels per head
    kv_ratio: float  # query heads per key/value head (GQA)
    causal: bool
    backward: bool  # the backward alone


# Head dimensions: flash kernels are compiled for head dims in steps of 32 up to 256
# (flash-attention csrc/flash_attn/src/flash_fwd_hdim*.cu), so a head of d channels runs
# the kernel of the next multiple of 32 and computes d / padded of useful FLOPs. Heads
# narrower than 128 sustain less: at 64 channels FlashAttention-2 reaches 324 of its
# 370 TFLOPS at 128, FlashAttention-3 497 of 648 (Shah et al. 2024, Fig. 5, H100, 16k).
HEAD_DIM_RATE_64 = {AttentionKernel.FLASH2: 324 / 370, AttentionKernel.FLASH3: 497 / 648}


def head_dim_factor(head_dim: float, kernel: AttentionKernel) -> float:
    """Fraction of the head-dim-128 rate a flash kernel reaches at ``head_dim``."""
    padded = max(32, math.ceil(head_dim / 32) * 32)
    at_64 = HEAD_DIM_RATE_64.get(kernel, HEAD_DIM_RATE_64[AttentionKernel.FLASH2])
    rate = 1.0 if padded >= 128 else at_64 + (1.0 - at_64) * max(0, padded - 64) / 64
    return rate * head_dim / padded


def attention_efficiency(device: Device, kernel: AttentionKernel, backward: bool,
                         seq: float, head_dim: float = 128) -> float:
    """Fraction of the 16-bit peak a flash-attention kernel reaches: the device's rate for
    the kernel generation (Hopper-class fused attention where the device has one, else
    FlashAttention-2) and direction, ramped by query length q / (q + q_half): short
    sequences leave the tiles' pipelines half full (Dao 2023, Fig. 4-7; Shah et al. 2024,
    Fig. 5-6); and by the head dimension (:func:`head_dim_factor`)."""
    if kernel is AttentionKernel.FLASH3 and device.attention_fa3_efficiency is not None:
        eff = (device.attention_fa3_backward_efficiency or device.attention_fa3_efficiency
               if backward else device.attention_fa3_efficiency)
    else:
        kernel = AttentionKernel.FLASH2
        eff = (device.attention_backward_efficiency or device.attention_efficiency
               if backward else device.attention_efficiency)
    if device.attention_seq_half:
        eff *= seq / (seq + device.attention_seq_half)
    return eff * head_dim_factor(head_dim, kernel)


def attention_time(work: float, call: AttentionCall, device: Device,
                   kernel: AttentionKernel = AttentionKernel.FLASH2) -> float:
    """A flash-attention call of ``work`` FLOPs: compute-bound at the kernel's efficiency
    of the 16-bit peak (FlashAttention keeps the s x s scores on chip; Dao 2023), times
    the measured/analytic ratio the device's correction predicts for the call, if it has
    one. The surrogate is fitted on this same function (uncorrected)."""
    eff = attention_efficiency(device, kernel, call.backward, call.seq, call.head_dim)
    t = work / (device.peak_bf16_flops * eff)
    if device.correction is not None:
        t *= device.correction.attention(*call)
    return t


# the query length at which a decode step's attention rate is taken: decode kernels
# (FlashAttention-3's and FlashInfer's paged decode, TensorRT-LLM's XQA) split the context
# over the SMs, so its tiles run full as a long prefill's do
DECODE_RATE_SEQ = 4096.0


def decode_attention_time(batch: float, context: float, heads: float, kv_heads: float,
                          head_dim: float, kv_bytes: float, device: Device, *,
                          queries: float = 1.0, token_bytes: float | None = None,
                          token_flops: float | None = None) -> float:
    """One decode attention call of a layer: ``batch`` sequences, each ``queries`` query
    tokens (1; a speculative verify's width) against ``context`` tokens of KV cache
    (PagedAttention, Kwon et al. 2023): bound by reading the cache, ``kv_heads`` keys and
    values of ``head_dim`` channels at ``kv_bytes`` per element per token, or by its FLOPs
    (QK^T and AV: 4 heads head_dim per query and context token) at flash attention's rate
    (:func:`attention_efficiency`, the Hopper-class kernel at :data:`DECODE_RATE_SEQ`),
    whichever is more. ``token_bytes`` and ``token_flops`` replace the per-token bytes and
    FLOPs per query of the GQA layout for another one (MLA's absorbed latent). Times the
    measured/analytic ratio the device's correction predicts (``Correction.decode``, a
    profile's ``decode`` rows), if it has one; the surrogate is fitted on this same function
    (uncorrected)."""
    per_token = 2.0 * kv_heads * head_dim * kv_bytes if token_bytes is None else token_bytes
    flops_token = 4.0 * heads * head_dim if token_flops is None else token_flops
    eff = attention_efficiency(device, AttentionKernel.FLASH3, False, DECODE_RATE_SEQ, head_dim)
    read_s = batch * context * per_token / (device.hbm_Bps * device.hbm_efficiency)
    compute_s = batch * context * queries * flops_token / (device.peak_bf16_flops * eff)
    t = max(read_s, compute_s)
    if device.correction is not None:
        ratio = device.correction.decode(batch, context, heads, kv_heads, head_dim, kv_bytes)
        t *= 1.0 if ratio is None else ratio
    return t


def attention_call(model: Model, shard: Shard, backward: bool) -> AttentionCall:
    """The flash-attention call of one rank: its micro-batch x heads/tp, causal. Ring CP
    runs one call per ring step on s/cp queries against s/cp keys (Liu et al. 2023);
    Ulysses CP runs heads/cp on the whole sequence (Jacobs et al. 2023)."""
    heads, seq = model.heads / shard.tp, float(shard.attention_seq or shard.seq_len)
    if shard.cp > 1 and shard.cp_ring:
        seq /= shard.cp
    elif shard.cp > 1:
        heads /= shard.cp
    return AttentionCall(shard.micro_batch * heads, seq, model.qk_head_dim,
                         model.heads / model.kv_heads, True, backward)


def attention_core_time(model: Model, shard: Shard, device: Device) -> tuple[float, float]:
    """(forward, backward) seconds of flash attention on this rank.

    Each rank computes its s/cp queries against all s keys, causal (half the
    square); of packed documents, each against its own document's keys.
    FlashAttention-2's backward runs 5 GEMMs against the forward's 2 (Dao 2023,
    Algorithm 2), so backward = 2.5 x forward.
    """
    if shard.attention_kernel is AttentionKernel.UNFUSED:
        return unfused_attention_time(model, shard, device)
    # packed documents: block-diagonal (varlen) attention runs their share of the causal
    # work, and the busiest context-parallel rank its imbalance over the mean (packing.py)
    per_token = (flops.attention_core_flops_per_token(model, shard.seq_len) / shard.tp
                 * shard.attention_share * shard.attention_imbalance)
    fwd_flops = per_token * shard.tokens
    kernel = shard.attention_kernel
    return (attention_time(fwd_flops, attention_call(model, shard, False), device, kernel),
            attention_time(2.5 * fwd_flops, attention_call(model, shard, True), device, kernel))


def unfused_attention_time(model: Model, shard: Shard, device: Device) -> tuple[float, float]:
    """(forward, backward) seconds of attention without a fused kernel (Megatron-LM's
    CoreAttention before FlashAttention): QK^T and AV as batched GEMMs over the full
    s x s square (the causal mask is applied afterwards), and a fused scale-mask-softmax
    kernel that writes the scores to HBM and reads them back, then dropout on the
    probabilities (Shoeybi et al. 2019; Korthikanti et al. 2022, Sec. 4.1). Backward:
    two GEMMs per forward GEMM, and the softmax and dropout gradients."""
    call = attention_call(model, shard, False)
    bh, s, d = call.batch_heads, call.seq, call.head_dim
    dv = model.v_channels
    scores = bh * s * s  # elements of the s x s square per call
    qk = gemm_roofline(2.0 * scores * d, BF16_BYTES * (2 * bh * s * d + scores), device,
                       shard.dtype, bh * s, s)
    av = gemm_roofline(2.0 * scores * dv, BF16_BYTES * (scores + 2 * bh * s * dv), device,
                       shard.dtype, bh * s, dv)
    # softmax reads and writes the scores; dropout reads, writes and stores a 1-byte mask
    soft_bytes = scores * BF16_BYTES * 2 + (scores * (BF16_BYTES * 2 + 1) if model.dropout else 0)
    hbm = device.hbm_Bps * device.hbm_efficiency
    calls = shard.cp if shard.cp > 1 and shard.cp_ring else 1  # ring: one per step
    fwd = calls * (qk + av + soft_bytes / hbm)
    # softmax backward reads probabilities and their grad, writes the score grad
    soft_b = scores * BF16_BYTES * 3 + (scores * (BF16_BYTES * 2 + 1) if model.dropout else 0)
    bwd = calls * (2 * qk + 2 * av + soft_b / hbm)
    if shard.cp > 1 and shard.cp_ring:  # causal ring: half the steps skip masked blocks
        fwd, bwd = fwd * (shard.cp + 1) / (2 * shard.cp), bwd * (shard.cp + 1) / (2 * shard.cp)
    return fwd, bwd


def ring_correction_bytes(model: Model, shard: Shard) -> float:
    """Bytes moved per ring-attention step beyond the attention kernel: the partial output
    is merged into the running fp32 accumulator with the log-sum-exp rescaling (Liu et al.
    2023, Ring Attention; Transformer Engine's context-parallel attention): read and write
    the fp32 output and the per-head statistics."""
    heads = model.heads / shard.tp
    return shard.tokens * (heads * model.v_channels * 4 * 2 + heads * 4 * 2)


# FP8 GEMMs take FP8 operands: Transformer Engine quantizes each GEMM's 16-bit input
# with a fused cast-transpose kernel that reads it once and writes the FP8 copy and its
# transpose (for the backward's other GEMM): 2 bytes read, 2 written per element; the
# backward does the same for the output gradient. Weights are cast once per step
# (TE's first-microbatch weight caching) and left out. (TE docs, "Using FP8 with
# Transformer Engine"; transformer_engine/pytorch/cpp_extensions/cast.py.)
FP8_CAST_BYTES = 4


def fp8_cast_seconds(gemms: list[Gemm], device: Device
                     ) -> tuple[float, float]:
    """(forward, backward) seconds of quantizing the FP8 GEMMs' activations and gradients."""
    hbm = device.hbm_Bps * device.hbm_efficiency
    return (sum(g.m * g.k for g in gemms) * FP8_CAST_BYTES / hbm,
            sum(g.m * g.n for g in gemms) * FP8_CAST_BYTES / hbm)


def module_forward(model: Model, shard: Shard, device: Device, module: RecomputeModule,
                   moe: bool) -> float:
    """Forward seconds of one layer's ``module`` on one rank (what recomputing it in backward
    costs; Megatron-Core's recompute_modules), the attention core aside (``layer_times``'
    ``attention_forward``): the module's GEMMs at the roofline, its elementwise traffic at
    the device's elementwise rate (HBM speed but on a measured CPU), at the stack's
    sustained share of both. A module the layer lacks (``mlp`` on
    an MoE layer, the MoE ones on a dense layer) costs nothing."""
    hbm = device.elementwise_rate  # the layer's memory-bound passes (Device.elementwise_Bps)
    tokens, t, h = shard.tokens, shard.tp, model.hidden
    e = BF16_BYTES
    gated = model.activation.gated
    moe = moe and model.is_moe  # a dense model has no MoE layer (its callers ask both kinds)
    seconds = 0.0
    if module is RecomputeModule.LAYERNORM:  # two norms: read the input, write the output
        seconds = 2 * 2 * e * shard.norm_tokens * h / hbm
    elif module is RecomputeModule.MLA_UP_PROJ and model.is_mla:
        gemms = [Gemm(tokens, model.heads * (model.qk_nope_head_dim + model.v_head_dim) / t,
                      model.kv_lora_rank)]
        if model.q_lora_rank:
            gemms.append(Gemm(tokens, model.attn_widths[0] / t, model.q_lora_rank))
        seconds = sum(gemm_time(g.m, g.n, g.k, device, shard.dtype) for g in gemms)
    elif module is RecomputeModule.MLP and not moe:
        seconds = sum(gemm_time(g.m, g.n, g.k, device, shard.dtype)
                      for g in mlp_gemms(model, tokens, t, model.ffn_hidden))
        seconds += tokens * e * (3 if gated else 2) * model.ffn_hidden / t / hbm  # the activation
    elif module is RecomputeModule.SHARED_EXPERTS and moe and model.shared_experts:
        seconds = sum(gemm_time(g.m, g.n, g.k, device, shard.dtype)
                      for g in mlp_gemms(model, tokens, t, model.shared_experts * model.shared_width))
    elif module is RecomputeModule.MOE_ACT and moe:  # the activation over every routed copy
        seconds = shard.routed_tokens(model) * e * (3 if gated else 2) * model.expert_width / hbm
    elif module is RecomputeModule.MOE and moe:  # router, routed experts, shared experts
        seconds = expert_time(model, shard, device) + gemm_time(
            shard.norm_tokens, model.experts, h, device, shard.dtype)
        if model.shared_experts:
            seconds += sum(gemm_time(g.m, g.n, g.k, device, shard.dtype)
                           for g in mlp_gemms(model, tokens, t, model.shared_experts * model.shared_width))
    return seconds / shard.kernel_efficiency


def kind_gemms(model: Model, shard: Shard, kind: tuple[str, str]) -> list[Gemm]:
    """A layer of ``kind``'s forward GEMMs on the shard's rank (``mixers.kind_gemms``)."""
    return mixers.kind_gemms(model, kind, shard.tokens, shard.tp, shard.norm_tokens)


def kind_core_time(model: Model, shard: Shard, device: Device, mixer: str) -> tuple[float, float]:
    """(forward, backward) seconds of a mixer's core on this rank: full attention as
    :func:`attention_core_time`; the others' FLOPs (``mixers.core_flops_per_token``) on
    tensor cores at flash attention's efficiency for their head width (an assumption: no
    measured table for these kernels is applied here), backward 2.5x the forward for the
    attention kinds (FlashAttention-2) and 2x for the chunked scans (each forward product's
    two gradient products, the chunk states recomputed from the saved boundaries)."""
    plain = mixer == FULL and not (model.global_head_dim and not model.is_mla)
    if plain:
        return attention_core_time(model, shard, device)
    if mixer == NO_MIXER:
        return 0.0, 0.0
    if mixer == SLIDING and not model.sliding_window:
        return attention_core_time(model, shard, device)
    work = (mixers.core_flops_per_token(model, mixer, shard.seq_len) / shard.tp
            * shard.attention_share * shard.attention_imbalance * shard.tokens)
    if mixer in mixers.LINEAR_MIXERS:
        work += mixers.conv_flops_per_token(model, mixer) / shard.tp * shard.tokens
        d = model.mamba_head_dim if mixer == MAMBA else model.linear_key_dim
        backward = 2.0
    else:
        d = (model.global_head_dim if mixer == FULL else 0) or model.qk_head_dim
        backward = 2.5
    call = AttentionCall(shard.micro_batch * model.heads / shard.tp, float(shard.seq_len), d,
                         1.0, True, False)
    kernel = shard.attention_kernel
    fwd = attention_time(work, call, device, kernel)
    return fwd, attention_time(backward * work, call._replace(backward=True), device, kernel)


def kind_elementwise_bytes(model: Model, shard: Shard, kind: tuple[str, str]) -> float:
    """:func:`elementwise_bytes_forward` of a layer of ``kind``: a missing block drops its
    norm and residual add (and the MLP its activation, the mixer its RoPE); a linear or
    Mamba mixer has no RoPE and adds its conv (read, write) and gated norm (read the
    value and the gate, write); hyper-connections move each block's m-wide stream
    (DeepSeek-V4's hc_pre and hc_post), attention residuals read each mix's candidates."""
    mixer, mlp = kind
    e, h, t = BF16_BYTES, model.hidden, shard.tp
    out = elementwise_bytes_forward(model, shard, mlp == MOE)
    block = shard.norm_tokens * h * e * (2 + 3 + (2.5 if model.dropout else 0))
    rope = 0.0
    if model.position is Position.ROPE:
        q, k = rope_widths(model)
        rope = shard.tokens * e * 2 * (q + k) / t
    if mlp == NO_MLP:
        act_in = 2 if model.activation.gated else 1
        out -= block + shard.tokens * e * (act_in + 1) * model.ffn_hidden / t
    if mixer == NO_MIXER:
        out -= block + rope
    elif mixer in mixers.LINEAR_MIXERS:
        value = model.mamba_inner if mixer == MAMBA else mixers.linear_widths(model)[1]
        out += 2 * e * shard.tokens * mixers.conv_width(model, mixer) / t
        out += 3 * e * shard.tokens * value / t - rope
    m = model.hc_mult
    if m > 1:  # per block hc_pre reads the m-wide stream and writes one; hc_post reads the
        # block's output and the stream and writes the stream, in place of a residual add
        blocks = (mixer != NO_MIXER) + (mlp != NO_MLP)
        out += blocks * shard.norm_tokens * h * e * ((m + 1) + (1 + 2 * m) - 3)
    if model.attn_res_block:  # each block's mix reads its candidates and writes one
        blocks = (mixer != NO_MIXER) + (mlp != NO_MLP)
        out += blocks * shard.norm_tokens * h * e * (model.attn_res_candidates + 1)
    return max(0.0, out)


def layer_times(model: Model, shard: Shard, device: Device, moe: bool = False,
                kind: tuple[str, str] | None = None) -> LayerTimes:
    """One layer's passes on one rank: a dense or (``moe``) MoE layer of the model's
    attention, or a layer of ``kind`` (mixer, MLP) of a hybrid model."""
    standard = not (model.attn_output_gate or model.global_head_dim or model.global_kv_heads)
    if kind is None:
        kind = (FULL, MOE if moe else DENSE)
    if standard and kind in ((FULL, DENSE), (FULL, MOE)):
        moe = kind[1] == MOE
        kind = None
        gemms = layer_gemms(model, shard.tokens, shard.tp, moe, shard.norm_tokens)
        attn_fwd, attn_bwd = attention_core_time(model, shard, device)
        elem_bytes = elementwise_bytes_forward(model, shard, moe)
    else:
        moe = kind[1] == MOE
        gemms = kind_gemms(model, shard, kind)
        attn_fwd, attn_bwd = kind_core_time(model, shard, device, kind[0])
        elem_bytes = kind_elementwise_bytes(model, shard, kind)
    gemm_fwd = sum(gemm_time(g.m, g.n, g.k, device, shard.dtype) for g in gemms)
    if moe:
        gemm_fwd += expert_time(model, shard, device)
    hbm = device.hbm_Bps * device.hbm_efficiency
    # the layer's memory-bound passes at the rate the device runs them (fused kernels at
    # HBM speed; a CPU's eager passes at its measured Device.elementwise_Bps)
    elem_fwd = elem_bytes / device.elementwise_rate
    cast_f = cast_b = 0.0
    if shard.dtype is Dtype.FP8:
        cast_f, cast_b = fp8_cast_seconds(gemms, device)
    # the ring's per-step merges, forward; backward merges the grads too
    ring = kind is None or kind[0] in (FULL, SLIDING, SPARSE)
    if shard.cp > 1 and shard.cp_ring and ring:
        merge = (shard.cp - 1) * ring_correction_bytes(model, shard) / hbm
        attn_fwd, attn_bwd = attn_fwd + merge, attn_bwd + 2 * merge
    sustained = shard.kernel_efficiency  # the stack's share of the benchmarks' rates
    if sustained != 1.0:
        gemm_fwd, attn_fwd, attn_bwd, elem_fwd = (
            gemm_fwd / sustained, attn_fwd / sustained, attn_bwd / sustained, elem_fwd / sustained)
    gemm_dgrad, gemm_wgrad = gemm_fwd, gemm_fwd  # the curve's: same FLOPs, the forward's time
    if device.kernels is not None and device.correction is None:  # measured: each at its shape
        dgrad, wgrad = backward_gemm_times(gemms, device, shard.dtype, 0.0)
        experts = expert_time(model, shard, device) if moe else 0.0  # grouped: the forward's
        gemm_dgrad, gemm_wgrad = (dgrad + experts) / sustained, (wgrad + experts) / sustained
    # backward of an elementwise op reads the saved input and the output grad and
    # writes the input grad: about twice the forward traffic
    forward = gemm_fwd + attn_fwd + elem_fwd + cast_f / sustained
    backward_input = gemm_dgrad + attn_bwd + 2 * elem_fwd + cast_b / sustained
    backward_weight = gemm_wgrad
    if shard.layer_kernels:
        forward, backward_input, backward_weight = _fixed_costs(
            shard, device, forward, backward_input, backward_weight)
    return LayerTimes(forward=forward, backward_input=backward_input,
                      backward_weight=backward_weight, attention_forward=attn_fwd,
                      attention_backward=attn_bwd)


def _fixed_costs(shard: Shard, device: Device, forward: float, backward_input: float,
                 backward_weight: float) -> tuple[float, float, float]:
    """A layer's passes with their fixed costs: each kernel's GPU-side gap (launch
    latency, ramp-up and tail), and the host's dispatch as a floor - a pass cannot finish
    before the host has launched its kernels (eager PyTorch runs ahead of the GPU only
    while kernels outlast their launch). The backward's GPU side launches twice the
    forward's kernels (input and weight gradients); its host side takes
    ``host_backward_kernel_s`` per forward kernel (twice the forward's rate by the stack's
    prior; measured where a profile has ``host`` rows). Split between B and W by their
    GPU time."""
    k = shard.layer_kernels
    forward = max(forward + k * device.kernel_gap_s, k * shard.host_kernel_s)
    gpu_b = backward_input + backward_weight + 2 * k * device.kernel_gap_s
    total_b = max(gpu_b, k * shard.host_backward_kernel_s)
    scale = total_b / (backward_input + backward_weight)
    return forward, backward_input * scale, backward_weight * scale


def logits_times(model: Model, shard: Shard, device: Device) -> tuple[float, float, float]:
    """(forward, input-grad, weight-grad) seconds of the vocab-parallel output GEMM and
    the fp32 cross-entropy (its backward belongs to the input-grad pass)."""
    out = Gemm(shard.tokens, model.vocab / shard.tp, model.hidden)
    gemm = gemm_time(out.m, out.n, out.k, device, shard.dtype) / shard.kernel_efficiency
    dgrad, wgrad = (t / shard.kernel_efficiency for t in backward_gemm_times(
        [out], device, shard.dtype, gemm * shard.kernel_efficiency))
    # cross-entropy: upcast logits to fp32, softmax, loss; backward writes the grad (memory-
    # bound passes: at the rate the device runs them, Device.elementwise_rate)
    ce_bytes = shard.tokens * model.vocab / shard.tp * (BF16_BYTES + 4 + 4)
    ce = ce_bytes / device.elementwise_rate / shard.kernel_efficiency
    return gemm + ce, dgrad + ce, wgrad
