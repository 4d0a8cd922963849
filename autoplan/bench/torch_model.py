"""The model ``autoplan validate`` runs, and torch's own parallel wrappers around it.

torch is an optional extra (``pip install autoplan[bench]``): this module imports it at
the top and is itself imported only by the validation worker, never by ``import autoplan``.

What runs is what autoplan's cost model accounts for, as closely as eager PyTorch allows:

- A Llama/GPT-style decoder (the ``Model`` descriptor's hidden, heads, kv_heads, head_dim,
  ffn_hidden, vocab, activation, norm, position, bias, dropout), one pipeline stage per
  rank (or ``vpp`` model chunks), each chunk holding its share of the layers; the first
  holds the token (and learned position) embedding, the last the final norm and output.
- bf16 compute with fp32 master weights, fp32 gradients and fp32 Adam moments: FSDP2
  (``fully_shard``) with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``
  keeps the fp32 parameter (the master copy) and casts a bf16 copy for compute. Per
  parameter that is autoplan's 2 (bf16 weight) + 4 (fp32 grad) + 12 (fp32 master, m, v)
  bytes of Megatron-LM's docs/distrib_optimizer.md table, sharded as ZeRO says
  (see ``fsdp_settings``).
- Activations saved as Korthikanti et al. 2022 count them with fused kernels: norms save
  their input (and a per-token fp32 1/rms), gated MLPs save fc1's 2f-wide output (the
  activation is recomputed in backward, as Megatron's fused bias-SwiGLU does), attention
  is flash attention (``scaled_dot_product_attention``, which saves Q, K, V, the output
  and the fp32 log-sum-exp; no s x s tensor), the loss saves fp32 softmax of the
  vocab-parallel logits (Megatron-LM ``_VocabParallelCrossEntropy``).
- Megatron-LM's fused projections: one Q/K/V GEMM and one gate/up GEMM per layer, the
  shapes autoplan prices and ``autoplan bench`` measures.
- tp (+ sp) through ``torch.distributed.tensor.parallel`` (torchtitan's Llama plan: the
  fused Q/K/V and MLP up/gate column-parallel, output projections row-parallel, norms
  sequence-parallel, vocab-parallel embedding and output layer); pp through
  ``torch.distributed.pipelining`` (``PipelineStage`` and its schedules).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from autoplan.descriptors import pipeline_layout
from autoplan.descriptors.model import Model
from autoplan.schedules import Schedule
from autoplan.vocab import Activation, Norm, Position, Recompute, ZeroStage

DROPOUT_P = 0.1  # GPT-3 / Megatron-LM's hidden and attention dropout
INIT_STD = 0.02  # GPT-2's initializer range; the values do not matter for timing
ROPE_THETA = 10000.0  # Su et al. 2021
NORM_EPS = 1e-5


# --------------------------------------------------------------------------- fused ops

class _RMSNormFn(torch.autograd.Function):
    """y = x * rsqrt(mean(x^2) + eps) * w (Zhang & Sennrich 2019), saving only x and the
    fp32 per-token 1/rms, as a fused kernel does (Apex FusedRMSNorm)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        ms = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
        rstd = torch.rsqrt(ms.square_().div_(x.shape[-1]).add_(eps))
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd.to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float()
        grad_w = (g * xhat).sum(dim=tuple(range(g.dim() - 1)))
        gxhat = g * weight.float()
        grad_x = rstd * (gxhat - xhat * (gxhat * xhat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = NORM_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _RMSNormFn.apply(x, self.weight, self.eps)
        return out


def _relu2(x: torch.Tensor) -> torch.Tensor:
    """Squared ReLU (So et al. 2021, Primer)."""
    return F.relu(x).square()


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _situ_gate(x: torch.Tensor) -> torch.Tensor:
    """SiTU's gate side (Kimi-K3's SituAndMul, beta 4): 4 tanh(x / 4) sigmoid(x)."""
    return 4.0 * torch.tanh(x / 4.0) * torch.sigmoid(x)


_ACTIVATIONS: dict[Activation, Callable[[torch.Tensor], torch.Tensor]] = {
    Activation.GELU: _gelu, Activation.RELU2: _relu2,
    Activation.SWIGLU: F.silu, Activation.GEGLU: _gelu, Activation.SITU: _situ_gate,
}


class _ActFn(torch.autograd.Function):
    """act(gate) [* up], saving only the inputs and recomputing act in backward: what
    Megatron-LM's fused bias-GeLU / bias-SwiGLU kernels keep (fc1's output)."""

    @staticmethod
    def forward(ctx: Any, act: Callable[[torch.Tensor], torch.Tensor], gate: torch.Tensor,
                up: torch.Tensor | None) -> torch.Tensor:
        ctx.act = act
        if up is None:
            ctx.save_for_backward(gate)
            return act(gate)
        ctx.save_for_backward(gate, up)
        return act(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, torch.Tensor | None]:
        gate, *rest = ctx.saved_tensors
        with torch.enable_grad():
            g = gate.detach().requires_grad_(True)
            a = ctx.act(g)
            if not rest:
                (grad_gate,) = torch.autograd.grad(a, g, grad)
                return None, grad_gate, None
            (up,) = rest
            (grad_gate,) = torch.autograd.grad(a, g, grad * up)
        return None, grad_gate, grad * a.detach()


# --------------------------------------------------------------------------- the model

def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021), rotate-half form. The products with
    constant cos/sin save no activation for backward."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _rope_tables(seq: int, dim: int, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv)
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]  # (s, 1, d): broadcast over heads
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Attention(nn.Module):
    """Multi-head (GQA) self-attention: one fused Q/K/V projection (Megatron-LM's
    ``linear_qkv``, the GEMM autoplan prices: ``kernels.layer.attention_gemms``), causal
    flash attention, row-parallel output. The fused output's columns are read as this
    rank's [Q | K | V] in the ratio heads : kv_heads : kv_heads, so torch's column-parallel
    plan, which gives each rank a contiguous block of them, gives it whole heads of each
    (the rank-grouped layout of Megatron-LM's query groups), and backward all-reduces one
    input gradient for the three."""

    def __init__(self, m: Model):
        super().__init__()
        d = m.kv_channels
        self.head_dim = d
        self.heads, self.kv_heads = m.heads, m.kv_heads
        self.rope = m.position is Position.ROPE
        self.dropout = m.dropout
        self.recompute_core = False  # selective recompute (set by ``apply_recompute``)
        # the attention kernel; ``autoplan bench`` swaps in a stand-in to time the layer's
        # other passes alone (bench/eager.py)
        self.sdpa: Callable[..., torch.Tensor] = F.scaled_dot_product_attention
        self.wqkv = nn.Linear(m.hidden, (m.heads + 2 * m.kv_heads) * d, bias=m.bias or m.qkv_bias)
        self.wo = nn.Linear(m.heads * d, m.hidden, bias=m.bias)
        self._tables: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's Q, K and V columns of the fused projection's output (views)."""
        width = qkv.shape[-1]
        group = self.heads + 2 * self.kv_heads
        q = width * self.heads // group
        kv = width * self.kv_heads // group
        return qkv[..., :q], qkv[..., q:q + kv], qkv[..., q + kv:]

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, s = q.shape[:2]
        d = self.head_dim
        q, k, v = (t.unflatten(-1, (-1, d)) for t in (q, k, v))
        if self.rope:
            key = (s, q.dtype)
            if key not in self._tables:
                self._tables[key] = _rope_tables(s, d, q.dtype, q.device)
            cos, sin = self._tables[key]
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        # (b, s, heads, d) viewed as (b, heads, s, d): the CPU and CUDA flash kernels write
        # the output in the query's layout, so the reshape below is a view, not a copy
        out = self.sdpa(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            dropout_p=DROPOUT_P if self.dropout and self.training else 0.0,
            enable_gqa=q.shape[2] != k.shape[2])
        return out.transpose(1, 2).reshape(b, s, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.wqkv(x))
        if self.recompute_core:
            out = torch.utils.checkpoint.checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        return self.wo(out)  # type: ignore[no-any-return]


class FeedForward(nn.Module):
    """The MLP; a gated one computes gate and up in one fused projection (Megatron-LM's
    ``linear_fc1``, autoplan's ``kernels.layer.mlp_gemms``), read as this rank's
    [gate | up] halves (each rank's block of columns holds both: see :class:`Attention`)."""

    def __init__(self, m: Model):
        super().__init__()
        self.act = _ACTIVATIONS[m.activation]
        self.gated = m.activation.gated
        self.situ = m.activation is Activation.SITU
        self.w1 = nn.Linear(m.hidden, (2 if self.gated else 1) * m.ffn_hidden, bias=m.bias)
        self.w2 = nn.Linear(m.ffn_hidden, m.hidden, bias=m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w1(x)
        gate, up = h.chunk(2, dim=-1) if self.gated else (h, None)
        if self.situ and up is not None:  # SiTU's up side: 25 tanh(u / 25)
            up = 25.0 * torch.tanh(up / 25.0)
        return self.w2(_ActFn.apply(self.act, gate, up))  # type: ignore[no-any-return]


def _norm(m: Model) -> nn.Module:
    return RMSNorm(m.hidden) if m.norm is Norm.RMSNORM else nn.LayerNorm(m.hidden, eps=NORM_EPS)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class Block(nn.Module):
    """Pre-norm transformer layer. ``enter``/``leave`` wrap the TP region: identity here
    (torch's tensor-parallel plan does its own gathers); the stand-ins of --slice mode
    (:func:`use_standins`) otherwise."""

    def __init__(self, m: Model):
        super().__init__()
        self.attention_norm = _norm(m)
        self.attention = Attention(m)
        self.ffn_norm = _norm(m)
        self.feed_forward = FeedForward(m)
        self.dropout = m.dropout
        self.enter: Callable[[torch.Tensor], torch.Tensor] = _identity
        self.leave: Callable[[torch.Tensor], torch.Tensor] = _identity

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, DROPOUT_P, self.training) if self.dropout else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._drop(self.leave(self.attention(self.enter(self.attention_norm(x)))))
        return x + self._drop(self.leave(self.feed_forward(self.enter(self.ffn_norm(x)))))


class Chunk(nn.Module):
    """One model chunk: consecutive layers, with the embedding if it starts the model and
    the final norm and output layer if it ends it. Its output is the hidden state, or the
    (vocab-parallel) logits on the last chunk."""

    def __init__(self, m: Model, layers: Sequence[int], first: bool, last: bool, tied: bool = False):
        super().__init__()
        self.first, self.last = first, last
        self.learned_positions = first and m.position is Position.LEARNED
        self.seq_shard: tuple[int, int] = (0, 1)  # (index, count): sequence parallel's slice
        self.enter: Callable[[torch.Tensor], torch.Tensor] = _identity  # before the output layer
        self.leave: Callable[[torch.Tensor], torch.Tensor] = _identity  # after the embedding
        self.tok_embeddings = nn.Embedding(m.vocab, m.hidden) if first else None
        self.pos_embeddings = nn.Embedding(m.max_seq_len, m.hidden) if self.learned_positions else None
        self.layers = nn.ModuleDict({str(i): Block(m) for i in layers})
        self.norm = _norm(m) if last else None
        self.output = nn.Linear(m.hidden, m.vocab, bias=False) if last else None
        if tied and self.output is not None and self.tok_embeddings is not None:
            self.output.weight = self.tok_embeddings.weight  # one stage, no TP (checked)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            seq = x.shape[1]
            x = self.leave(self.tok_embeddings(x))
            if self.pos_embeddings is not None:
                index, count = self.seq_shard
                local = seq // count
                positions = torch.arange(index * local, (index + 1) * local, device=x.device)
                x = x + self.pos_embeddings(positions)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None and self.output is not None:
            x = self.output(self.enter(self.norm(x)))
        return x


# --------------------------------------------------------------------------- --slice stand-ins

class _GatherSeq(torch.autograd.Function):
    """Stand-in for sequence parallelism's all-gather (s/t -> s tokens) on one rank: a
    tensor of the gathered size (t copies of the local shard), as torch's
    ``ColwiseParallel(input_layouts=Shard(1))`` produces and the next GEMM saves; backward
    stands in for the reduce-scatter (the local shard of the gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, t: int) -> torch.Tensor:
        ctx.local = x.shape[1]
        return torch.cat([x] * t, dim=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad[:, :ctx.local].contiguous(), None


class _ScatterSeq(torch.autograd.Function):
    """Stand-in for the reduce-scatter after a row-parallel GEMM (s -> s/t tokens)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, t: int) -> torch.Tensor:
        ctx.t = t
        return x[:, :x.shape[1] // t].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.cat([grad] * ctx.t, dim=1), None


def use_standins(chunk: Chunk, tp: int, sequence_parallel: bool) -> None:
    """--slice: one TP rank without communication. Without sequence parallelism TP's
    all-reduces leave shapes unchanged (identity); with it the residual stream holds
    s/t tokens and the TP region gathers them (:class:`_GatherSeq`, :class:`_ScatterSeq`)."""
    if tp == 1 or not sequence_parallel:
        return

    def gather(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _GatherSeq.apply(x, tp)
        return out

    def scatter(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _ScatterSeq.apply(x, tp)
        return out

    for block in blocks(chunk):
        block.enter, block.leave = gather, scatter
    chunk.enter, chunk.leave = gather, scatter
    chunk.seq_shard = (0, tp)


def tp_local_model(m: Model, tp: int) -> Model:
    """The widths one TP rank holds (Shoeybi et al. 2019): heads, MLP and vocabulary split
    by tp, key/value heads too (one each when tp exceeds them: Megatron-LM replicates
    them), the model width whole."""
    if tp == 1:
        return m
    import dataclasses

    return dataclasses.replace(m, heads=m.heads // tp, kv_heads=max(1, m.kv_heads // tp),
                               ffn_hidden=m.ffn_hidden // tp, vocab=m.vocab // tp,
                               head_dim=m.kv_channels, tied_embeddings=False)


def blocks(chunk: Chunk) -> list[Block]:
    """The chunk's layers (before any wrapper: TP, stand-ins and recompute come first)."""
    return [cast(Block, b) for b in chunk.layers.values()]


# --------------------------------------------------------------------------- the loss

def _all_reduce(x: torch.Tensor, group: Any, op: Any = None) -> None:
    """All-reduce over the TP group; None: one rank holds the whole vocabulary (tp 1, or a
    ``--slice`` rank, whose peers' shares are left out), nothing to reduce."""
    if group is not None:
        dist.all_reduce(x, op=dist.ReduceOp.SUM if op is None else op, group=group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary across the TP group, in fp32
    (Megatron-LM ``tensor_parallel.cross_entropy._VocabParallelCrossEntropy``, which
    Megatron runs at tp 1 too): the max, the target logit and the sum of exponentials are
    all-reduced; backward reuses the saved fp32 softmax in place (4*b*s*V/t bytes,
    autoplan's logits term). ``F.cross_entropy`` instead keeps its fp32 log-softmax and
    makes two more fp32 tensors of that size in backward: about 3x the memory."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, group: Any,
                vocab_start: int) -> torch.Tensor:
        x = logits.float().flatten(0, -2)
        target = target.flatten()
        local = x.shape[-1]
        top = x.max(dim=-1).values
        _all_reduce(top, group, dist.ReduceOp.MAX)
        x.sub_(top.unsqueeze(-1))
        outside = (target < vocab_start) | (target >= vocab_start + local)
        index = (target - vocab_start).clamp(0, local - 1)
        picked = x.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        _all_reduce(picked, group)
        x.exp_()
        total = x.sum(dim=-1)
        _all_reduce(total, group)
        x.div_(total.unsqueeze(-1))
        ctx.save_for_backward(x, outside, index)
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return (total.log() - picked).mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, outside, index = ctx.saved_tensors
        softmax.scatter_add_(-1, index.unsqueeze(-1), -(~outside).float().unsqueeze(-1))
        softmax.mul_(grad / softmax.shape[0])
        return softmax.to(ctx.dtype).view(ctx.shape), None, None, None


def make_loss(tp_group: Any, tp_rank: int, tp: int, vocab: int) -> Callable[..., torch.Tensor]:
    """The loss on the last stage: Megatron's fp32 cross-entropy, vocab-parallel when tp > 1
    (tp 1 or ``tp_group`` None: over this rank's ``vocab`` columns alone)."""
    group = tp_group if tp > 1 else None
    start = tp_rank * (vocab // tp)

    def vocab_parallel_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _VocabParallelCrossEntropy.apply(logits, target, group, start)
        return out
    return vocab_parallel_loss


# --------------------------------------------------------------------------- parallelism

@dataclass(frozen=True, slots=True)
class FsdpSettings:
    """How one ZeRO stage maps onto FSDP2 (what each rank keeps between and inside steps).

    ======  ===============  ====================  =========================================
    zero    data-parallel    reshard after fwd     gradients
            mesh (replicate,
            shard)
    ======  ===============  ====================  =========================================
    0       (dp, 1)          no                    fp32, whole, all-reduced after the last
                                                   microbatch (HSDP with a shard size of 1)
    1       (1, dp)          no                    fp32, whole, accumulated unsharded over the
                                                   microbatches, reduce-scattered after the
                                                   last (optimizer states sharded)
    2       (1, dp)          no                    reduce-scattered every microbatch, kept
                                                   sharded
    3       (1, dp)          yes                   as 2; parameters gathered layer by layer
    ======  ===============  ====================  =========================================
    """

    replicate: int
    shard: int
    reshard_after_forward: bool
    sync_every_microbatch: bool


def fsdp_settings(zero: ZeroStage, dp: int) -> FsdpSettings:
    if zero is ZeroStage.NONE:
        return FsdpSettings(dp, 1, False, False)
    return FsdpSettings(1, dp, zero is ZeroStage.PARAMETERS, zero >= ZeroStage.GRADIENTS)


def apply_tp(chunk: Chunk, tp_mesh: Any, sequence_parallel: bool) -> None:
    """torchtitan's Llama tensor-parallel plan (torchtitan/models/llama3/infra/parallelize.py),
    on the fused Q/K/V and gate/up projections (Megatron-LM's): one column-parallel GEMM
    each, so backward all-reduces two input gradients per layer, as Megatron-LM does
    (Shoeybi et al. 2019, Fig. 4) and autoplan prices (``parallel.tp.layer_seconds``)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sp = sequence_parallel
    seq = Shard(1) if sp else Replicate()
    top: dict[str, Any] = {}
    if chunk.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if chunk.pos_embeddings is not None:
        chunk.seq_shard = (tp_mesh.get_local_rank(), tp_mesh.size()) if sp else (0, 1)
    if chunk.output is not None:
        if sp:
            top["norm"] = SequenceParallel()
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1),
                                        use_local_output=True)
    if top:
        parallelize_module(chunk, tp_mesh, top)
    for block in blocks(chunk):
        plan: dict[str, Any] = {
            "attention.wqkv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=seq),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        }
        if sp:
            plan.update({
                "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                                desired_input_layouts=(Replicate(),)),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                                   desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)


def apply_recompute(chunk: Chunk, recompute: Recompute) -> None:
    """Full: checkpoint every layer (its input is kept, the layer rerun in backward);
    selective: checkpoint the attention core only (Korthikanti et al. 2022, Sec. 4.2)."""
    if recompute is Recompute.NONE:
        return
    if recompute is Recompute.SELECTIVE:
        for block in blocks(chunk):
            block.attention.recompute_core = True
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name in list(chunk.layers):
        chunk.layers[name] = checkpoint_wrapper(chunk.layers[name], preserve_rng_state=False)


def apply_fsdp(chunk: Chunk, dp_mesh: Any, settings: FsdpSettings) -> None:
    """FSDP2 per layer and once around the chunk (torchtitan's wrapping), bf16 compute,
    fp32 gradient reduction."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in chunk.layers.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=policy,
                    reshard_after_forward=settings.reshard_after_forward)
    fully_shard(chunk, mesh=dp_mesh, mp_policy=policy,
                reshard_after_forward=settings.reshard_after_forward)


def preload(device: torch.device) -> None:
    """Import every torch module a run uses and run each kind of kernel once, tiny: the
    libraries' one-time state (Python modules, oneDNN/cuBLAS kernels and handles, thread
    pools) then exists before the memory baseline is taken, and is not counted as the
    plan's memory."""
    import torch.distributed.algorithms._checkpoint.checkpoint_wrapper  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    import torch.utils.checkpoint  # noqa: F401

    lin = nn.Linear(64, 64, device=device, dtype=torch.bfloat16)
    x = torch.randn(2, 16, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    q = lin(x).view(2, 16, 4, 16).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    loss = F.cross_entropy(out.float().flatten(0, -2), torch.zeros(out[..., 0].numel(), dtype=torch.long,
                                                                   device=device))
    loss.backward()
    p = torch.zeros(64, device=device, requires_grad=True)
    p.grad = torch.zeros_like(p)
    adamw([p]).step()


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules with parameters of ``dtype``."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def init_weights(module: nn.Module, generator_seed: int) -> None:
    """Normal(0, 0.02) weights, zero biases, unit norms (values do not change timing)."""
    torch.manual_seed(generator_seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, INIT_STD)


# --------------------------------------------------------------------------- placement

def chunk_layers(stage_layers: Sequence[int], pp: int, vpp: int,
                 chunks: Sequence[pipeline_layout.Chunk] | None = None) -> list[list[int]]:
    """Layer indices of every virtual stage (model chunk), in model order; which chunks
    a rank runs is ``schedules.orders.stage_chunks``. A plan's per-chunk layout
    (``chunks``) where it has one, else uniform layers per chunk when vpp > 1."""
    total = sum(stage_layers)
    if chunks is not None:
        counts = [c.layers for c in chunks]
    elif vpp == 1:
        counts = list(stage_layers)
    else:
        counts = [total // (pp * vpp)] * (pp * vpp)
    out, start = [], 0
    for n in counts:
        out.append(list(range(start, start + n)))
        start += n
    return out


def make_schedule(schedule: Schedule, stages: list[Any], microbatches: int,
                  loss_fn: Callable[..., torch.Tensor]) -> Any:
    from torch.distributed import pipelining

    # torch's class for the schedule (its registry spec): zb-h1 with one chunk per rank
    # runs as torch's interleaved zero-bubble schedule (Qi et al. 2024's ZB-H1 B/W split
    # and ordering); zb-h2, v-half and v-min have none (validate refuses them)
    assert schedule.spec.torch_class is not None, schedule
    cls = getattr(pipelining, schedule.spec.torch_class)
    if schedule.spec.torch_multi_stage:  # takes a list of stages (PipelineScheduleMulti)
        return cls(stages, n_microbatches=microbatches, loss_fn=loss_fn)
    return cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)


def adamw(params: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
    """AdamW with fp32 moments; the fused kernel (no full-size temporaries) where torch has
    one for these parameters, else the per-tensor loop."""
    try:
        return torch.optim.AdamW(params, lr=1e-5, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(params, lr=1e-5, foreach=False)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (a plain tensor is its own)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


class RankStates:
    """Megatron-LM's mixed-precision distributed optimizer as one data-parallel rank (rank 0
    of ``d``) keeps it (docs/distrib_optimizer.md): the model's bf16 parameters; an fp32
    main-gradient buffer every backward accumulates into (a hook frees each bf16 gradient
    as soon as it is added), whole, or only this rank's 1/d of it under ZeRO-2; fp32 master
    weights and Adam moments for this rank's 1/d of the parameters under ZeRO-1 and 2
    (all of them under ZeRO-0). A step runs Adam on the master shard and copies it back
    into the bf16 parameters it covers. With d = 1 that is the whole optimizer (no
    communication to leave out); with d > 1 (``--slice``) the reduce-scatter of the
    gradients and the all-gather of the other ranks' parameters are what is left out.
    TP-sharded (DTensor) parameters keep their local shard."""

    def __init__(self, params: Sequence[torch.Tensor], zero: ZeroStage, d: int):
        self.params = list(dict.fromkeys(params))  # tied weights once
        n = sum(_local(p).numel() for p in self.params)
        shard = -(-n // d)
        self.opt_hi = shard if zero >= ZeroStage.OPTIMIZER else n
        self.grad_hi = shard if zero >= ZeroStage.GRADIENTS else n
        device = _local(self.params[0]).device
        self.main_grad = torch.zeros(self.grad_hi, dtype=torch.float32, device=device)
        self.master = torch.zeros(self.opt_hi, dtype=torch.float32, device=device, requires_grad=True)
        self.offsets: dict[int, int] = {}
        off = 0
        for p in self.params:
            self.offsets[id(p)] = off
            numel = _local(p).numel()
            hi = min(off + numel, self.opt_hi)
            if off < hi:
                with torch.no_grad():
                    self.master[off:hi] = _local(p).detach().flatten()[:hi - off].float()
            p.register_post_accumulate_grad_hook(self._accumulate)
            off += numel
        self.optimizer = adamw([self.master])

    def _accumulate(self, p: torch.Tensor) -> None:
        assert p.grad is not None
        off = self.offsets[id(p)]
        grad = _local(p.grad)
        hi = min(off + grad.numel(), self.grad_hi)
        if off < hi:
            # upcast first: torch's CPU add of a bf16 tensor into an fp32 one takes a
            # non-vectorized path (~3 ns per element); Megatron-LM fuses this accumulation
            # into the weight-gradient GEMM (gradient_accumulation_fusion)
            self.main_grad[off:hi] += grad.flatten()[:hi - off].float()
        p.grad = None

    def step(self) -> None:
        self.master.grad = self.main_grad[:self.opt_hi]
        self.optimizer.step()
        with torch.no_grad():
            for p in self.params:
                off, local = self.offsets[id(p)], _local(p)
                hi = min(off + local.numel(), self.opt_hi)
                if off < hi:
                    local.view(-1)[:hi - off].copy_(self.master[off:hi])
        self.master.grad = None
        self.main_grad.zero_()

    def bytes(self) -> dict[str, int]:
        moments = sum(v.numel() * v.element_size() for st in self.optimizer.state.values()
                      for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        return {"params": sum(_local(p).numel() * _local(p).element_size() for p in self.params),
                "grads": self.main_grad.numel() * 4,
                "optimizer": self.master.numel() * 4 + moments}


def state_bytes(modules: Sequence[nn.Module], optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds in parameters (fp32 shards), gradients and optimizer states."""
    local = _local
    params = {id(p): p for m in modules for p in m.parameters()}
    p_bytes = sum(local(p).numel() * local(p).element_size() for p in params.values())
    g_bytes = sum(local(p.grad).numel() * local(p.grad).element_size()
                  for p in params.values() if p.grad is not None)
    o_bytes = 0
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                o_bytes += local(v).numel() * local(v).element_size()
    return {"params": p_bytes, "grads": g_bytes, "optimizer": o_bytes}


def seeds(dp_index: int, step: int) -> int:
    return 1000003 * dp_index + step


def random_batch(vocab: int, rows: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets; every rank of one data-parallel replica draws the same."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (rows, seq + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def check_finite(loss: torch.Tensor) -> None:
    if not math.isfinite(float(loss)):
        raise FloatingPointError(f"the loss is {float(loss)}")
