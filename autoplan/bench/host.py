"""The host's cost of launching a layer's kernels in eager PyTorch, measured.

An eager training step cannot run faster than the host can issue its kernels: each
launched op pays the Python module call, autograd's bookkeeping, the ATen dispatcher and
the launch itself (on CUDA, cudaLaunchKernel) before the device sees it. The cost model
takes a layer pass as max(device time, kernels x host time per kernel)
(``kernels.compute._fixed_costs``); this measures the second factor where it is paid,
for the forward and the backward apart (the backward's ops are issued by autograd's C++
engine, without the forward's Python).

What runs is the decoder layer ``autoplan validate`` trains (``bench.torch_model.Block``),
shrunk until its kernels are negligible next to their dispatch (hidden 64, 16 tokens), so
wall time over a pass is host time: on a CPU the ops run inline and take about a
microsecond each at this size; on a GPU the kernels queue behind the host and the pass
returns as soon as the last one is issued (the device is synchronized between passes,
outside the timing). The ops counted are the ATen operators that produce new data (a
view, transpose or detach launches no kernel), counted once per pass with a dispatch
mode; the time is taken without it.

Rows (profile.py): kind ``host``, op ``layer_forward`` | ``layer_backward``; ``n`` the
layer's hidden size, ``seq`` its tokens, ``k`` the kernels one pass issues, ``seconds`` the
median pass time over ``k`` (host seconds per launched kernel), p10/p90 likewise.

Imported only by ``autoplan bench`` (torch is an optional extra).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from autoplan.bench.timing import Budget, summarize
from autoplan.descriptors.model import Model
from autoplan.vocab import Activation, Position

Row = dict[str, Any]

HIDDEN, HEADS, FFN, TOKENS = 64, 4, 128, 16
# a Llama-style layer (RMSNorm, RoPE, GQA-free attention, SwiGLU), the shape of every
# built-in dense model: what a stack's eager layer issues per pass
PROBE = Model(name="host-probe", layers=1, hidden=HIDDEN, heads=HEADS, kv_heads=HEADS,
              ffn_hidden=FFN, vocab=256, activation=Activation.SWIGLU, position=Position.ROPE,
              tied_embeddings=False, max_seq_len=TOKENS)


def launched_ops(fn: Callable[[], Any]) -> int:
    """ATen operators ``fn`` dispatches that make new data (views excluded)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if not func.is_view:
                Count.ops += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.ops


def measure(device_kind: str, budget: Budget, dtype: str = "fp32") -> list[Row]:
    """The two host rows (forward, backward) of the probe layer on this machine's device."""
    import torch

    from autoplan.bench.torch_model import Block

    device = torch.device("cuda" if device_kind == "cuda" else "cpu")
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    layer = Block(PROBE).to(device=device, dtype=torch_dtype)
    x = torch.randn(1, TOKENS, HIDDEN, device=device, dtype=torch_dtype, requires_grad=True)

    def sync() -> None:
        if device_kind == "cuda":
            torch.cuda.synchronize()

    def forward() -> Any:
        return layer(x)

    out = forward()
    grad = torch.ones_like(out)

    def backward_of(y: Any) -> Callable[[], None]:
        return lambda: y.backward(grad)

    k_forward = launched_ops(forward)
    k_backward = launched_ops(backward_of(forward()))
    fwd: list[float] = []
    bwd: list[float] = []
    spent, repeats = 0.0, 0
    while repeats < budget.warmup + budget.min_repeats or (
            spent < budget.seconds and repeats < budget.warmup + budget.max_repeats):
        layer.zero_grad(set_to_none=True)
        sync()
        t0 = time.perf_counter()
        y = forward()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        y.backward(grad)
        t3 = time.perf_counter()
        sync()
        if repeats >= budget.warmup:
            fwd.append((t1 - t0) / k_forward)
            bwd.append((t3 - t2) / k_backward)
        spent += t3 - t0
        repeats += 1
    return [_row("layer_forward", dtype, k_forward, fwd), _row("layer_backward", dtype, k_backward, bwd)]


def _row(op: str, dtype: str, kernels: int, per_kernel: list[float]) -> Row:
    """A profile row: the median and percentiles as every bench row takes them
    (``timing.summarize``: interpolated within the samples, so p10 <= median <= p90)."""
    return {"kind": "host", "op": op, "dtype": dtype, "n": HIDDEN, "seq": TOKENS, "k": kernels,
            "batch": 1, **summarize(per_kernel).columns()}
