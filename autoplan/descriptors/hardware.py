"""The system: devices, links and clusters. YAML numbers are human-scale with the
unit in the key; fields here are SI (FLOP/s, bytes, bytes/s, seconds)."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from autoplan.descriptors.strict import Fields
from autoplan.errors import AutoplanError
from autoplan.units import GiB
from autoplan.vocab import Dtype

GB = 1e9
TFLOPS = 1e12

# Defaults for the efficiency block of a device file. They are starting points,
# not measurements: benchmarks/accuracy.py fits gemm and the links' efficiency
# per device class on published runs, and the built-in files carry the fitted
# values with that provenance.
DEFAULT_GEMM_EFFICIENCY = 0.70  # large bf16 GEMMs reach ~70-80% of peak (cuBLAS on A100/H100)
DEFAULT_GEMM_HALF_GFLOP = 2.0  # GEMM size at which half of that is reached
DEFAULT_ATTENTION_EFFICIENCY = 0.55  # FlashAttention-2 fwd+bwd: ~50-70% of peak (Dao 2023, Fig. 4)
DEFAULT_HBM_EFFICIENCY = 0.80  # STREAM-like kernels reach ~80% of datasheet HBM bandwidth
DEFAULT_RESERVE_GIB = 3.0  # CUDA context + NCCL buffers + allocator fragmentation
DEFAULT_LINK_EFFICIENCY = 0.80  # NCCL bus bandwidth / link bandwidth on large messages
DEFAULT_KERNEL_GAP_US = 0.0  # GPU time between back-to-back kernels (device files set theirs)
# Host link and host memory (offload, kernels/offload.py). Pinned copies of 256 MiB-1 GiB
# between an H200 and its host over PCIe Gen5 x16 ran at 55.0-55.3 GB/s each way; the best,
# 55.3, is 87.8% of the link's 63.0 GB/s per direction (32 GT/s x 16 lanes x 128/130;
# benchmarks/host_offload.py, benchmarks/host/h200-2026-11-26.json); taken for every host
# link, C2C included (unmeasured).
HOST_LINK_EFFICIENCY = 0.878
# STREAM-style kernels sustain 73-79% of the DRAM wire rate (TI SPRACV1B Table 3-3: copy,
# scale, add, triad 73-79%); 0.75 of a node's datasheet DRAM bandwidth is taken.
HOST_MEM_EFFICIENCY = 0.75


class Correction(Protocol):
    """Measured over analytic time of one kernel or collective, learned from a microbenchmark
    profile (the surrogate of :mod:`autoplan.measured.surrogate`). A device carrying one is
    another device: it takes part in the device's equality and hash, so memoized costs of
    corrected and uncorrected devices never mix. Each method returns the factor the cost
    model multiplies its analytic time by (1.0 where the profile has nothing to say)."""

    def gemm(self, m: float, n: float, k: float, dtype: Dtype) -> float:
        """An (m x k) @ (k x n) GEMM computed in ``dtype``."""
        ...

    def attention(self, batch_heads: float, seq: float, head_dim: float, kv_ratio: float,
                  causal: bool, backward: bool) -> float:
        """One flash-attention call: batch x query heads, queries (= keys), channels per head,
        query heads per key/value head; the forward or the backward alone."""
        ...

    def collective(self, op: str, nbytes: float, ranks: int, per_domain: int) -> float:
        """One collective (``op`` as in a profile row) of ``nbytes`` over ``ranks`` ranks,
        ``per_domain`` of them in each NVLink domain."""
        ...

    def decode(self, batch: float, context: float, heads: float, kv_heads: float, head_dim: float,
               kv_bytes: float) -> float | None:
        """One decode attention call: ``batch`` sequences of one query each reading ``context``
        tokens of KV cache at ``kv_bytes`` per element; None where the profile has nothing to
        say (the caller keeps its analytic time)."""
        ...

    def moe(self, tokens: float, hidden: float, inter: float, top_k: int, experts: int, moe_tp: int,
            moe_ep: int, dtype: Dtype) -> float | None:
        """One rank's routed experts of an MoE layer (the engine's fused MoE kernel) for
        ``tokens`` tokens; None where the profile measured no such kernel in ``dtype`` (the
        caller falls back to its GEMM ratio)."""
        ...

    def host_kernel_s(self) -> tuple[float, float] | None:
        """Measured host seconds of an eager layer's forward per kernel it issues, and of
        its backward per forward kernel (the profile's ``host`` rows); None where it
        measured none."""
        ...


class MeasuredKernels(Protocol):
    """Measured kernel grids a training cost reads instead of its curves where they cover a
    kernel (:class:`autoplan.measured.kernels.KernelTables`, attached by the training door
    ``measured.door.corrected``). Like a :class:`Correction`, a device carrying one is another
    device (equality and hash), so memoized costs with and without it never mix."""

    def gemm(self, m: float, n: float, k: float, dtype: Dtype
             ) -> tuple[float, tuple[float, float, float]] | None:
        """(seconds, shape): the measured time of an (m x k) @ (k x n) GEMM in ``dtype`` at the
        nearest shape inside the grid, and that shape (the one asked where it lies inside);
        None where nothing was measured in ``dtype``."""
        ...

    def collective(self, op: str, nbytes: float, ranks: int) -> float | None:
        """Seconds of one NCCL collective (all_reduce, all_gather, reduce_scatter, all_to_all)
        on an ``nbytes`` buffer over ``ranks`` GPUs of one NVLink domain; None where not
        measured on that many GPUs."""
        ...


class MeasuredMixers(Protocol):
    """Measured token-mixer tables serving reads where they cover a layer
    (:class:`autoplan.measured.mixer_tables.MixerTables`, attached by the serving door
    ``measured.door.corrected`` for the plan's engine and version): one layer's Gated
    DeltaNet kernels, Mamba-2 conv, DeepSeek Sparse Attention block. Like a
    :class:`Correction`, a device carrying them is another device (equality and hash)."""

    def seconds(self, kind: str, phase: str, key: str, batch: float, length: float
                ) -> tuple[float, float, float] | None:
        """(seconds, batch, length): one layer's measured time for ``batch`` sequences of
        ``length`` tokens (``phase`` context: tokens computed; generation: one token, DSA
        reading ``length`` tokens of cache) at the nearest point inside the table, and that
        point; None where no table of ``kind`` applies to ``key`` in ``phase``."""
        ...

    def source(self, kind: str, phase: str, key: str) -> str | None:
        """The file that prices ``key`` of ``kind`` in ``phase``; None where none does."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One accelerator."""

    name: str
    peak_bf16_flops: float
    peak_fp16_flops: float
    peak_fp8_flops: float | None
    mem_bytes: float
    hbm_Bps: float
    gemm_efficiency: float = DEFAULT_GEMM_EFFICIENCY
    gemm_half_flop: float = DEFAULT_GEMM_HALF_GFLOP * 1e9
    attention_efficiency: float = DEFAULT_ATTENTION_EFFICIENCY
    hbm_efficiency: float = DEFAULT_HBM_EFFICIENCY
    reserve_bytes: float = DEFAULT_RESERVE_GIB * GiB
    # kernel physics (compute.py): streaming multiprocessors (0: no wave quantization);
    # fp8 GEMMs' own large-GEMM efficiency (None: gemm_efficiency); flash attention's
    # backward and the Hopper-class kernel's rates (None: the forward's, flash2's);
    # the query length at which attention reaches half its long-sequence rate; and the
    # GPU-side gap every kernel pays (launch latency, ramp-up and tail)
    sms: int = 0
    gemm_fp8_efficiency: float | None = None
    # fp4 GEMMs' own large-GEMM efficiency (None: fp8's, then gemm_efficiency)
    gemm_fp4_efficiency: float | None = None
    attention_backward_efficiency: float | None = None
    attention_fa3_efficiency: float | None = None
    attention_fa3_backward_efficiency: float | None = None
    attention_seq_half: float = 0.0
    kernel_gap_s: float = DEFAULT_KERNEL_GAP_US * 1e-6
    # economics (autoplan.whatif): board power running kernels and idle, in watts, and a
    # rental price in USD per GPU-hour; None where the device file gives none
    power_load_W: float | None = None
    power_idle_W: float | None = None
    price_per_gpu_hour: float | None = None
    # dense fp4 (NVFP4) tensor-core peak, FLOP/s; None: the device has no fp4 GEMMs (serving's
    # fp4 weights then run fp8 GEMMs, serving/cost.py compute_dtype)
    peak_fp4_flops: float | None = None
    # what a device measured with ``autoplan bench`` says of itself where it is no GPU (a CPU
    # core per rank: autoplan/measured/machine.py fits both). elementwise_Bps: the rate at
    # which a layer's memory-bound passes move the bytes ``kernels.layer`` counts for them,
    # as the device's software runs them (eager PyTorch's unfused norm, RoPE, activation,
    # casts and their dispatch on a CPU); None: the fused kernels' rate, hbm_Bps x
    # hbm_efficiency. overlaps_communication: False where communication cannot run beside
    # compute (one core per rank computes and runs gloo's collectives in turn): tensor-
    # and data-parallel collectives then add to the compute instead of hiding behind it.
    elementwise_Bps: float | None = None
    overlaps_communication: bool = True
    # measured/analytic ratios from a profile (autoplan.measured.surrogate.calibrate); not in
    # the descriptor file, and not written by to_dict
    correction: Correction | None = None
    # measured kernel grids training reads where they cover a kernel (kernels/compute.py,
    # kernels/comm.py; attached by the training door, never with a correction); not in the
    # descriptor file, and not written by to_dict
    kernels: MeasuredKernels | None = None
    # measured token-mixer tables serving reads where they cover a layer (serving/cost.py;
    # attached by the serving door for the plan's engine); not in the descriptor file
    mixer_kernels: MeasuredMixers | None = None
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cache_hash(self)

    def __hash__(self) -> int:
        return self._hash

    def peak_flops(self, dtype: Dtype) -> float:
        if dtype is Dtype.BF16:
            return self.peak_bf16_flops
        if dtype is Dtype.FP16:
            return self.peak_fp16_flops
        peak = self.peak_fp8_flops if dtype is Dtype.FP8 else self.peak_fp4_flops
        if peak is None:
            raise AutoplanError(f"device {self.name} has no {dtype.value} peak "
                                f"(peak_tflops.{dtype.value})")
        return peak

    def gemm_peak_efficiency(self, dtype: Dtype) -> float:
        """Large-GEMM fraction of the dtype's peak. fp8 and fp4 have their own where the
        device file gives one (efficiency.gemm_fp8, efficiency.gemm_fp4); fp4 without one
        takes fp8's, and both fall back to the 16-bit one."""
        if dtype is Dtype.FP4 and self.gemm_fp4_efficiency is not None:
            return self.gemm_fp4_efficiency
        if dtype in (Dtype.FP8, Dtype.FP4) and self.gemm_fp8_efficiency is not None:
            return self.gemm_fp8_efficiency
        return self.gemm_efficiency

    def supports(self, dtype: Dtype) -> bool:
        """Whether the device has tensor cores for ``dtype`` (a peak in its file)."""
        if dtype is Dtype.FP8:
            return self.peak_fp8_flops is not None
        if dtype is Dtype.FP4:
            return self.peak_fp4_flops is not None
        return True

    @property
    def mem_GiB(self) -> float:
        return self.mem_bytes / GiB

    @property
    def elementwise_rate(self) -> float:
        """Bytes/s of a layer's memory-bound passes: ``elementwise_Bps`` where the device
        file gives it, else the fused kernels' ``hbm_Bps`` x ``hbm_efficiency``."""
        return self.elementwise_Bps or self.hbm_Bps * self.hbm_efficiency

    def to_dict(self) -> dict[str, Any]:
        peaks = {"bf16": self.peak_bf16_flops / TFLOPS, "fp16": self.peak_fp16_flops / TFLOPS}
        if self.peak_fp8_flops is not None:
            peaks["fp8"] = self.peak_fp8_flops / TFLOPS
        if self.peak_fp4_flops is not None:
            peaks["fp4"] = self.peak_fp4_flops / TFLOPS
        return {
            "name": self.name,
            "peak_tflops": peaks,
            "mem_GiB": self.mem_bytes / GiB,
            "hbm_GBps": self.hbm_Bps / GB,
            "reserve_GiB": self.reserve_bytes / GiB,
            "efficiency": {
                "gemm": self.gemm_efficiency,
                "gemm_half_gflop": self.gemm_half_flop / 1e9,
                "attention": self.attention_efficiency,
                "hbm": self.hbm_efficiency,
                **_optional({"gemm_fp8": self.gemm_fp8_efficiency,
                             "gemm_fp4": self.gemm_fp4_efficiency,
                             "attention_backward": self.attention_backward_efficiency,
                             "attention_fa3": self.attention_fa3_efficiency,
                             "attention_fa3_backward": self.attention_fa3_backward_efficiency,
                             "attention_seq_half": self.attention_seq_half or None}),
            },
            **_optional({"sms": self.sms or None,
                         "kernel_gap_us": self.kernel_gap_s * 1e6 or None,
                         "price_per_gpu_hour": self.price_per_gpu_hour,
                         "elementwise_GBps": _scaled(self.elementwise_Bps, GB)}),
            **({} if self.overlaps_communication else {"overlaps_communication": False}),
            **({"power_W": {"load": self.power_load_W, "idle": self.power_idle_W}}
               if self.power_load_W is not None else {}),
        }


def _optional(values: dict[str, Any]) -> dict[str, Any]:
    """The entries that are set (device files written back stay as short as they were read)."""
    return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """A fabric as one GPU sees it: per-GPU, per-direction bandwidth and latency."""

    bandwidth_Bps: float
    latency_s: float  # per ring step, NCCL's Simple protocol
    efficiency: float = DEFAULT_LINK_EFFICIENCY
    # collectives pick the fastest of NCCL's LL / LL128 / Simple protocols (kernels/comm.py);
    # False: one alpha-beta protocol (a link fitted on a measured profile already is one)
    nccl_protocols: bool = True
    # (dtype, bytes/s) pairs, by dtype name: how fast a rank sums the buffer of a reducing collective
    # (all-reduce, reduce-scatter) in that dtype where the sum costs time of its own beside
    # the wire (gloo on a CPU adds on the rank's core: bf16 about 5x slower per byte than
    # fp32 in torch 2.13); empty: the sum hides in the transfer (NCCL's kernels)
    reduce_Bps: tuple[tuple[str, float], ...] = ()

    @property
    def effective_Bps(self) -> float:
        return self.bandwidth_Bps * self.efficiency

    def reduce_rate(self, dtype: str) -> float | None:
        """Bytes/s a rank sums a collective's buffer of ``dtype`` at; None: not given."""
        return dict(self.reduce_Bps).get(dtype)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bandwidth_GBps": self.bandwidth_Bps / GB,
            # rounded past float noise, so that a file written and read back is the same
            # link (a fitted 167.2 us would otherwise come back 167.19999999999996)
            "latency_us": round(self.latency_s * 1e6, 9),
            "efficiency": self.efficiency,
        }
        if not self.nccl_protocols:
            out["nccl_protocols"] = False
        if self.reduce_Bps:
            out["reduce_GBps"] = {dtype: rate / GB for dtype, rate in self.reduce_Bps}
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """Identical nodes of identical devices."""

    name: str
    device: Device
    gpus_per_node: int
    nvlink_domain: int
    intra_node: Link
    inter_node: Link
    nodes: int = 1
    # facility power over IT power (autoplan.whatif's energy); 1.0: the GPUs' own draw only
    pue: float = 1.0
    # the host, for offload (kernels/offload.py); None where the cluster file gives none (then
    # no plan offloads): each GPU's link to host memory (bytes/s per direction: PCIe, or
    # NVLink-C2C on Grace Hopper), and per node the host memory and its DRAM bandwidth
    host_link_Bps: float | None = None
    host_mem_bytes: float | None = None
    host_mem_Bps: float | None = None
    # reliability and checkpoint storage (autoplan.cost.reliability); None where the
    # cluster file gives none (then a run's wall clock is its steps alone): failures per
    # GPU-hour, the seconds from a failure to training again (detection, rescheduling, the
    # processes' start; the checkpoint's load is counted apart), the checkpoint file
    # system's aggregate bandwidth and one node's (bytes/s; None: no per-node limit)
    failures_per_gpu_hour: float | None = None
    restart_s: float | None = None
    storage_Bps: float | None = None
    storage_node_Bps: float | None = None
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cache_hash(self)

    def __hash__(self) -> int:
        return self._hash

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "device": self.device.to_dict(),
            "gpus_per_node": self.gpus_per_node,
            "nvlink_domain": self.nvlink_domain,
            "intra_node": self.intra_node.to_dict(),
            "inter_node": self.inter_node.to_dict(),
            "nodes": self.nodes,
            **({"pue": self.pue} if self.pue != 1.0 else {}),
            **_optional({"host_link_GBps": _scaled(self.host_link_Bps, GB),
                         "host_mem_GiB": _scaled(self.host_mem_bytes, GiB),
                         "host_mem_GBps": _scaled(self.host_mem_Bps, GB)}),
            **({"reliability": _optional({
                "failures_per_gpu_hour": self.failures_per_gpu_hour,
                "restart_minutes": None if self.restart_s is None else self.restart_s / 60})}
               if self.failures_per_gpu_hour is not None else {}),
            **({"storage": _optional({"bandwidth_GBps": _scaled(self.storage_Bps, GB),
                                      "node_GBps": _scaled(self.storage_node_Bps, GB)})}
               if self.storage_Bps is not None else {}),
        }

    @property
    def fails(self) -> bool:
        """The cluster file gives its failure rate and checkpoint storage: a run's wall clock
        counts failures, restarts and checkpoints (autoplan.cost.reliability)."""
        return self.failures_per_gpu_hour is not None and self.storage_Bps is not None

    @property
    def offloads(self) -> bool:
        """The cluster file describes the host: plans may offload to it."""
        return (self.host_link_Bps is not None and self.host_mem_bytes is not None
                and self.host_mem_Bps is not None)


