"""A decoder layer's memory-bound passes as ``autoplan validate``'s torch model runs them.

``autoplan validate`` trains :class:`autoplan.bench.torch_model.Block` in eager PyTorch:
each norm, rotary embedding, activation, residual add and cast is its own pass over the
tensor (with its dispatch), where autoplan's cost model prices the fused kernels of a
training stack moving each operand once (``kernels.layer.elementwise_bytes_forward``). On a
CPU those passes run many times slower than a streaming copy of the same bytes (bf16 is
computed through fp32, norms in fp32, tensors larger than the caches): the profile's
copy/add/mul rows cannot show it. This runs the layer itself, forward and backward, with
its GEMMs and attention kernel swapped for stand-ins that hand back ready tensors of the
right shapes (their time is the profile's gemm and attention rows), so what is timed is
everything else the layer does.

Imported only by ``autoplan bench`` (torch is an optional extra).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from autoplan.bench import torch_model as tm
from autoplan.bench.worker import M_MMAP_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
from autoplan.descriptors.model import Model

# glibc's defaults (mallopt(3)): 64 Ki mmapped regions at most; 128 KiB thresholds
GLIBC_MMAP_MAX, GLIBC_THRESHOLD = 65536, 128 * 1024


@contextlib.contextmanager
def caching_allocator(device: str) -> Iterator[None]:
    """On a CPU with glibc: while inside, freed memory is kept for reuse (no mmap, no
    trimming), as validate's workers run their timed steps (``worker.use_caching_allocator``);
    glibc's default thresholds are set back after. Elsewhere nothing changes."""
    libc = None
    if device == "cpu":
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL("libc.so.6")
            if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)):
                libc = None
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(M_MMAP_MAX, GLIBC_MMAP_MAX)
            libc.mallopt(M_MMAP_THRESHOLD, GLIBC_THRESHOLD)
            libc.mallopt(M_TRIM_THRESHOLD, GLIBC_THRESHOLD)


class _Ready(torch.autograd.Function):
    """Stand-in for a kernel: returns views of tensors made beforehand, forward and backward."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, grads: tuple[torch.Tensor, ...],
                *inputs: torch.Tensor) -> torch.Tensor:
        ctx.grads = grads
        return out.view(out.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return (None, None, *(g.view(g.shape) for g in ctx.grads))


class _NoGemm(nn.Module):
    """Stand-in for ``nn.Linear(k, n)`` on inputs of a fixed shape (..., k)."""

    def __init__(self, shape: tuple[int, ...], n: int, dtype: torch.dtype, device: str):
        super().__init__()
        self.out = torch.zeros(*shape[:-1], n, dtype=dtype, device=device)
        self.grad_in = torch.zeros(*shape, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Ready.apply(self.out, (self.grad_in,), x)
        return out


def _no_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **_: Any) -> torch.Tensor:
    out: torch.Tensor = _Ready.apply(torch.zeros_like(q), (torch.zeros_like(q), torch.zeros_like(k),
                                                          torch.zeros_like(v)), q, k, v)
    return out


def layer_passes(model: Model, tp: int, tokens: int, dtype: torch.dtype,
                 device: str = "cpu") -> Callable[[], Any]:
    """One TP rank's layer of ``model`` (the widths :func:`torch_model.tp_local_model`
    gives it) on ``tokens`` tokens (one sequence): a call runs its forward and backward
    with stand-ins for the GEMMs and attention."""
    local = tm.tp_local_model(model, tp)
    with torch.device(device), tm.default_dtype(dtype):
        block = tm.Block(local)
    block.train()
    shape = (1, tokens, local.hidden)
    d = local.kv_channels
    attn, ffn = block.attention, block.feed_forward
    attn.wqkv = _NoGemm(shape, (local.heads + 2 * local.kv_heads) * d, dtype, device)  # type: ignore[assignment]
    attn.wo = _NoGemm((1, tokens, local.heads * d), local.hidden, dtype, device)  # type: ignore[assignment]
    attn.sdpa = _no_attention
    ffn.w1 = _NoGemm(shape, (2 if ffn.gated else 1) * local.ffn_hidden, dtype, device)  # type: ignore[assignment]
    ffn.w2 = _NoGemm((1, tokens, local.ffn_hidden), local.hidden, dtype, device)  # type: ignore[assignment]
    x = torch.randn(*shape, dtype=dtype, device=device, requires_grad=True)
    dy = torch.randn(*shape, dtype=dtype, device=device)

    def step() -> Any:
        return torch.autograd.grad(block(x), [x, *block.parameters()], dy)

    return step
