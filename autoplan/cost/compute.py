"""Time of one transformer layer's kernels on one rank, for one microbatch.

Roofline (Williams et al. 2009): a kernel takes max(FLOPs / achievable FLOP/s,
bytes / achievable bytes/s). Achievable GEMM FLOP/s follow a per-device
efficiency curve eff(F) = gemm_efficiency * F / (F + gemm_half_flop): small
GEMMs under-fill the GPU. Both constants come from the device profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost import flops
from autoplan.descriptors.hardware import Device
from autoplan.descriptors.model import Model
from autoplan.vocab import Dtype, Position

BF16_BYTES = 2  # activations and weights move in 16-bit (fp8 GEMMs keep 16-bit I/O here)


@dataclass(frozen=True, slots=True)
class Shard:
    """What one rank computes of one layer for one microbatch."""

    micro_batch: int
    seq_len: int  # full sequence length of the job
    tp: int
    cp: int
    sequence_parallel: bool
    dtype: Dtype

    @property
    def tokens(self) -> int:
        """Tokens this rank holds: its 1/cp of the sequence."""
        return self.micro_batch * self.seq_len // self.cp

    @property
    def norm_tokens(self) -> float:
        """Tokens in the regions outside TP (norms, residual, dropout): SP splits them too."""
        return self.tokens / self.tp if self.sequence_parallel else self.tokens


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


def gemm_time(m: float, n: float, k: float, device: Device, dtype: Dtype) -> float:
    """One (m x k) @ (k x n) GEMM: roofline with the device's efficiency curve."""
    work = 2.0 * m * n * k
    eff = device.gemm_efficiency * work / (work + device.gemm_half_flop)
    compute_s = work / (device.peak_flops(dtype) * eff)
    bytes_moved = BF16_BYTES * (m * k + k * n + m * n)
    return max(compute_s, bytes_moved / (device.hbm_Bps * device.hbm_efficiency))


def layer_gemms(model: Model, shard: Shard) -> list[tuple[float, float, float]]:
    """(m, n, k) of one layer's forward GEMMs after TP sharding (Shoeybi et al. 2019):
    QKV and MLP-up split by columns, output projection and MLP-down by rows."""
    t, tokens = shard.tp, shard.tokens
    h, f = model.hidden, model.ffn_hidden
    return [
        (tokens, (model.q_dim + 2 * model.kv_dim) / t, h),  # fused QKV
        (tokens, h, model.q_dim / t),  # attention output projection
        (tokens, (model.mlp_matrices - 1) * f / t, h),  # MLP up (+ gate)
        (tokens, h, f / t),  # MLP down
    ]


def attention_core_time(model: Model, shard: Shard, device: Device) -> tuple[float, float]:
    """(forward, backward) seconds of flash attention on this rank.

    Each rank computes its s/cp queries against all s keys, causal (half the
    square). FlashAttention-2's backward runs 5 GEMMs against the forward's 2
    (Dao 2023, Algorithm 2), so backward = 2.5 x forward.
    """
    per_token = flops.attention_core_flops_per_token(model, shard.seq_len) / shard.tp
    fwd_flops = per_token * shard.tokens
    rate = device.peak_bf16_flops * device.attention_efficiency
    return fwd_flops / rate, 2.5 * fwd_flops / rate


def elementwise_bytes_forward(model: Model, shard: Shard) -> float:
    """Bytes moved by one layer's memory-bound forward ops (norms, residual adds,
    activation function, rotary embedding, dropout), each read once and written once."""
    e, h, f, t = BF16_BYTES, model.hidden, model.ffn_hidden, shard.tp
    outside_tp = shard.norm_tokens * h * e * (
        2 * 2  # two norms: read x, write y
        + 2 * 3  # two residual adds: read a, b; write a + b
        + (2 * 2.5 if model.dropout else 0)  # two dropouts: read, write, 1-byte mask
    )
    act_in = (2 if model.activation.gated else 1) * f / t
    inside_tp = shard.tokens * e * (act_in + f / t)
    if model.position is Position.ROPE:
        inside_tp += shard.tokens * e * 2 * (model.q_dim + model.kv_dim) / t
    return outside_tp + inside_tp


def layer_times(model: Model, shard: Shard, device: Device) -> LayerTimes:
    gemm_fwd = sum(gemm_time(m, n, k, device, shard.dtype) for m, n, k in layer_gemms(model, shard))
    attn_fwd, attn_bwd = attention_core_time(model, shard, device)
    hbm = device.hbm_Bps * device.hbm_efficiency
    elem_fwd = elementwise_bytes_forward(model, shard) / hbm
    # backward of an elementwise op reads the saved input and the output grad and
    # writes the input grad: about twice the forward traffic
    return LayerTimes(
        forward=gemm_fwd + attn_fwd + elem_fwd,
        backward_input=gemm_fwd + attn_bwd + 2 * elem_fwd,  # dgrad GEMMs match forward shapes
        backward_weight=gemm_fwd,  # wgrad GEMMs: same FLOPs, transposed shapes
        attention_forward=attn_fwd,
        attention_backward=attn_bwd,
    )


def logits_times(model: Model, shard: Shard, device: Device) -> tuple[float, float, float]:
    """(forward, input-grad, weight-grad) seconds of the vocab-parallel output GEMM and
    the fp32 cross-entropy (its backward belongs to the input-grad pass)."""
    gemm = gemm_time(shard.tokens, model.vocab / shard.tp, model.hidden, device, shard.dtype)
    # cross-entropy: upcast logits to fp32, softmax, loss; backward writes the grad
    ce_bytes = shard.tokens * model.vocab / shard.tp * (BF16_BYTES + 4 + 4)
    ce = ce_bytes / (device.hbm_Bps * device.hbm_efficiency)
    return gemm + ce, gemm + ce, gemm
