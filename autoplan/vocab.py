"""The fixed vocabulary of autoplan: parallel axes and the choices a plan makes.

"axis" is a device-mesh axis, "degree" its size. Sequence parallelism is a flag
on TP and the ZeRO stage a property of DP, as in torchtitan's ParallelDims.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Axis(str, enum.Enum):
    """Device-mesh axes, listed innermost first (the rank order autoplan assumes).

    Megatron-LM's default order is tp-cp-ep-dp-pp: TP ranks are adjacent so
    they share NVLink, PP ranks are the farthest apart.
    """

    TP = "tp"
    """Tensor parallel: GEMMs split across ranks (Shoeybi et al. 2019)."""
    CP = "cp"
    """Context parallel: the sequence split across ranks (ring attention)."""
    DP = "dp"
    """Data parallel: replicas, optionally ZeRO-sharded."""
    PP = "pp"
    """Pipeline parallel: layers split into stages."""
    EP = "ep"
    """Expert parallel: MoE experts split across ranks carved from tp x cp x dp."""
    ETP = "etp"
    """Expert tensor parallel: each expert's MLP split across ranks (1 or tp)."""
    EDP = "edp"
    """Expert data parallel: replicas of the expert layers (tp*cp*dp / (ep*etp))."""
    DPR = "dp_replica"
    """Hybrid sharded data parallel's replicas: dp / dp_shard copies of the sharded states,
    the outermost data-parallel ranks (FSDP2 HSDP's replicate dimension)."""


class CpComm(str, enum.Enum):
    """How context parallelism exchanges the sequence (Megatron-LM --cp-comm-type)."""

    RING = "ring"
    """Ring attention: K and V chunks passed around the CP ring, overlapped with the
    attention of the chunk in hand (Liu et al. 2023; Megatron-LM's p2p)."""
    A2A = "a2a"
    """All-to-all before and after attention, which then runs on heads/cp with the whole
    sequence (DeepSpeed-Ulysses, Jacobs et al. 2023)."""


class StateDtype(str, enum.Enum):
    """Precision of gradients or optimizer moments held and reduced in training."""

    FP32 = "fp32"
    BF16 = "bf16"


class MasterWeights(str, enum.Enum):
    """How the optimizer keeps the weights it updates, beside the 16-bit ones the model
    computes with (``Job.master_weights``)."""

    FP32 = "fp32"
    """A full fp32 copy, 4 bytes a parameter, an optimizer state (sharded with it):
    Megatron-Core's distributed optimizer (distrib_optimizer.py ``shard_main_param``),
    DeepSpeed's fp32 partitions, FSDP's fp32 sharded parameters."""
    REMAINDERS = "remainders"
    """The fp32 master as the bf16 weight (its high 16 bits) and an int16 remainder, 2
    bytes a parameter in the optimizer's shard: apex DistributedFusedAdam's
    ``store_param_remainders``, which NeMo 1.x turns on for bf16 weights under
    distributed_fused_adam (megatron_base_model.py ``setup_optimization``), and
    Transformer Engine's FusedAdam under Megatron-Core's precision-aware optimizer. Only
    for bf16 weights in a sharded optimizer (zero >= 1): elsewhere a full fp32 copy
    (``descriptors.precision.StatePrecision.effective``)."""
    NONE = "none"
    """No master copy: the optimizer's dtype is the model's, and Adam updates the 16-bit
    weights in place (NeMo 1.x distributed_fused_adam with ``optim.dtype`` equal to the
    model's: store_params False, no remainders)."""


class MoeDispatch(str, enum.Enum):
    """How an MoE layer moves token copies to their experts' ranks and back."""

    ALLTOALL = "alltoall"
    """Megatron-Core's all-to-all token dispatcher (--moe-token-dispatcher-type alltoall):
    tokens permuted into one copy per routed expert, exchanged by NCCL all-to-all."""
    DEEPEP = "deepep"
    """DeepEP (DeepSeek-AI 2025) behind Megatron-Core's flex dispatcher
    (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep): each token
    sent once per destination node over RDMA, forwarded once per destination GPU over
    NVLink, expanded to its experts there."""


class Recompute(str, enum.Enum):
    """Activation recomputation, ordered from least to most memory saved."""

    NONE = "none"
    """Keep every activation."""
    SELECTIVE = "selective"
    """Recompute the attention core only (Korthikanti et al. 2022, Sec. 4.2)."""
    FULL = "full"
    """Keep each layer's input only, recompute the layer in backward."""

    @property
    def level(self) -> int:
        return _RECOMPUTE_LEVEL[self._value_]


_RECOMPUTE_LEVEL = {r.value: i for i, r in enumerate(Recompute)}


class RecomputeModule(str, enum.Enum):
    """What selective recompute recomputes, as Megatron-Core names it
    (``TransformerConfig.recompute_modules``, ``--recompute-modules``); selective recompute
    with none named recomputes the attention core, Megatron-Core's default."""

    CORE_ATTN = "core_attn"
    """The attention core (with a fused kernel: its softmax statistics only)."""
    LAYERNORM = "layernorm"
    """The two norms' outputs (the QKV and MLP-up GEMMs' inputs), output-discarding."""
    MLA_UP_PROJ = "mla_up_proj"
    """MLA's up projections and RoPE: the queries, keys and values from the latents."""
    MLP = "mlp"
    """The dense MLP: its input kept, its internals recomputed."""
    MOE_ACT = "moe_act"
    """The routed experts' activation function (its output, fc2's input), output-discarding."""
    MOE = "moe"
    """The whole MoE layer, its dispatch and combine included."""
    SHARED_EXPERTS = "shared_experts"
    """The MoE layer's shared experts."""


