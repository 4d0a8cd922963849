"""One transformer layer, as both halves of autoplan cost it.

Training's stage costs (``cost.stage``, ``kernels.compute.layer_times``) and serving's
iteration costs (``serving.cost.StepModel``) ask this module, and only this module,
what a layer is on one rank: its GEMM shapes after tensor parallelism, the weights it
holds (split over TP or replicated), the KV cache one token leaves, the elementwise
traffic around the GEMMs and how many routed experts a batch touches. A change here
reaches both (``tests/unit/test_serving.py`` holds their weights per GPU equal).

Sharding (Megatron-LM, Shoeybi et al. 2019): QKV and the MLP's up (and gate) projections
split by columns, the attention output and MLP down projections by rows; norms replicated.
GQA keeps ``kv_heads / tp`` heads per rank and, where tp exceeds kv_heads, one head
replicated per rank (each rank needs the K and V of its query heads: vLLM's
``QKVParallelLinear``, TensorRT-LLM and Megatron-Core with tp a multiple of the query
groups). MLA (DeepSeek-V2 Sec. 2.1; Megatron-Core ``MLASelfAttention``) runs its down
projections and latent norms unsplit on every rank and splits the up projections by heads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from autoplan.caches import memo
from autoplan.descriptors.hardware import cache_hash
from autoplan.descriptors.model import Model
from autoplan.descriptors.stack import AttentionKernel
from autoplan.vocab import Dtype, MoeDispatch, Position

BF16_BYTES = 2  # activations and weights move in 16-bit (fp8 GEMMs keep 16-bit I/O here)


@dataclass(frozen=True, slots=True)
class Shard:
    """What one rank computes of one layer for one microbatch (training)."""

    micro_batch: int
    seq_len: int  # full sequence length of the job
    tp: int
    cp: int
    sequence_parallel: bool
    dtype: Dtype
    ep: int = 1  # expert parallel degree
    etp: int = 1  # expert tensor parallel degree
    expert_load: float = 1.0  # tokens of the busiest expert rank over the mean (>= 1)
    cp_ring: bool = True  # context parallel by ring attention (else all-to-all, Ulysses)
    moe_dispatch: MoeDispatch = MoeDispatch.ALLTOALL  # how routed tokens reach their experts
    # what the software stack runs (descriptors/stack.py)
    attention_kernel: AttentionKernel = AttentionKernel.FLASH2
    layer_kernels: int = 0  # forward kernels per layer (backward: twice as many)
    host_kernel_s: float = 0.0  # host dispatch per forward kernel (0 under CUDA graphs)
    host_backward_kernel_s: float = 0.0  # host time of the backward per forward kernel
    kernel_efficiency: float = 1.0  # of the device's kernel rates, what the stack sustains
    sp_saves_gathered: bool = False  # SP: TP GEMMs save their gathered input (Stack's field)
    moe_probs_in_activation: bool = False  # MoE: no expert outputs kept (Stack's field)
    # packed documents (kernels/packing.py): the share of one whole-sequence document's
    # causal attention work the sequence's documents run, the length its kernel runs at
    # (0: seq_len), and the busiest context-parallel rank's attention over the mean
    attention_share: float = 1.0
    attention_seq: float = 0.0
    attention_imbalance: float = 1.0
    # memoized layer costs key on shards: hashed once (the fields are frozen)
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cache_hash(self)

    def __hash__(self) -> int:
        return self._hash

    @property
    def tokens(self) -> int:
        """Tokens this rank holds: its 1/cp of the sequence."""
        return self.micro_batch * self.seq_len // self.cp

    @property
    def norm_tokens(self) -> float:
        """Tokens in the regions outside TP (norms, residual, dropout): SP splits them too."""
        return self.tokens / self.tp if self.sequence_parallel else self.tokens

    def routed_tokens(self, model: Model) -> float:
        """Token copies the busiest rank's experts receive per layer: each rank routes its
        sequence-parallel share top_k times (Megatron-Core's all-to-all dispatcher), and
        the busiest rank gets ``expert_load`` times the mean."""
        return self.norm_tokens * model.top_k * self.expert_load


class Gemm(NamedTuple):
    """One (m x k) @ (k x n) GEMM of a layer on one rank; ``weights``: its k x n operand is
    a weight matrix (the router's is kept in 16 bits by every engine: ``quantized`` False)."""

    m: float
    n: float
    k: float
    quantized: bool = True


# ----------------------------------------------------------------------------- shapes

def kv_heads_per_rank(model: Model, tp: int) -> float:
    """K/V heads one rank holds: kv_heads / tp, at least one (replicated past kv_heads)."""
    return max(1.0, model.kv_heads / tp)


def attention_gemms(model: Model, tokens: float, tp: int) -> list[Gemm]:
    """The attention projections' GEMMs of one rank for ``tokens`` rows (module doc)."""
    h = model.hidden
    q, _, _, out = model.attn_widths
    if model.is_v4_attention:  # q down (whole) and up, the key-value head (whole), grouped out
        lora = model.o_groups * model.o_lora_rank
        return [Gemm(tokens, model.q_lora_rank + model.kv_channels, h),
                Gemm(tokens, q / tp, model.q_lora_rank),
                # wo_a: each group's heads to o_lora_rank (a batched GEMM of o_groups / tp)
                Gemm(tokens, lora / tp, q / model.o_groups),
                Gemm(tokens, h, lora / tp)]
    if not model.is_mla:
        kv = 2 * kv_heads_per_rank(model, tp) * model.kv_channels
        return [Gemm(tokens, q / tp + kv, h), Gemm(tokens, h, out / tp)]
    gemms = [Gemm(tokens, model.kv_lora_rank + model.qk_rope_head_dim, h),  # kv down (+ RoPE key)
             Gemm(tokens, model.heads * (model.qk_nope_head_dim + model.v_head_dim) / tp,
                  model.kv_lora_rank)]  # kv up
    if model.q_lora_rank:
        gemms += [Gemm(tokens, model.q_lora_rank, h), Gemm(tokens, q / tp, model.q_lora_rank)]
    else:
        gemms.append(Gemm(tokens, q / tp, h))
    return [*gemms, Gemm(tokens, h, out / tp)]


def mlp_gemms(model: Model, tokens: float, tp: int, width: int) -> list[Gemm]:
    """A TP-split MLP of hidden width ``width``: up (+ gate) by columns, down by rows."""
    h = model.hidden
    return [Gemm(tokens, (model.mlp_matrices - 1) * width / tp, h), Gemm(tokens, h, width / tp)]


def layer_gemms(model: Model, tokens: float, tp: int, moe: bool = False,
                router_tokens: float | None = None) -> list[Gemm]:
    """One layer's forward GEMMs on one rank, the routed experts excepted (they run as
    grouped GEMMs over the tokens routed to them): attention, and the dense MLP or the
    MoE router (on ``router_tokens``: sequence parallelism routes each rank's share) and
    the shared experts, fused into one MLP of their summed width (Megatron-Core)."""
    gemms = attention_gemms(model, tokens, tp)
    if not moe:
        return gemms + mlp_gemms(model, tokens, tp, model.ffn_hidden)
    routed = tokens if router_tokens is None else router_tokens
    gemms.append(Gemm(routed, model.experts, model.hidden, quantized=False))
    if model.moe_latent:  # into and out of the experts' latent space, whole on every rank
        gemms += [Gemm(routed, model.moe_latent, model.hidden), Gemm(routed, model.hidden, model.moe_latent)]
    if model.shared_experts:
        gemms += mlp_gemms(model, tokens, tp, model.shared_experts * model.shared_width)
    return gemms


# ----------------------------------------------------------------------------- weights

def attention_params_per_rank(model: Model, tp: int) -> float:
    """Attention weights (and biases, Q/K norms) on one rank: split by TP, K and V heads
    replicated past kv_heads, MLA's down projections and latent norms whole."""
    if model.is_mla:
        down = model.hidden * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
        norms = model.q_lora_rank + model.kv_lora_rank
        return (model.params_attention - down - norms) / tp + down + norms
    if model.is_v4_attention:  # wq_a, wkv and their norms whole; wq_b, wo_a, wo_b, sinks split
        d, r = model.kv_channels, model.q_lora_rank
        whole = model.hidden * (r + d) + r + d
        return (model.params_v4_attention - whole) / tp + whole
    h, kv = model.hidden, model.kv_dim
    kv_params = 2 * h * kv + (2 * kv if model.bias or model.qkv_bias else 0)
    replicated = max(1.0, tp / model.kv_heads)  # each rank's K/V heads: at least one
    return (model.params_attention - kv_params) / tp + kv_params * replicated / tp


@memo(1024)
def layer_params_per_rank(model: Model, tp: int, moe: bool = False) -> float:
    """Non-expert weights of one layer on one rank: attention (:func:`attention_params_per_rank`)
    and the MLP split by TP, the two norms replicated; an MoE layer's router (replicated)
    and shared experts (split) in place of the dense MLP."""
    attn = attention_params_per_rank(model, tp) + 2 * model.params_norm
    if not moe:
        return attn + model.params_mlp / tp
    return attn + model.params_shared_experts / tp + model.params_router + model.params_latent


@memo(1024)
def expert_params_per_rank(model: Model, ep: int, etp: int) -> float:
    """One MoE layer's routed experts on one rank: experts/ep of them, split by etp."""
    return model.experts // ep * model.params_expert / etp


def mtp_params_per_rank(model: Model, tp: int) -> float:
    """One MTP module without its transformer layer: three norms and the 2h -> h
    projection (TP-split); embedding and output head are the model's own."""
    return 3 * model.params_norm + 2 * model.hidden * model.hidden / tp


def embedding_params_per_rank(model: Model, tp: int) -> float:
    """The vocab-parallel input embedding (split by TP) and learned positions (whole)."""
    return model.vocab * model.hidden / tp + (model.params_embedding - model.vocab * model.hidden)


def output_params_per_rank(model: Model, tp: int, with_embedding: bool) -> float:
    """The final norm and the vocab-parallel output layer; tied embeddings share the
    input embedding's weights where both are on this rank (``with_embedding``), else keep
    their own copy (Megatron-LM)."""
    head = 0.0 if model.tied_embeddings and with_embedding else model.vocab * model.hidden / tp
    return model.params_norm + head


@memo(16384)
def stage_params(model: Model, tp: int, embedding: bool, output: bool, layers: int,
                 dense: int | None = None, mtp: int = 0) -> float:
    """Non-expert parameters on one rank of a stage: its layers (``dense`` of them with a
    dense MLP; None: all of a dense model), plus the embedding where the model starts and
    the final norm and output layer where it ends."""
    dense = layers if dense is None else dense
    params = dense * layer_params_per_rank(model, tp)
    params += (layers - dense + (mtp if model.is_moe else 0)) * layer_params_per_rank(model, tp, True)
    if mtp:
        params += mtp * mtp_params_per_rank(model, tp)
        params += 0 if model.is_moe else mtp * layer_params_per_rank(model, tp)
        if not output:  # MTP apart from the loss (a layout's standalone MTP stage): its
            # own copies of the shared embedding and output head (assumed, as tied
            # embeddings on two stages are kept in Megatron-LM)
            params += 2 * model.vocab * model.hidden / tp
    if embedding:
        params += embedding_params_per_rank(model, tp)
    if output:
        params += output_params_per_rank(model, tp, embedding)
    return params


# ----------------------------------------------------------------------------- KV, experts

def kv_bytes_per_token_layer(model: Model, tp: int, element_bytes: float) -> float:
    """KV cache bytes one token of one layer takes on one rank of a TP group: K and V of
    its :func:`kv_heads_per_rank` heads, or MLA's compressed latent and RoPE key,
    replicated over TP (DeepSeek-V2 Sec. 2.1.2), or DeepSeek-V4's one key-value head."""
    if model.is_mla:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * element_bytes
    if model.is_v4_attention:  # one head that is both key and value, on every rank
        return model.kv_channels * element_bytes
    return 2 * kv_heads_per_rank(model, tp) * model.kv_channels * element_bytes


def distinct_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected experts hit at least once when ``tokens`` tokens each pick ``top_k`` of
    ``experts`` uniformly: E (1 - (1 - k/E)^T)."""
    if tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


# ----------------------------------------------------------------------------- elementwise

def rope_widths(model: Model) -> tuple[int, int]:
    """(query, key) channels the rotary embedding rewrites, over all heads: the attention's
    widths; DeepSeek-V4's only the last qk_rope_head_dim of each query head and of its one
    key-value head (its inference code's ``apply_rotary_emb`` on ``[..., -rope_head_dim:]``)."""
    if model.is_v4_attention:
        return model.heads * model.qk_rope_head_dim, model.qk_rope_head_dim
    q, k, _, _ = model.attn_widths
    return q, k


def elementwise_bytes_forward(model: Model, shard: Shard, moe: bool = False) -> float:
    """Bytes moved by one layer's memory-bound forward ops as a training stack runs them,
    one kernel each (norms, residual adds, activation function, rotary embedding, dropout;
    an MoE layer's token permutation), each operand read once and written once."""
    e, h, t = BF16_BYTES, model.hidden, shard.tp
    outside_tp = shard.norm_tokens * h * e * (
        2 * 2  # two norms: read x, write y
        + 2 * 3  # two residual adds: read a, b; write a + b
        + (2 * 2.5 if model.dropout else 0)  # two dropouts: read, write, 1-byte mask
    )
    act_in = 2 if model.activation.gated else 1
    q, k = rope_widths(model)
    inside_tp = 0.0
    if model.position is Position.ROPE:
        inside_tp += shard.tokens * e * 2 * (q + k) / t
    if not moe:
        return outside_tp + inside_tp + shard.tokens * e * (act_in + 1) * model.ffn_hidden / t
    shared = model.shared_experts * model.shared_width
    inside_tp += shard.tokens * e * (act_in + 1) * shared / t
    routed = shard.routed_tokens(model)
    # permute (read, write) and unpermute (read, weighted write) the routed copies,
    # and the experts' activation function over them
    experts = routed * e * (4 * model.expert_hidden + (act_in + 1) * model.expert_width)
    return outside_tp + inside_tp + experts


def fused_elementwise_bytes_per_token(model: Model, tp: int) -> float:
    """HBM bytes of a layer's elementwise kernels per token as inference engines fuse them
    (vLLM's fused_add_rms_norm twice: reads the input and the residual, writes both; RoPE
    in place on this rank's queries and keys; the gated activation (silu_and_mul) reads
    the two up projections and writes one; hyper-connections' maps over the m-wide stream,
    attention residuals' mixes)."""
    h = model.hidden
    norms = 2 * 4 * h
    # this rank's queries and keys (DeepSeek-V4: their RoPE'd channels alone)
    rope = 2 * (sum(rope_widths(model)) if model.is_v4_attention else model.q_dim + model.kv_dim) / tp
    ffn = max(model.ffn_hidden, model.expert_width * max(1, model.top_k))
    act = (3 if model.activation.gated else 2) * ffn / tp
    m = model.hc_mult  # hyper-connections: each block's hc_pre and hc_post over the m-wide
    # stream (read m, write 1; read 1 and m, write m) in place of its residual add (3)
    hc = 2.0 * (3 * m - 1) * h if m > 1 else 0.0
    # attention residuals: each block's mix reads its candidates and writes one
    hc += 2 * (model.attn_res_candidates + 1) * h if model.attn_res_block else 0.0
    return BF16_BYTES * (norms + rope + act + hc)
