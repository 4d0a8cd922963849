"""What ``autoplan bench`` measures: shapes, sizes and time budgets per preset and device.

``tiny`` runs in seconds (tests, a smoke check on a new machine); ``default`` is the
profile a surrogate is fitted on (about a minute on a 2-core CPU; real model shapes on
CUDA); ``full`` widens the sweeps. CPU presets cap every case by FLOPs or bytes so a slow
CPU (bf16 GEMMs without hardware support run ~10x slower than fp32) still finishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autoplan.bench.timing import Budget
from autoplan.errors import InputError
from autoplan.units import GiB, KiB, MiB

PRESET_NAMES = ("tiny", "default", "full")


@dataclass(frozen=True, slots=True, kw_only=True)
class Preset:
    name: str
    device_kind: str  # cpu | cuda
    models: tuple[str, ...]  # built-in models whose layer shapes are measured (--model overrides)
    dtypes: tuple[str, ...]  # kernel dtypes (profile names)
    tps: tuple[int, ...]  # tensor-parallel degrees the GEMM and attention shapes are sharded by
    tokens: tuple[int, ...]  # micro-batch x sequence tokens: the m of a layer's GEMMs
    squares: tuple[int, ...]  # n x n x n GEMMs: the efficiency curve between model shapes
    seqs: tuple[int, ...]  # attention sequence lengths (batch 1, causal)
    elementwise_bytes: tuple[int, ...]  # size of each tensor of copy / add / mul
    message_bytes: tuple[int, ...]  # collective buffer sizes (profile.py's nbytes convention)
    collective_dtype: str
    max_gemm_flops: Mapping[str, float]  # per dtype: bigger GEMMs are skipped
    max_attention_flops: Mapping[str, float]  # per dtype, forward + backward of one call
    budget: Budget  # per kernel case
    collective_budget: Budget  # per collective case
    timeout_s: float  # the collective workers, all cases together
    # the host probe's passes (bench/host.py): a few hundred, about half a second on a
    # 2-core CPU; the tiny preset's smoke check takes a handful
    host_budget: Budget = Budget(warmup=5, min_repeats=20, max_repeats=300, seconds=0.5)
    # the dtypes the reducing collectives also run in (bench/collectives.py): on a CPU,
    # training reduces bf16 activations (tensor parallel) and fp32 gradients (data
    # parallel), and gloo's sum costs per byte what the dtype makes it
    collective_reduce_dtypes: tuple[str, ...] = ()
    # the eager layer's memory-bound passes (bench/eager.py, op ``layer``): tokens of one
    # microbatch (the validate examples run 512 and 4096), in the dtype validate computes in;
    # none on CUDA, where validate's GPU descriptor prices fused kernels
    layer_tokens: tuple[int, ...] = ()
    layer_dtype: str = "bf16"


def _powers(lo: int, hi: int, step: int = 4) -> tuple[int, ...]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= step
    return tuple(out)


_TINY_BUDGET = Budget(warmup=1, min_repeats=3, max_repeats=5, seconds=0.005)
_UNCAPPED = 1e18

_PRESETS: dict[tuple[str, str], Preset] = {}


def _add(p: Preset) -> None:
    _PRESETS[(p.name, p.device_kind)] = p


_add(Preset(
    name="tiny", device_kind="cpu", models=("llama3-8b",), dtypes=("fp32", "bf16"),
    tps=(8,), tokens=(16,), squares=(64, 128), seqs=(128,),
    elementwise_bytes=(64 * KiB, 1 * MiB), message_bytes=(4 * KiB, 256 * KiB),
    collective_dtype="fp32",
    # bf16 GEMMs without hardware support run at ~1 GFLOP/s on a 2-core CPU (a 16 x 16032
    # x 4096 logits GEMM took 2.7 s a call): tiny keeps them under a quarter GFLOP
    max_gemm_flops={"fp32": 4e9, "bf16": 2.5e8}, max_attention_flops={"fp32": 1e9, "bf16": 1e9},
    budget=_TINY_BUDGET, collective_budget=_TINY_BUDGET, timeout_s=120, host_budget=_TINY_BUDGET,
    collective_reduce_dtypes=("bf16",), layer_tokens=(64,),
))
_add(Preset(
    name="default", device_kind="cpu", models=("llama3-8b",), dtypes=("fp32", "bf16"),
    tps=(1, 2, 4, 8), tokens=(32, 128, 512), squares=_powers(64, 2048, 2), seqs=(256, 512, 1024),
    elementwise_bytes=_powers(64 * KiB, 64 * MiB), message_bytes=_powers(4 * KiB, 64 * MiB),
    collective_dtype="fp32",
    # GEMMs: ~0.05 s per call at 100-200 GFLOP/s (fp32 on 2 cores), bf16 a quarter of the
    # FLOPs; attention forward + backward runs at ~50 GFLOP/s on 2 cores
    max_gemm_flops={"fp32": 8e9, "bf16": 2e9},
    max_attention_flops={"fp32": 4e9, "bf16": 2e9},
    budget=Budget(warmup=1, min_repeats=5, max_repeats=50, seconds=0.08),
    collective_budget=Budget(warmup=2, min_repeats=5, max_repeats=50, seconds=0.08),
    timeout_s=600, collective_reduce_dtypes=("bf16",), layer_tokens=(128, 512, 2048, 4096),
))
_add(Preset(
    name="full", device_kind="cpu", models=("llama3-8b",), dtypes=("fp32", "bf16"),
    tps=(1, 2, 4, 8), tokens=(32, 128, 512, 2048), squares=_powers(64, 4096, 2),
    seqs=(256, 512, 1024, 2048, 4096),
    elementwise_bytes=_powers(16 * KiB, 256 * MiB), message_bytes=_powers(1 * KiB, 256 * MiB),
    collective_dtype="fp32",
    max_gemm_flops={"fp32": 1.5e11, "bf16": 4e10},
    max_attention_flops={"fp32": 1.5e11, "bf16": 4e10},
    budget=Budget(warmup=2, min_repeats=5, max_repeats=100, seconds=0.2),
    collective_budget=Budget(warmup=3, min_repeats=10, max_repeats=100, seconds=0.2),
    timeout_s=3600, collective_reduce_dtypes=("bf16",), layer_tokens=(128, 512, 2048, 4096, 16384),
))
_add(Preset(
    name="tiny", device_kind="cuda", models=("llama3-8b",), dtypes=("bf16",),
    tps=(8,), tokens=(256,), squares=(256, 1024), seqs=(512,),
    elementwise_bytes=(1 * MiB, 16 * MiB), message_bytes=(64 * KiB, 16 * MiB),
    collective_dtype="bf16",
    max_gemm_flops={"bf16": _UNCAPPED}, max_attention_flops={"bf16": _UNCAPPED},
    budget=_TINY_BUDGET, collective_budget=_TINY_BUDGET, timeout_s=300, host_budget=_TINY_BUDGET,
))
_add(Preset(
    name="default", device_kind="cuda", models=("llama3-8b", "llama3-70b"), dtypes=("bf16",),
    tps=(1, 2, 4, 8), tokens=(2048, 4096, 8192, 16384), squares=_powers(256, 16384, 2),
    seqs=(2048, 4096, 8192, 16384),
    elementwise_bytes=_powers(1 * MiB, 1 * GiB), message_bytes=_powers(4 * KiB, 1 * GiB),
    collective_dtype="bf16",
    max_gemm_flops={"bf16": _UNCAPPED}, max_attention_flops={"bf16": _UNCAPPED},
    budget=Budget(warmup=3, min_repeats=10, max_repeats=100, seconds=0.1),
    collective_budget=Budget(warmup=3, min_repeats=10, max_repeats=100, seconds=0.1),
    timeout_s=1800,
))
_add(Preset(
    name="full", device_kind="cuda", models=("llama3-8b", "llama3-70b", "llama3-405b"),
    dtypes=("bf16", "fp16"),
    tps=(1, 2, 4, 8), tokens=(1024, 2048, 4096, 8192, 16384, 32768), squares=_powers(128, 16384, 2),
    seqs=(1024, 2048, 4096, 8192, 16384, 32768),
    elementwise_bytes=_powers(256 * KiB, 4 * GiB, 2), message_bytes=_powers(1 * KiB, 4 * GiB, 2),
    collective_dtype="bf16",
    max_gemm_flops={"bf16": _UNCAPPED, "fp16": _UNCAPPED},
    max_attention_flops={"bf16": _UNCAPPED, "fp16": _UNCAPPED},
    budget=Budget(warmup=5, min_repeats=20, max_repeats=200, seconds=0.2),
    collective_budget=Budget(warmup=5, min_repeats=20, max_repeats=200, seconds=0.2),
    timeout_s=3600,
))


def get_preset(name: str, device_kind: str) -> Preset:
    """The preset ``name`` for ``device_kind``; an unknown name is an input error."""
    found = _PRESETS.get((name, device_kind))
    if found is None:
        raise InputError.single("--preset", "", f"expected one of {', '.join(PRESET_NAMES)}, got {name!r}")
    return found