MAX_POOLS = 8  # pools in one cluster: the search tries their orders (module search/pooled.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class PooledCluster:
    """A heterogeneous cluster: pools of identical nodes (each a :class:`Cluster` named by
    its pool: mixed GPU generations, or the same GPUs behind different NICs; Cephalo, Holmes)
    joined by one network. Data, tensor and context parallel groups stay inside a pool;
    pipeline stages may sit on different pools (``plan.Placement``)."""

    name: str
    pools: tuple[Cluster, ...]
    between_pools: Link  # per GPU, per direction, between ranks of two different pools
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cache_hash(self)

    def __hash__(self) -> int:
        return self._hash

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    def index(self, pool: str) -> int:
        return [p.name for p in self.pools].index(pool)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "pools": [p.to_dict() for p in self.pools],
                "between_pools": self.between_pools.to_dict()}


def _scaled(value: float | None, unit: float) -> float | None:
    return None if value is None else value / unit


# what a device file may say, from a CPU core (a GFLOP/s, a MiB, a MB/s) to a thousand
# times today's largest accelerator (B200: 2.25 PFLOP/s dense fp8, 192 GB, 8 TB/s): past
# these a number is not a device, and arithmetic on it would give no step time worth showing
PEAK_TFLOPS_RANGE = (1e-3, 1e7)
DEVICE_MEM_GIB_RANGE = (2.0 ** -10, 1e6)
HBM_GBPS_RANGE = (1e-3, 1e7)


