"""Kernel microbenchmarks on one local device: GEMMs, causal attention, elementwise ops.

The GEMM shapes are the forward GEMMs of the chosen models' layers after TP sharding, taken
from the cost model itself (:func:`autoplan.kernels.layer.layer_gemms`), so the profile
measures exactly the shapes the cost model prices, each in the three layouts training runs
it (forward, input gradient, weight gradient: profile op ``linear``); a sweep of n x n x n
GEMMs fills in the efficiency curve between them. Attention is
``torch.nn.functional.scaled_dot_product_attention`` (causal, GQA), forward and backward.
Elementwise ops are memory bound (copy, add, mul).

Pure library: no printing; progress goes through the optional ``step`` callback. torch is
imported inside the functions that run kernels.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from autoplan.bench.presets import Preset
from autoplan.bench.timing import Budget, Clock, CpuClock, CudaClock, Row, Step, measure, summarize
from autoplan.descriptors.model import Model
from autoplan.kernels import mixers
from autoplan.kernels.layer import Shard, elementwise_bytes_forward, layer_gemms
from autoplan.measured.profile import row_flops
from autoplan.units import MiB
from autoplan.vocab import Dtype

ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# bytes each op reads + writes per element, in units of the tensor size: copy reads x and
# writes y; add and mul read a and b and write c
ELEMENTWISE_TRAFFIC = {"copy": 2, "add": 3, "mul": 3}
RANDOM_BLOCK = 1 << 16  # random values drawn per CPU tensor (see _Env.randn)
BWD_FLOOR = 1e-3  # backward alone is fwd+bwd minus fwd; floored at this share of fwd+bwd


@dataclass(frozen=True, slots=True)
class GemmCase:
    m: int
    n: int
    k: int
    dtype: str

    def row(self) -> Row:
        return {"kind": "gemm", "op": "linear", "dtype": self.dtype, "m": self.m, "n": self.n, "k": self.k}

    @property
    def label(self) -> str:
        return f"gemm {self.dtype} {self.m}x{self.n}x{self.k}"


@dataclass(frozen=True, slots=True)
class AttentionCase:
    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    dtype: str

    def row(self, op: str) -> Row:
        return {"kind": "attention", "op": op, "dtype": self.dtype, "batch": self.batch, "heads": self.heads,
                "kv_heads": self.kv_heads, "seq": self.seq, "head_dim": self.head_dim, "causal": 1}

    @property
    def flops(self) -> float:
        """Forward plus backward FLOPs of one call (profile.row_flops' accounting)."""
        return row_flops(self.row("sdpa_fwd")) + row_flops(self.row("sdpa_bwd"))

    @property
    def label(self) -> str:
        return f"attention {self.dtype} h{self.heads}/{self.kv_heads} s{self.seq} d{self.head_dim}"


@dataclass(frozen=True, slots=True)
class ElementwiseCase:
    op: str
    tensor_bytes: int  # size of each tensor the op touches
    dtype: str

    @property
    def numel(self) -> int:
        return self.tensor_bytes // ELEMENT_BYTES[self.dtype]

    def row(self) -> Row:
        nbytes = ELEMENTWISE_TRAFFIC[self.op] * self.numel * ELEMENT_BYTES[self.dtype]
        return {"kind": "elementwise", "op": self.op, "dtype": self.dtype, "nbytes": nbytes}

    @property
    def label(self) -> str:
        return f"{self.op} {self.dtype} {self.tensor_bytes / MiB:g} MiB"


@dataclass(frozen=True, slots=True)
class LayerCase:
    """A decoder layer's memory-bound passes as validate's eager torch model runs them
    (bench/eager.py): one TP rank of ``model`` on ``tokens`` tokens, forward and backward.
    Its row's ``nbytes`` is what the cost model counts of them: the forward's
    ``elementwise_bytes_forward`` and twice that for the backward (``compute.layer_times``)."""

    model: Model
    tp: int
    tokens: int
    dtype: str

    def row(self) -> Row:
        fwd = elementwise_bytes_forward(self.model, _shard(self.tp, self.tokens))
        return {"kind": "elementwise", "op": "layer", "dtype": self.dtype, "nbytes": round(3 * fwd),
                "n": self.model.hidden, "seq": self.tokens}

    @property
    def label(self) -> str:
        return f"eager layer passes {self.dtype} {self.model.name} tp{self.tp} {self.tokens} tokens"


Case = GemmCase | AttentionCase | ElementwiseCase | LayerCase


@dataclass(frozen=True, slots=True)
class MicroPlan:
    """The cases to run, and what the preset's caps or the models left out (for the header)."""

    cases: tuple[Case, ...]
    skipped: tuple[str, ...]


# -- shapes -----------------------------------------------------------------------------

def _shard(tp: int, tokens: int) -> Shard:
    """One rank's share of a layer: ``tokens`` rows (micro-batch x sequence), TP degree ``tp``."""
    return Shard(micro_batch=1, seq_len=tokens, tp=tp, cp=1, sequence_parallel=False, dtype=Dtype.BF16)


def _tp_fits(model: Model, tp: int) -> bool:
    """Megatron-LM splits heads over TP ranks: the query heads must divide."""
    return model.heads % tp == 0


def model_gemm_shapes(model: Model, tp: int, tokens: int) -> list[tuple[int, int, int]]:
    """(m, n, k) of one layer's forward GEMMs on one TP rank (dense MLP, or the MoE layer's
    router and shared experts; a hybrid model's of each kind of layer), and the vocab-parallel output GEMM of
    :func:`autoplan.kernels.compute.logits_times`: (tokens, vocab / tp, hidden)."""
    shard = _shard(tp, tokens)
    if model.is_hybrid:  # each kind of layer's own projections (kernels/mixers.py)
        gemms = [(g.m, g.n, g.k) for kind in model.kinds
                 for g in mixers.kind_gemms(model, kind, shard.tokens, shard.tp, shard.norm_tokens)]
    else:
        kinds = [model.is_moe] + ([False] if model.is_moe and model.dense_layers else [])
        gemms = [(g.m, g.n, g.k) for moe in kinds
                 for g in layer_gemms(model, shard.tokens, shard.tp, moe, shard.norm_tokens)]
    gemms.append((shard.tokens, model.vocab / tp, model.hidden))
    return [(round(m), math.ceil(n), round(k)) for m, n, k in gemms]


def _unique(items: Sequence[Any]) -> list[Any]:
    return list(dict.fromkeys(items))


def gemm_cases(preset: Preset, models: Sequence[Model]) -> tuple[list[GemmCase], int]:
    """The models' sharded shapes over the preset's TP degrees and token counts, then the
    square sweep; shapes over the preset's FLOP cap are dropped (and counted)."""
    shapes = [shape for model in models for tp in preset.tps if _tp_fits(model, tp)
              for tokens in preset.tokens for shape in model_gemm_shapes(model, tp, tokens)]
    shapes += [(s, s, s) for s in preset.squares]
    cases = [GemmCase(m, n, k, dt) for dt in preset.dtypes for m, n, k in _unique(shapes)]
    kept = [c for c in cases if row_flops(c.row()) <= preset.max_gemm_flops[c.dtype]]
    return kept, len(cases) - len(kept)


def attention_cases(preset: Preset, models: Sequence[Model]) -> tuple[list[AttentionCase], list[str]]:
    """Heads and KV heads of one TP rank (Megatron-LM: at least one KV head per rank)."""
    shapes, notes = [], []
    for model in models:
        if model.is_mla:  # q/k and v head widths differ; the profile has one head_dim column
            notes.append(f"attention of {model.name} (MLA: q/k and v head widths differ)")
            continue
        for tp in preset.tps:
            if _tp_fits(model, tp):
                shapes += [(model.heads // tp, max(1, model.kv_heads // tp), seq, model.kv_channels)
                           for seq in preset.seqs]
    cases = [AttentionCase(1, h, kv, s, d, dt) for dt in preset.dtypes for h, kv, s, d in _unique(shapes)]
    kept = [c for c in cases if c.flops <= preset.max_attention_flops[c.dtype]]
    if len(kept) < len(cases):
        notes.append(f"{len(cases) - len(kept)} attention shapes over the preset's FLOP cap")
    return kept, notes


def elementwise_cases(preset: Preset) -> list[ElementwiseCase]:
    return [ElementwiseCase(op, size, dt) for dt in preset.dtypes for op in ELEMENTWISE_TRAFFIC
            for size in preset.elementwise_bytes]


def layer_cases(preset: Preset, models: Sequence[Model]) -> list[LayerCase]:
    """The models' dense layers (their MoE layers are not built by validate) at each TP
    degree and each of the preset's ``layer_tokens``, in the dtype validate computes in."""
    return [LayerCase(model, tp, tokens, preset.layer_dtype) for model in models
            if model.layers > model.moe_layers and not model.is_mla
            for tp in preset.tps if _tp_fits(model, tp) for tokens in preset.layer_tokens]


def plan_micro(preset: Preset, models: Sequence[Model]) -> MicroPlan:
    gemms, gemm_skipped = gemm_cases(preset, models)
    attention, notes = attention_cases(preset, models)
    if gemm_skipped:
        notes.insert(0, f"{gemm_skipped} GEMM shapes over the preset's FLOP cap")
    return MicroPlan((*gemms, *attention, *elementwise_cases(preset), *layer_cases(preset, models)),
                     tuple(notes))


# -- running ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Env:
    torch: Any
    device: str  # "cpu" | "cuda"
    clock: Clock
    budget: Budget

    def dtype(self, name: str) -> Any:
        return {"fp32": self.torch.float32, "bf16": self.torch.bfloat16, "fp16": self.torch.float16}[name]

    def randn(self, *shape: int, dtype: str, grad: bool = False) -> Any:
        """Normal random values. On CPU, drawing hundreds of millions of them takes longer
        than the benchmark: a random block of RANDOM_BLOCK values is tiled instead (the
        kernels' speed does not depend on the values, only on their being normal floats)."""
        torch, numel = self.torch, math.prod(shape)
        if self.device == "cuda" or numel <= RANDOM_BLOCK:
            x = torch.randn(*shape, device=self.device, dtype=self.dtype(dtype))
        else:
            block = torch.randn(RANDOM_BLOCK, dtype=self.dtype(dtype))
            x = block.repeat(-(-numel // RANDOM_BLOCK))[:numel].reshape(shape)
        return x.requires_grad_(grad)

    def time(self, fn: Callable[[], Any]) -> list[float]:
        return measure(fn, self.clock, self.budget)


def _run_gemm(case: GemmCase, env: _Env) -> list[Row]:
    """A linear layer's three training GEMMs (profile op ``linear``), timed together; the row
    holds a third of their time. With x (m x k), the weight W stored (n x k) as torch's
    ``nn.Linear`` stores it, and dy (m x n): forward y = x @ W^T, input gradient
    dx = dy @ W, weight gradient dW = dy^T @ x, each m*n*k multiply-adds."""
    torch = env.torch
    x, w, dy = (env.randn(case.m, case.k, dtype=case.dtype), env.randn(case.n, case.k, dtype=case.dtype),
                env.randn(case.m, case.n, dtype=case.dtype))
    y, dx, dw = torch.empty_like(dy), torch.empty_like(x), torch.empty_like(w)

    def step() -> None:
        torch.mm(x, w.t(), out=y)
        torch.mm(dy, w, out=dx)
        torch.mm(dy.t(), x, out=dw)

    with torch.no_grad():
        samples = [t / 3 for t in env.time(step)]
    return [{**case.row(), **summarize(samples).columns()}]


def _run_elementwise(case: ElementwiseCase, env: _Env) -> list[Row]:
    torch = env.torch
    a, b = env.randn(case.numel, dtype=case.dtype), env.randn(case.numel, dtype=case.dtype)
    c = torch.empty_like(a)
    fn = {"copy": lambda: c.copy_(a), "add": lambda: torch.add(a, b, out=c),
          "mul": lambda: torch.mul(a, b, out=c)}[case.op]
    with torch.no_grad():
        samples = env.time(fn)
    return [{**case.row(), **summarize(samples).columns()}]


def _run_layer(case: LayerCase, env: _Env) -> list[Row]:
    """The layer's passes forward and backward (bench/eager.py), with the C allocator
    keeping what it frees, as validate's timed steps run (worker.py): otherwise each fresh
    tensor's page faults are timed too, which a training step does not pay."""
    from autoplan.bench.eager import caching_allocator, layer_passes

    with caching_allocator(env.device), env.torch.enable_grad():
        samples = env.time(layer_passes(case.model, case.tp, case.tokens, env.dtype(case.dtype),
                                        env.device))
    return [{**case.row(), **summarize(samples).columns()}]


@contextlib.contextmanager
def _fused_attention_only(env: _Env) -> Iterator[None]:
    """On CUDA, forbid SDPA's math fallback (it materialises s x s scores): a shape the
    fused kernels cannot take raises instead of being timed on the slow path."""
    if env.device != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                      SDPBackend.CUDNN_ATTENTION]):
        yield


def _gqa_in_kernel(q: Any, k: Any, v: Any, env: _Env) -> bool:
    """Whether SDPA takes these GQA tensors as they are (``enable_gqa``, torch >= 2.5), in a
    fused kernel, forward and backward."""
    torch = env.torch
    try:
        with _fused_attention_only(env), torch.enable_grad():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        return True
    except (TypeError, RuntimeError, ImportError, AttributeError):  # no enable_gqa, backend or API
        return False


def _attention_call(q: Any, k: Any, v: Any, env: _Env) -> tuple[Callable[[], Any], tuple[Any, ...]]:
    """The attention call for these tensors, and the tensors it differentiates. GQA runs in
    the kernel where it can; otherwise K and V are repeated to all query heads beforehand,
    outside the timed call (the same FLOPs; the fused GQA kernel would only load less)."""
    sdpa = env.torch.nn.functional.scaled_dot_product_attention
    if q.shape[1] == k.shape[1]:
        return (lambda: sdpa(q, k, v, is_causal=True)), (q, k, v)
    if _gqa_in_kernel(q, k, v, env):
        return (lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True)), (q, k, v)
    reps = q.shape[1] // k.shape[1]
    k2 = k.detach().repeat_interleave(reps, dim=1).requires_grad_(True)
    v2 = v.detach().repeat_interleave(reps, dim=1).requires_grad_(True)
    return (lambda: sdpa(q, k2, v2, is_causal=True)), (q, k2, v2)


def _backward_alone(fwd: Sequence[float], both: Sequence[float]) -> list[float]:
    """Backward seconds: each fwd+bwd sample minus the median forward, floored positive."""
    median_fwd = summarize(fwd).seconds
    return [max(t - median_fwd, BWD_FLOOR * t) for t in both]


def _run_attention(case: AttentionCase, env: _Env) -> list[Row]:
    torch, b, s, d = env.torch, case.batch, case.seq, case.head_dim
    q = env.randn(b, case.heads, s, d, dtype=case.dtype, grad=True)
    k = env.randn(b, case.kv_heads, s, d, dtype=case.dtype, grad=True)
    v = env.randn(b, case.kv_heads, s, d, dtype=case.dtype, grad=True)
    call, leaves = _attention_call(q, k, v, env)
    grad_out = env.randn(b, case.heads, s, d, dtype=case.dtype)

    def fwd_bwd() -> Any:
        return torch.autograd.grad(call(), leaves, grad_out)

    with torch.enable_grad():  # the forward as training runs it: saving what backward needs
        fwd = env.time(call)
        both = env.time(fwd_bwd)
    return [{**case.row("sdpa_fwd"), **summarize(fwd).columns()},
            {**case.row("sdpa_bwd"), **summarize(_backward_alone(fwd, both)).columns()}]


def clock_for(device_kind: str) -> Clock:
    return CudaClock(flush_l2=True) if device_kind == "cuda" else CpuClock()


def run_micro(plan: MicroPlan, device_kind: str, budget: Budget, step: Step | None = None) -> list[Row]:
    """Run every case of ``plan`` on the local ``device_kind`` device; one or two rows each."""
    import torch

    env = _Env(torch, device_kind, clock_for(device_kind), budget)
    rows: list[Row] = []
    for case in plan.cases:
        if isinstance(case, GemmCase):
            rows += _run_gemm(case, env)
        elif isinstance(case, AttentionCase):
            rows += _run_attention(case, env)
        elif isinstance(case, LayerCase):
            rows += _run_layer(case, env)
        else:
            rows += _run_elementwise(case, env)
        if step is not None:
            step(case.label)
    return rows
