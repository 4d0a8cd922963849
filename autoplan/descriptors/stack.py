"""The software stack a plan runs on: which kernels it launches, which communication it
overlaps with compute, and the fixed host costs it pays. Hardware says how fast a kernel
can run (``descriptors/hardware.py``); the stack says which kernels run and what sits
between them. A search space names its stack (``stack:`` in ``searchspace/*.yaml``, the
stack its launcher runs); a job or plan may name another (``stack: torchtitan-compiled``).

Built-in stacks live in ``profiles/stacks/``. Their kernel choices and overlap flags are
read from each framework's documented defaults (cited in the files); the host costs are
fitted by ``benchmarks/accuracy.py --fit`` with leave-one-source-out cross-validation."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from autoplan.descriptors.precision import FP32_STATES, StatePrecision, read_states
from autoplan.descriptors.strict import Fields
from autoplan.vocab import OffloadOverlap, TpOverlap


class AttentionKernel(str, enum.Enum):
    """The attention implementation a stack runs."""

    FLASH2 = "flash2"
    """FlashAttention-2 (Dao 2023): tiled, scores kept on chip."""
    FLASH3 = "flash3"
    """Hopper-class fused attention: FlashAttention-3 (Shah et al. 2024) or cuDNN's fused
    attention through Transformer Engine. Devices without its rate fall back to flash2."""
    UNFUSED = "unfused"
    """QK^T and AV as batched GEMMs around a fused scale-mask-softmax kernel that reads and
    writes the s x s scores in HBM (Megatron-LM before FlashAttention; Shoeybi et al. 2019)."""


DEFAULT_STACK = "megatron-core"


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """A training framework as the cost model sees it."""

    name: str
    summary: str = ""
    attention: AttentionKernel = AttentionKernel.FLASH2
    # kernels one transformer layer launches per microbatch, forward (backward launches
    # twice as many: input and weight gradients). Fused stacks (Transformer Engine's
    # LayerNormLinear / LayerNormMLP, fused bias-activation and bias-dropout-add) launch
    # about half what an eager PyTorch block does.
    layer_kernels: int = 14
    # fraction of the kernel benchmarks' rates (device file) the stack's kernels sustain
    # inside a training step: sustained clocks under load, cache-cold operands, autocast
    # casts and layouts the benchmarks leave out; fitted on end-to-end runs per stack
    compute_efficiency: float = 1.0
    cuda_graphs: bool = False  # the step is captured: no per-kernel host dispatch
    host_kernel_s: float = 0.0  # host time to dispatch one kernel (eager PyTorch)
    step_overhead_s: float = 0.0  # per step: optimizer launch, grad-norm sync, logging
    overlap_grad_reduce: bool = True  # DP gradient reduction overlaps the backward
    overlap_param_gather: bool = True  # ZeRO-1/2 parameter all-gather overlaps the forward
    # ZeRO-3 parameters gathered and alive at once (0: a layer and the next, as FSDP)
    zero3_max_live_params: float = 0.0
    # compute slowed while NCCL kernels share the SMs (one CTA per channel; NCCL's
    # default up to 32 channels out of ~100-140 SMs)
    comm_compute_slowdown: float = 0.0
    # sequence parallelism: each column-parallel GEMM saves its all-gathered input for
    # backward (PyTorch DTensor: PrepareModuleInput(Shard(1) -> Replicate()) before
    # ColwiseParallel, torchtitan's TP plan), where Megatron's sequence-parallel linear saves
    # the local s/t shard and gathers it again in backward (Korthikanti et al. 2022, Sec. 4.2.2)
    sp_saves_gathered: bool = False
    # MoE: the router's probabilities scale the experts' activation (Megatron-Core >= 0.13,
    # GroupedMLP/TEGroupedMLP activation_func_with_probs), so the unpermute that sums the
    # expert outputs back keeps nothing; False: it scales and keeps the expert outputs
    moe_probs_in_activation: bool = False
    # an offloaded optimizer step: how its copies and CPU step overlap (vocab.OffloadOverlap)
    offload_overlap: OffloadOverlap = OffloadOverlap.NONE
    # how the layers' tensor-parallel collectives overlap their GEMMs (vocab.TpOverlap)
    tp_overlap: TpOverlap = TpOverlap.WGRAD
    # the gradients, master weights and moments its optimizer keeps where a job leaves them
    # unset (``states:`` in the file; descriptors/precision.py)
    states: StatePrecision = FP32_STATES
    # the weight-gradient GEMMs accumulate into the fp32 main gradients themselves
    # (Megatron-LM --gradient-accumulation-fusion, on by default); False: each microbatch's
    # bf16 gradients are cast and added into them in passes of their own (eager PyTorch:
    # autoplan validate's torch model, cost.stage.GRAD_ACCUMULATION_BYTES)
    grad_accumulation_fusion: bool = True
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from autoplan.descriptors.hardware import cache_hash

        cache_hash(self)

    def __hash__(self) -> int:
        return self._hash

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "summary": self.summary,
            "attention": self.attention.value,
            "layer_kernels": self.layer_kernels,
            "compute_efficiency": self.compute_efficiency,
            "cuda_graphs": self.cuda_graphs,
            "host_kernel_us": self.host_kernel_s * 1e6,
            "step_overhead_ms": self.step_overhead_s * 1e3,
            "overlap": {"grad_reduce": self.overlap_grad_reduce,
                        "param_gather": self.overlap_param_gather},
            "comm_compute_slowdown": self.comm_compute_slowdown,
            **({"zero3_max_live_params": self.zero3_max_live_params}
               if self.zero3_max_live_params else {}),
            **({"sp_saves_gathered": True} if self.sp_saves_gathered else {}),
            **({"moe_probs_in_activation": True} if self.moe_probs_in_activation else {}),
            **({"offload_overlap": self.offload_overlap.value}
               if self.offload_overlap is not OffloadOverlap.NONE else {}),
            **({"tp_overlap": self.tp_overlap.value}
               if self.tp_overlap is not TpOverlap.WGRAD else {}),
            **({"states": self.states.values()} if self.states != FP32_STATES else {}),
            **({} if self.grad_accumulation_fusion else {"grad_accumulation_fusion": False}),
        }


def read_stack(f: Fields) -> Stack | None:
    before = len(f.problems)
    name = f.name("name")
    summary = f.str("summary", "")
    attention = f.enum("attention", AttentionKernel, AttentionKernel.FLASH2)
    kernels = f.int("layer_kernels", 14, min=1, max=1000)
    compute = f.float("compute_efficiency", 1.0, min=0.05, max=1.0)
    graphs = f.bool("cuda_graphs", False)
    host = f.float("host_kernel_us", 0.0, min=0.0, max=1e4)
    step = f.float("step_overhead_ms", 0.0, min=0.0, max=1e5)
    ov = f.child("overlap", f.raw("overlap", {}))
    grad = ov.bool("grad_reduce", True)
    gather = ov.bool("param_gather", True)
    ov.close()
    slowdown = f.float("comm_compute_slowdown", 0.0, min=0.0, max=0.9)
    live = f.float("zero3_max_live_params", 0.0, min=0.0, max=1e15)
    gathered = f.bool("sp_saves_gathered", False)
    probs = f.bool("moe_probs_in_activation", False)
    offload = f.enum("offload_overlap", OffloadOverlap, OffloadOverlap.NONE)
    tp_overlap = f.enum("tp_overlap", TpOverlap, TpOverlap.WGRAD)
    sf = f.child("states", f.raw("states", {}))
    given = read_states(sf)
    sf.close()
    fused = f.bool("grad_accumulation_fusion", True)
    f.close()
    if len(f.problems) > before:
        return None
    states = StatePrecision(**{k: v for k, v in given.items() if v is not None})
    return Stack(name=name, summary=summary, attention=attention, layer_kernels=kernels,
                 compute_efficiency=compute,
                 cuda_graphs=graphs, host_kernel_s=host * 1e-6, step_overhead_s=step * 1e-3,
                 overlap_grad_reduce=grad, overlap_param_gather=gather,
                 comm_compute_slowdown=slowdown, zero3_max_live_params=live,
                 sp_saves_gathered=gathered, moe_probs_in_activation=probs,
                 offload_overlap=offload, tp_overlap=tp_overlap, states=states,
                 grad_accumulation_fusion=fused)