def read_device(f: Fields) -> Device | None:
    before = len(f.problems)
    name = f.name("name")
    peaks = f.child("peak_tflops", f.raw("peak_tflops"))
    lo, hi = PEAK_TFLOPS_RANGE
    bf16 = peaks.float("bf16", min=lo, max=hi)
    fp16 = peaks.float("fp16", bf16, min=lo, max=hi)  # default: the bf16 peak
    fp8 = peaks.float("fp8", None, min=lo, max=hi)
    fp4 = peaks.float("fp4", None, min=lo, max=hi)  # dense NVFP4: serving's fp4 GEMMs
    peaks.float("tf32", None, min=lo, max=hi)  # accepted for completeness; no GEMM here runs in tf32
    peaks.close()
    mem = f.float("mem_GiB", min=DEVICE_MEM_GIB_RANGE[0], max=DEVICE_MEM_GIB_RANGE[1])
    hbm = f.float("hbm_GBps", min=HBM_GBPS_RANGE[0], max=HBM_GBPS_RANGE[1])
    reserve = f.float("reserve_GiB", DEFAULT_RESERVE_GIB, min=0.0, max=DEVICE_MEM_GIB_RANGE[1])
    eff = f.child("efficiency", f.raw("efficiency", {}))
    gemm = eff.float("gemm", DEFAULT_GEMM_EFFICIENCY, min=0.01, max=1.0)
    half = eff.float("gemm_half_gflop", DEFAULT_GEMM_HALF_GFLOP, min=0.0)
    attn = eff.float("attention", DEFAULT_ATTENTION_EFFICIENCY, min=0.01, max=1.0)
    hbm_eff = eff.float("hbm", DEFAULT_HBM_EFFICIENCY, min=0.01, max=1.0)
    fp8_eff = eff.float("gemm_fp8", None, min=0.01, max=1.0)
    fp4_eff = eff.float("gemm_fp4", None, min=0.01, max=1.0)
    attn_b = eff.float("attention_backward", None, min=0.01, max=1.0)
    fa3 = eff.float("attention_fa3", None, min=0.01, max=1.0)
    fa3_b = eff.float("attention_fa3_backward", None, min=0.01, max=1.0)
    seq_half = eff.float("attention_seq_half", 0.0, min=0.0, max=1e7)
    eff.close()
    sms = f.int("sms", 0, min=0, max=100_000)
    gap = f.float("kernel_gap_us", DEFAULT_KERNEL_GAP_US, min=0.0, max=1e4)
    price = f.float("price_per_gpu_hour", None, positive=True, max=1e6)
    elementwise = f.float("elementwise_GBps", None, min=HBM_GBPS_RANGE[0], max=HBM_GBPS_RANGE[1])
    overlaps = f.bool("overlaps_communication", True)
    load = idle = None
    if f.has("power_W"):
        power = f.child("power_W", f.raw("power_W"))
        load = power.float("load", positive=True, max=1e5)
        idle = power.float("idle", min=0.0, max=1e5)
        power.close()
        if load is not None and idle is not None and idle > load:
            power.fail("idle", f"expected at most the load power ({load:g} W), got {idle:g}")
    f.close()
    if len(f.problems) > before:
        return None
    assert bf16 is not None and fp16 is not None and mem is not None and hbm is not None
    return Device(
        name=name,
        peak_bf16_flops=bf16 * TFLOPS,
        peak_fp16_flops=fp16 * TFLOPS,
        peak_fp8_flops=None if fp8 is None else fp8 * TFLOPS,
        peak_fp4_flops=None if fp4 is None else fp4 * TFLOPS,
        mem_bytes=mem * GiB,
        hbm_Bps=hbm * GB,
        gemm_efficiency=gemm,
        gemm_half_flop=half * 1e9,
        attention_efficiency=attn,
        hbm_efficiency=hbm_eff,
        reserve_bytes=reserve * GiB,
        sms=sms,
        gemm_fp8_efficiency=fp8_eff,
        gemm_fp4_efficiency=fp4_eff,
        attention_backward_efficiency=attn_b,
        attention_fa3_efficiency=fa3,
        attention_fa3_backward_efficiency=fa3_b,
        attention_seq_half=seq_half,
        kernel_gap_s=gap * 1e-6,
        power_load_W=load,
        power_idle_W=idle,
        price_per_gpu_hour=price,
        elementwise_Bps=None if elementwise is None else elementwise * GB,
        overlaps_communication=overlaps,
    )