class ZeroStage(int, enum.Enum):
    """ZeRO stages (Rajbhandari et al. 2020): what the data-parallel group shards."""

    NONE = 0
    """Nothing sharded: plain data parallel."""
    OPTIMIZER = 1
    """Optimizer states sharded (Megatron-LM's distributed optimizer)."""
    GRADIENTS = 2
    """Optimizer states and gradients sharded."""
    PARAMETERS = 3
    """Optimizer states, gradients and parameters sharded (FSDP full shard)."""


class TpOverlap(str, enum.Enum):
    """How a stack overlaps a layer's tensor-parallel collectives (Shoeybi et al. 2019:
    with sequence parallelism an all-gather before each column-parallel linear and a
    reduce-scatter after each row-parallel one, forward and backward) with its GEMMs."""

    NONE = "none"
    """Every collective runs between the GEMMs, exposed (PyTorch DTensor's eager TP)."""
    WGRAD = "wgrad"
    """Forward exposed; backward collectives run beside the weight-gradient GEMMs
    (Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication): what those GEMMs
    outlast is hidden, and a schedule that defers W hides nothing."""
    USERBUFFERS = "userbuffers"
    """Transformer Engine's comm-GEMM overlap (Megatron-Core --tp-comm-overlap): each
    collective pipelined with its own linear's GEMM, by the method TE's defaults give each
    (``parallel.tp.userbuffers_exposed``). Needs sequence parallelism and TP in one node."""
    ASYNC = "async"
    """PyTorch's async TP (torch._inductor micro-pipeline TP, torchtitan's
    enable_async_tensor_parallel under torch.compile): all-gather-matmul and
    matmul-reduce-scatter split into tp chunks over symmetric memory, forward and backward
    (``parallel.tp.async_exposed``)."""


class OffloadOverlap(str, enum.Enum):
    """How a stack overlaps an offloaded optimizer step's three parts: the gradients'
    copy to the host, the CPU optimizer step and the updated weights' copy back."""

    NONE = "none"
    """One after another, after the backward."""
    BACKWARD = "backward"
    """Gradients stream to the host during the backward (ZeRO-Offload, Ren et al. 2021,
    Sec. 4.1: the swap overlaps the backward); the CPU step and the copy back follow."""
    PIPELINED = "pipelined"
    """Copies and CPU step overlap in chunks: Megatron-Core's HybridDeviceOptimizer with
    --overlap-cpu-optimizer-d2h-h2d builds one CPU optimizer per parameter tensor, copies
    every gradient down on a side stream, steps each tensor once its copy lands and copies
    it back up on another (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py): the
    slowest of the three sets the pace."""


@dataclass(frozen=True, slots=True)
class Offload:
    """What a plan moves to host memory: the optimizer states with the fp32 master weights
    (ZeRO-Offload; Megatron-Core's --optimizer-cpu-offload), and a fraction of the
    activations the pipeline holds for later backwards (PipeOffload, Wan et al. 2025)."""

    optimizer: bool = False
    activations: float = 0.0  # 0.0..1.0

    @property
    def any(self) -> bool:
        return self.optimizer or self.activations > 0

    def to_dict(self) -> dict[str, bool | float]:
        return {"optimizer": self.optimizer, "activations": self.activations}


NO_OFFLOAD = Offload()


class Dtype(str, enum.Enum):
    """The precision a device's GEMMs run in: a training job's (bf16, fp16, fp8) or a
    serving engine's (those and fp4). A device file prices each in ``peak_tflops``."""

    BF16 = "bf16"
    """bfloat16 inputs, fp32 accumulation."""
    FP16 = "fp16"
    """float16 inputs (training: with loss scaling), fp32 accumulation."""
    FP8 = "fp8"
    """8-bit floating point (e4m3/e5m2) inputs, as Transformer Engine and the serving
    engines' fp8 GEMMs run them."""
    FP4 = "fp4"
    """4-bit floating point (NVFP4: e2m1 with an fp8 scale per 16 elements) inputs, the
    serving engines' fp4 GEMMs on Blackwell. Not a training precision: no stack autoplan
    exports trains in it (:attr:`trains`)."""

    @property
    def trains(self) -> bool:
        """Whether a training job may compute in it (``job.dtype``, ``--dtype``)."""
        return self is not Dtype.FP4


TRAINING_DTYPES = tuple(d for d in Dtype if d.trains)
"""The dtypes a training job may name, in the enum's order."""


class Activation(str, enum.Enum):
    """MLP activation. The gated ones (GLU variants) have three weight matrices."""

    GELU = "gelu"
    RELU2 = "relu2"
    SWIGLU = "swiglu"
    GEGLU = "geglu"
    # Kimi-K3's SiTU-GLU (its modeling_kimi_linear.py SituAndMul): 4 tanh(g/4) sigmoid(g) times
    # 25 tanh(u/25), the gate and up projections as SwiGLU's
    SITU = "situ"

    @property
    def gated(self) -> bool:
        return self in (Activation.SWIGLU, Activation.GEGLU, Activation.SITU)


class Position(str, enum.Enum):
    """Position encoding."""

    ROPE = "rope"
    LEARNED = "learned"
    NONE = "none"  # no position encoding (NoPE: Nemotron-H's attention, Kimi Linear's MLA)


class Norm(str, enum.Enum):
    """Normalization layer."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"