# the largest NVLink domain built (NVL576 is announced; NVL72 ships): a bound, not a model
MAX_NVLINK_DOMAIN = 1 << 12


def read_link(f: Fields) -> Link | None:
    before = len(f.problems)
    # physical ranges: 1 MB/s to 100 TB/s per GPU, at most a second per step
    bandwidth = f.float("bandwidth_GBps", positive=True, min=1e-3, max=1e5)
    latency = f.float("latency_us", min=0.0, max=1e6)
    efficiency = f.float("efficiency", DEFAULT_LINK_EFFICIENCY, min=0.01, max=1.0)
    protocols = f.bool("nccl_protocols", True)
    reduce: list[tuple[str, float]] = []
    if f.has("reduce_GBps"):
        rates = f.child("reduce_GBps", f.raw("reduce_GBps"))
        for dtype in REDUCE_DTYPES:
            rate = rates.float(dtype, None, positive=True, max=1e5)
            if rate is not None:
                reduce.append((dtype, rate * GB))
        rates.close()
    f.close()
    if len(f.problems) > before:
        return None
    return Link(bandwidth_Bps=bandwidth * GB, latency_s=latency * 1e-6, efficiency=efficiency,
                nccl_protocols=protocols, reduce_Bps=tuple(sorted(reduce)))


REDUCE_DTYPES = ("fp32", "bf16", "fp16")  # what a link's reduce_GBps may name


def read_cluster(f: Fields, device: Device | None) -> Cluster | None:
    """``device`` is resolved by the caller (a name, a path or an inline mapping)."""
    before = len(f.problems)
    name = f.name("name")
    gpus_per_node = f.int("gpus_per_node", min=1)
    domain = f.int("nvlink_domain", gpus_per_node, min=1, max=MAX_NVLINK_DOMAIN)
    intra = read_link(f.child("intra_node", f.raw("intra_node")))
    inter = read_link(f.child("inter_node", f.raw("inter_node")))
    nodes = f.int("nodes", 1, min=1)
    pue = f.float("pue", 1.0, min=1.0, max=10.0)
    host_link = f.float("host_link_GBps", None, positive=True, max=1e5)
    host_mem = f.float("host_mem_GiB", None, positive=True, max=1e7)
    host_bw = f.float("host_mem_GBps", None, positive=True, max=1e6)
    per_gpu_hour = per_node_day = restart = storage = storage_node = None
    if f.has("reliability"):
        per_gpu_hour, per_node_day, restart = _read_reliability(
            f.child("reliability", f.raw("reliability")), gpus_per_node)
    if f.has("storage"):
        storage, storage_node = _read_storage(f.child("storage", f.raw("storage")))
    if f.has("reliability") != f.has("storage"):
        f.fail("storage" if f.has("reliability") else "reliability",
               "missing: a run's failures and its checkpoints are costed together (give "
               "reliability and storage both)")
    f.close(extra_known=["device"])
    given = [k for k in ("host_link_GBps", "host_mem_GiB", "host_mem_GBps") if k in f.data]
    if given and len(given) < 3:
        missing = [k for k in ("host_link_GBps", "host_mem_GiB", "host_mem_GBps") if k not in given]
        f.fail(missing[0], f"missing: offload needs the host link, memory and its bandwidth "
                           f"together (given: {', '.join(given)})")
    if gpus_per_node and domain and domain % gpus_per_node and gpus_per_node % domain:
        f.fail(
            "nvlink_domain",
            f"expected a multiple or a divisor of gpus_per_node ({gpus_per_node}), got {domain}",
        )
    if len(f.problems) > before or device is None or intra is None or inter is None:
        return None
    return Cluster(
        name=name,
        device=device,
        gpus_per_node=gpus_per_node,
        nvlink_domain=domain,
        intra_node=intra,
        inter_node=inter,
        nodes=nodes,
        pue=pue,
        host_link_Bps=None if host_link is None else host_link * GB,
        host_mem_bytes=None if host_mem is None else host_mem * GiB,
        host_mem_Bps=None if host_bw is None else host_bw * GB,
        failures_per_gpu_hour=(per_node_day / (24 * gpus_per_node) if per_node_day is not None
                               else per_gpu_hour),
        restart_s=restart,
        storage_Bps=None if storage is None else storage * GB,
        storage_node_Bps=None if storage_node is None else storage_node * GB,
    )


# A failure rate from the largest run published (Llama 3, 16,384 H100: 419 unexpected
# interruptions in 54 days, 2.0e-5 per GPU-hour) times a thousand is no cluster's; a
# hundred-thousandth of it (a GPU failing once in 5,700 years) is no failure model: leave
# ``reliability`` out instead. Per node-day the same bounds, converted by the node's GPUs.
MAX_FAILURES_PER_GPU_HOUR = 0.02
MIN_FAILURES_PER_GPU_HOUR = 2e-10
# A checkpoint file system, and one node's link to it: 1 MB/s (the slowest link a cluster
# file may give, ``read_link``) to 10 PB/s in all, 100 TB/s a node
MIN_STORAGE_GBPS = 1e-3


def _read_reliability(f: Fields, gpus_per_node: int | None
                      ) -> tuple[float | None, float | None, float | None]:
    """``reliability: {failures_per_gpu_hour | failures_per_node_day, restart_minutes}``:
    (failures per GPU-hour, per node-day, restart seconds); one of the first two is given.
    A failure rate per node-day is bounded as one per GPU-hour is, converted at the
    cluster's ``gpus_per_node`` (None where that is unreadable: the largest NVLink domain's)."""
    if not f.ok:  # not a mapping (reported)
        return None, None, None
    if not f.data:
        f.fail("", "expected failures_per_gpu_hour (or failures_per_node_day) and "
                   "restart_minutes, got an empty mapping (leave reliability out where the "
                   "cluster's failures are not modelled)")
        return None, None, None
    per_day = 24 * (gpus_per_node or MAX_NVLINK_DOMAIN)
    per_gpu = f.float("failures_per_gpu_hour", None, min=MIN_FAILURES_PER_GPU_HOUR,
                      max=MAX_FAILURES_PER_GPU_HOUR)
    per_node_day = f.float("failures_per_node_day", None, min=MIN_FAILURES_PER_GPU_HOUR * per_day,
                           max=MAX_FAILURES_PER_GPU_HOUR * per_day)
    restart = f.float("restart_minutes", None, min=0.0, max=1e4)
    f.close()
    if per_gpu is not None and per_node_day is not None:
        f.fail("failures_per_node_day", "give failures_per_gpu_hour or failures_per_node_day, not both")
    elif per_gpu is None and per_node_day is None and not any(
            k in f.data for k in ("failures_per_gpu_hour", "failures_per_node_day")):
        f.fail("failures_per_gpu_hour", "missing: failures per GPU-hour (or per node-day)")
    if restart is None and "restart_minutes" not in f.data:
        f.fail("restart_minutes", "missing: minutes from a failure to training again")
    return per_gpu, per_node_day, None if restart is None else restart * 60


def _read_storage(f: Fields) -> tuple[float | None, float | None]:
    """``storage: {bandwidth_GBps, node_GBps}``: the checkpoint file system's aggregate
    bandwidth, and one node's (optional)."""
    if not f.ok:  # not a mapping (reported)
        return None, None
    if not f.data:
        f.fail("", "expected bandwidth_GBps (and optionally node_GBps), got an empty mapping "
                   "(leave storage out where the cluster's failures are not modelled)")
        return None, None
    total = f.float("bandwidth_GBps", None, min=MIN_STORAGE_GBPS, max=1e7)
    node = f.float("node_GBps", None, min=MIN_STORAGE_GBPS, max=1e5)
    f.close()
    if total is None and "bandwidth_GBps" not in f.data:
        f.fail("bandwidth_GBps", "missing: the checkpoint file system's aggregate bandwidth")
    return total, node


def cache_hash(obj: Any) -> None:
    """Frozen descriptors are hashed on every memoized cost lookup: hash them once (the
    tuple of the fields they compare)."""
    object.__setattr__(obj, "_hash", hash(_compared(type(obj))(obj)))


_COMPARED: dict[type, Callable[[Any], tuple]] = {}  # per class: its compared fields


def _compared(cls: type) -> Callable[[Any], tuple]:
    """The fields instances of ``cls`` compare, as a tuple (read once per class)."""
    getter = _COMPARED.get(cls)
    if getter is None:
        names = [f.name for f in dataclasses.fields(cls) if f.compare]
        # attrgetter of one name gives the value, not a tuple
        getter = _COMPARED[cls] = (operator.attrgetter(*names) if len(names) > 1
                                   else lambda obj: (getattr(obj, names[0]),))
    return getter
