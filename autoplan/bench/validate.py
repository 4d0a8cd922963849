"""``autoplan validate``: run a plan for real with torch's own distributed engine and
compare the measured step time and peak memory with autoplan's prediction for exactly
what ran.

Pure library: no printing, no exits. Bad input and what torch cannot run here are
:class:`~autoplan.errors.InputError` (exit 2, naming the plan file and field); a rank
that fails or a run that times out is :class:`ValidateError` (exit 2, the rank's own
message). The command line turns :class:`Validation` into a table or JSON and exits 0
within tolerance, 1 not.

Two modes:

- distributed (``--device cpu``): the plan's world size as local processes
  (:mod:`autoplan.bench.worker`) over gloo, one pipeline stage (or ``vpp`` chunks) per
  pp rank, tp (+ sp) with DTensor, dp / ZeRO with FSDP2 (dp = 1: Megatron-style fp32 main
  gradients and master weights, nothing to shard; see :mod:`autoplan.bench.torch_model`),
  each rank pinned to its own cores. Compared: the median over the timed steps of the
  step time (each step's time is the slowest rank's), and each rank's peak memory
  against its stage's predicted peak (summary: the largest of each).
- slice (``--slice``; always on ``--device cuda``): one process runs one rank's
  share of a plan of any size: the layers of one pipeline stage at TP-sharded widths,
  its microbatches in the schedule's order for that stage, the optimizer state that rank
  keeps under ZeRO, and no communication. Compared: the compute time (forward and
  backward of the stage's microbatches; the prediction's compute + recompute of that
  stage, no communication or bubble) and the peak memory (the stage's predicted peak).

Predicted peaks are compared without the device's ``reserve`` (CUDA context, NCCL buffers,
allocator fragmentation: memory no tensor holds, which neither the resident-set growth
over the post-init baseline nor ``max_memory_allocated`` sees; 0 on a fitted CPU).

Predicted for exactly what runs: the model that runs is the plan's, made smaller only
where the machine is too small (:func:`fit_plan`: fewer microbatches, fewer layers,
narrower), and the prediction is ``evaluate`` of that smaller plan on a
descriptor of this machine:

- ``--profile CSV`` (from ``autoplan bench``): :func:`autoplan.measured.machine.describe_machine`
  fitted on it, corrected by :func:`autoplan.measured.surrogate.calibrate` when that module is
  installed and its dtype rule matches what runs (below);
- else the plan's own cluster, when it describes this machine (a cluster file such as
  ``examples/cpu/local-cpu.yaml``). A built-in GPU cluster on ``--device cpu`` is refused.

What computes: bf16 GEMMs and attention with fp32 master weights, fp32 gradients and fp32
Adam moments, the plan's dtype and autoplan's memory accounting (2 + 4 + 12 bytes per
parameter). The descriptor's peak comes from the profile's bf16 GEMM rows, each timed in
the three layouts training runs (op ``linear``): measured, so a CPU with native bf16 gets
its native rate (an AVX-512 BF16 AMD EPYC core: 0.47 TFLOP/s bf16 against 0.10 fp32) and
one that emulates bf16 its emulated rate (an AVX2 EPYC core: 0.005 bf16 against 0.08
fp32), which only a profile taken on that CPU shows: validate says so where it predicts
on a plan's own cluster on such a CPU.

The run reports what could bend its timings: other work on the machine before and during
the run (/proc/stat against the workers' own CPU time).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import stage_work
from autoplan.descriptors.hardware import Cluster
from autoplan.errors import AutoplanError, InputError, Problem
from autoplan.parallel.rules import plan_problems
from autoplan.plan import Plan, Prediction
from autoplan.schedules import Schedule
from autoplan.units import GiB, MiB
from autoplan.vocab import Dtype, ZeroStage

# Allowed relative error of the step time (slice: compute time), by device. A CPU descriptor
# fitted by ``autoplan bench`` carries what eager PyTorch on one core per rank adds (its
# layer passes' rate, gloo's sums per dtype, no overlap of communication with compute), and
# the CPU examples measure within about 15% of their prediction on a quiet machine
# (examples/cpu/README.md); other work on the machine's cores slows a run by its share, so
# the CPU default stays wide. On a GPU the model's own assumptions hold.
DEFAULT_TIME_TOLERANCE = {"cpu": 0.50, "cuda": 0.30}
DEFAULT_MEMORY_TOLERANCE = 0.25  # peak memory: the CPU examples measure 0.90-1.10x
# Peak memory also passes within this many bytes, whatever the ratio. A CPU rank's resident
# set holds what eager PyTorch builds beside the tensors autoplan counts (module and autograd
# objects, pipelining's buffers, allocator pages): 10-41 MiB more than predicted per rank on
# the CPU examples (examples/cpu/README.md), which a relative tolerance cannot absorb once a
# plan is shrunk to a ~100 MiB model (48: the largest seen plus a margin). A GPU's
# max_memory_allocated counts tensors only.
MEMORY_FLOOR_BYTES = {"cpu": 48 * MiB, "cuda": 0.0}
DEFAULT_STEPS = 5  # timed steps; the median is compared
DEFAULT_WARMUP = 2  # untimed steps first: pipelining's metadata inference, optimizer state, caches
DEFAULT_TIMEOUT_S = 900.0  # the whole run, all ranks
COLLECTIVE_TIMEOUT_S = 300.0  # gloo: a collective waiting longer than this fails the rank
MAX_STEP_S = 20.0  # fit_plan shrinks a plan whose predicted step (or slice compute) exceeds this
# fit_plan keeps every rank's predicted peak under this share of its memory: a CPU's RAM also
# holds the OS, the interpreters and torch; a GPU's only the CUDA context beside the run
MEMORY_SHARE = {"cpu": 0.6, "cuda": 0.9}
COMPUTE_DTYPE = "bf16"  # the profile GEMM rows whose rate is the descriptor's peak (what runs)



class ValidateError(AutoplanError):
    """The run itself failed: a rank raised, died or timed out (exit 2)."""


# --------------------------------------------------------------------------- the machine

@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """What this machine offers a validation run."""

    cpus: tuple[int, ...]  # CPU cores this process may run on
    mem_bytes: float  # physical memory (CPU) or the GPU's memory (CUDA)
    cuda_name: str = ""  # the GPU's name under --device cuda
    # CPU: whether torch has native bf16 GEMM instructions here (AVX-512 BF16 or AMX);
    # None where torch cannot say
    bf16_native: bool | None = None

    @classmethod
    def local(cls, device: str) -> Machine:
        cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") \
            else tuple(range(os.cpu_count() or 1))
        from autoplan.measured.machine import physical_memory_bytes

        mem = physical_memory_bytes()
        if device != "cuda":
            return cls(cpus=cpus, mem_bytes=mem, bf16_native=_cpu_bf16_native())
        try:
            import torch
        except ImportError:
            raise AutoplanError(TORCH_MISSING) from None
        if not torch.cuda.is_available():
            build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", built without CUDA")
            raise InputError.single("--device", "", f"cuda requested but no CUDA device is available "
                                                    f"({build})")
        props = torch.cuda.get_device_properties(0)
        return cls(cpus=cpus, mem_bytes=float(props.total_memory), cuda_name=props.name)


TORCH_MISSING = "autoplan validate needs torch: pip install 'autoplan[bench]'"


def check_options(*, cluster: object = None, profile: object = None, runs: object = None,
                  slice_: bool = False, device: str = "cpu") -> None:
    """What ``validate`` refuses before any run: a machine given twice (``--cluster`` and
    ``--profile``), and a runs log (``--runs``) of a slice's compute time, not a step time."""
    if cluster is not None and profile is not None:
        raise InputError.single("--cluster", "", "give --cluster or --profile, not both")
    if runs is not None and (slice_ or device == "cuda"):
        raise InputError.single("--runs", "", "a slice's compute time is not a step time: "
                                              "the runs log takes distributed runs (--device cpu)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    device: str = "cpu"  # cpu | cuda
    profile: Path | None = None
    # a cluster descriptor of this machine (bench --describe wrote it), or a built-in's name
    cluster: Path | str | None = None
    slice: bool = False
    stage: int | None = None  # slice: which pipeline stage (default: the highest predicted peak)
    steps: int = DEFAULT_STEPS
    warmup: int = DEFAULT_WARMUP
    tolerance: float | None = None  # step time (slice: compute time), relative; None: the device's
    memory_tolerance: float = DEFAULT_MEMORY_TOLERANCE
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_step_s: float = MAX_STEP_S
    fit: bool = True  # shrink the plan where the machine is too small

    @property
    def mode(self) -> str:
        return "slice" if self.slice else "distributed"

    @property
    def time_tolerance(self) -> float:
        return DEFAULT_TIME_TOLERANCE[self.device] if self.tolerance is None else self.tolerance


def threads_per_rank(machine: Machine, world: int) -> int:
    """CPU threads each rank computes with: the cores shared evenly (each rank pinned to its own)."""
    return max(1, len(machine.cpus) // world)


# --------------------------------------------------------------------------- what torch runs

def unsupported(plan: Plan, source: str, options: Options, machine: Machine) -> list[Problem]:
    """Every reason this plan cannot run here under torch, each naming the plan's field."""
    m, lay = plan.model, plan.layout
    out: list[Problem] = []

    def no(fld: str, message: str) -> None:
        out.append(Problem(source, fld, message))

    if options.device not in ("cpu", "cuda"):
        out.append(Problem("--device", "", f"expected cpu or cuda, got {options.device!r}"))
        return out
    if plan.job.dtype is not Dtype.BF16:
        no("job.dtype", f"validate runs bf16 (fp32 master weights and gradients); {plan.job.dtype.value} "
                        "needs loss scaling (fp16) or Transformer Engine (fp8), which it does not build")
    if m.is_moe:
        no("model.experts", "mixture-of-experts layers are not built by validate")
    if m.is_mla:
        no("model.kv_lora_rank", "multi-head latent attention is not built by validate")
    if m.mtp_layers:
        no("model.mtp_layers", "multi-token prediction is not built by validate")
    if m.qk_norm:
        no("model.qk_norm", "Q/K norms are not built by validate")
    if m.mixers or m.mlps:
        no("model.mixers", "layers of other kinds than full attention with an MLP (linear "
                           "attention, Mamba, sparse or sliding attention) are not built by validate")
    if m.vision is not None:
        no("model.vision", "a vision tower is not built by validate")
    if lay.cp > 1:
        no("layout.cp", "context parallelism is not built by validate (torch's context_parallel "
                        "is CUDA-only and experimental)")
    if plan.schedule.spec.torch_class is None and lay.pp > 1:  # torch.distributed.pipelining's
        names = ", ".join(s.value for s in Schedule if s.spec.torch_class is not None)
        no("schedule", f"{plan.schedule.value} has no torch.distributed.pipelining schedule "
                       f"(validate runs {names})")
    if plan.placement is not None:
        no("placement", "a plan across pools runs on several kinds of GPU; validate runs one "
                        "machine's (evaluate shows each pool's stage times)")
    if plan.offload.any:
        no("offload", "offload to host memory is not built by validate (its torch model keeps "
                      "optimizer states and activations on the device)")
    if lay.dp_replicas > 1:
        no("layout.dp_shard", "hybrid sharding (dp_shard < dp) is not built by validate")
    if m.tied_embeddings and lay.tp > 1 and lay.pp * lay.vpp == 1:
        no("model.tied_embeddings", "tied embeddings with tp > 1 on one stage are not built by validate")
    if options.slice:
        if plan.zero is ZeroStage.PARAMETERS:
            no("zero", "--slice keeps one rank's optimizer shard but cannot gather ZeRO-3 "
                       "parameters without communication; validate zero 3 without --slice")
        if "W" in plan.schedule.spec.op_kinds and lay.pp > 1:
            no("schedule", f"--slice runs fused backwards; {plan.schedule.value} splits them")
        if options.stage is not None and not 0 <= options.stage < lay.pp:
            out.append(Problem("--stage", "", f"expected a stage in 0..{lay.pp - 1}, got {options.stage}"))
        return out
    if lay.pp > 1 and plan.zero >= ZeroStage.GRADIENTS:
        no("zero", f"zero {int(plan.zero)} with pp > 1: torch.distributed.pipelining defers the "
                   "gradient reduction to the last microbatch and keeps parameters gathered across "
                   "microbatches, which is not ZeRO-2/3's memory; use zero 0 or 1")
    cores = len(machine.cpus)
    if lay.gpus > cores:
        no("layout", f"dp*tp*pp = {lay.gpus} processes, but this machine has {cores} CPU cores "
                     "(validate runs one process per core at least; use --slice for one rank)")
    return out


# --------------------------------------------------------------------------- the machine descriptor

@dataclass(frozen=True, slots=True)
class Descriptor:
    cluster: Cluster
    source: str  # where its numbers come from, in words
    notes: tuple[str, ...] = ()


def _cpu_bf16_native() -> bool | None:
    try:
        import torch
    except ImportError:
        return None
    probes: list[Callable[[], bool]] = []
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        probe = getattr(torch.cpu, name, None)
        if not callable(probe):
            return None
        probes.append(probe)
    return any(p() for p in probes)


EMULATED_BF16 = ("this CPU has no native bf16 GEMMs (AVX-512 BF16 or AMX), so torch emulates them, "
                 "one layout 10-25x slower than another: a descriptor fitted on another CPU's profile "
                 "misprices them. Fit one here: `autoplan bench --device cpu --model M -o profile.csv`, "
                 "then `autoplan bench --profile profile.csv --describe local-cpu.yaml`")


def _placed(cluster: Cluster, gpus: int) -> Cluster:
    """The cluster resized to ``gpus`` devices: one node of them, or whole nodes."""
    if gpus <= cluster.gpus_per_node:
        return dataclasses.replace(cluster, gpus_per_node=gpus,
                                   nvlink_domain=min(cluster.nvlink_domain, gpus), nodes=1)
    return dataclasses.replace(cluster, nodes=-(-gpus // cluster.gpus_per_node))


def builtin_gpu_cluster(cluster: Cluster) -> bool:
    """Whether ``cluster`` is a built-in (whole nodes or part of one, whatever measured
    correction its device carries): a GPU cluster, not a description of this machine."""
    from autoplan.descriptors.library import builtin_cluster_ref

    bare = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, correction=None))
    return builtin_cluster_ref(bare) is not None


def machine_descriptor(plan: Plan, source: str, options: Options, machine: Machine) -> Descriptor:
    """The cluster the prediction is made on (see the module docstring)."""

    world = plan.layout.gpus
    if options.profile is not None:
        return _profile_descriptor(plan, options, machine)
    if options.cluster is not None:
        from autoplan.descriptors.library import resolve_cluster

        given = resolve_cluster(str(options.cluster), "--cluster", "")
        ref = str(options.cluster)
        what = "file" if ref.endswith((".yaml", ".yml", ".json")) or "/" in ref else "built-in"
        return Descriptor(_placed(given, world), f"the cluster {what} {ref}")
    if options.device == "cpu" and builtin_gpu_cluster(plan.cluster):
        raise InputError.single(source, "cluster", (
            f"{plan.cluster.name} is a built-in GPU cluster, not this machine: give --profile CSV "
            "(from `autoplan bench --device cpu`), or a plan whose cluster describes this machine "
            "(examples/cpu/local-cpu.yaml)"))
    notes: tuple[str, ...] = ()
    if options.device == "cpu" and machine.bf16_native is False:
        notes = (EMULATED_BF16,)  # the plan's cluster was described on some other CPU
    if options.device == "cuda":
        notes = (f"predicted on the plan's device {plan.cluster.device.name}, taken to be this "
                 f"GPU ({machine.cuda_name}); give --profile for a measured descriptor",)
    assert plan.cluster.gpus == world  # read_plan checks it
    return Descriptor(plan.cluster, f"the plan's cluster {plan.cluster.name}", notes)


def _profile_descriptor(plan: Plan, options: Options, machine: Machine) -> Descriptor:
    from autoplan.measured.machine import describe_machine, standin_link
    from autoplan.measured.profile import read_profile

    assert options.profile is not None
    profile = read_profile(options.profile)
    label = str(options.profile)
    kind = profile.meta.get("device_kind")
    if kind != options.device:
        raise InputError.single(label, "header.device_kind",
                                f"the profile was taken on {kind}, validate runs on {options.device}")
    world = plan.layout.gpus
    if options.device == "cpu":
        threads = threads_per_rank(machine, world)
        taken = profile.meta.get("torch_threads")
        if taken is not None and taken.isdigit() and int(taken) != threads:
            raise InputError.single(label, "header.torch_threads", (
                f"kernels measured with {taken} torch threads, but each of the {world} ranks runs "
                f"with {threads}; measure with `OMP_NUM_THREADS={threads} autoplan bench --device cpu`"))
    per_rank_mem = machine.mem_bytes if options.device == "cuda" else machine.mem_bytes / world
    per_node = world if not options.slice else min(world, plan.cluster.gpus_per_node)
    cluster = describe_machine(profile, name=f"local-{options.device}", ranks_per_node=per_node,
                               mem_bytes=per_rank_mem, compute_dtype=COMPUTE_DTYPE)
    cluster = _placed(cluster, world)
    notes: list[str] = []
    standin = standin_link(profile) if profile.of_kind("collective").empty else None
    if standin is not None:
        notes.append(f"the profile has no collective rows (taken on one GPU): its links are "
                     f"{standin[1]}'s, which a one-rank slice does not use")
    corrected, note = _calibrated(cluster, profile)
    if note:
        notes.append(note)
    source = f"fitted on {label}" + (" with the learned correction" if corrected is not cluster else "")
    return Descriptor(corrected, source, tuple(notes))


def _calibrated(cluster: Cluster, profile: Any) -> tuple[Cluster, str]:
    """The cluster with the surrogate's correction, where one is installed and stands for
    what runs; else itself and why not."""
    try:
        from autoplan.measured import surrogate
    except ImportError:
        return cluster, ("no learned correction (autoplan.measured.surrogate not installed): "
                         "analytic descriptor")
    rule: Callable[[Any], str] | None = getattr(surrogate, "compute_dtype", None)
    used = rule(profile) if rule is not None else COMPUTE_DTYPE
    if used != COMPUTE_DTYPE:
        return cluster, (f"learned correction not applied: autoplan.measured.surrogate fits this profile's "
                         f"{used} GEMM rows for bf16 jobs, but validate computes in {COMPUTE_DTYPE}")
    return surrogate.calibrate(cluster, profile), ""


# --------------------------------------------------------------------------- fitting to the machine

@dataclass(frozen=True, slots=True)
class Fitted:
    plan: Plan
    prediction: Prediction
    adjustments: tuple[str, ...]  # what was made smaller, and why


def as_torch_runs(plan: Plan, device: str | None = None) -> Plan:
    """The plan as validate's torch model runs it: with sequence parallelism, DTensor's
    column-parallel GEMMs (and the --slice stand-ins, which copy them) keep their
    all-gathered input for backward (Stack.sp_saves_gathered), whatever the plan's stack.
    On ``device`` cpu the descriptor is this machine's, fitted on ``autoplan bench``'s
    timings of the very torch kernels the model runs: none of the stack's share of the
    benchmarks' rates (``compute_efficiency``, fitted on GPU runs of its own framework)
    applies, nor its per-step overhead (optimizer launches, gradient-norm syncs, logging:
    the torch model's step is its microbatches and the optimizer step, priced apart); and
    the model adds each microbatch's bf16 gradients into fp32 ones in passes of their own
    (``RankStates._accumulate``; FSDP2's reduce buffers), not inside the GEMMs."""
    stack = plan.stack
    if plan.sequence_parallel and plan.layout.tp > 1 and not stack.sp_saves_gathered:
        stack = dataclasses.replace(stack, sp_saves_gathered=True)
    if device == "cpu" and (stack.compute_efficiency != 1.0 or stack.step_overhead_s
                            or stack.grad_accumulation_fusion):
        stack = dataclasses.replace(stack, compute_efficiency=1.0, step_overhead_s=0.0,
                                    grad_accumulation_fusion=False)
    return plan if stack is plan.stack else dataclasses.replace(plan, stack=stack)


def predicted_time(plan: Plan, pred: Prediction, options: Options, stage: int) -> float:
    """The time compared: the step (distributed), or the slice's compute: forward, backward
    and recompute of ``stage`` for all its microbatches, no communication or bubble."""
    if not options.slice:
        return pred.step_time_s
    w = stage_work(plan)[stage]
    return plan.num_microbatches * (w.compute_f + w.compute_b + w.compute_w + w.recompute)


def slice_stage(plan: Plan, pred: Prediction, options: Options) -> int:
    if options.stage is not None:
        return options.stage
    peaks = [m.peak for m in pred.memory_per_stage]
    return max(range(len(peaks)), key=lambda s: (peaks[s], -s))


def _budget_problem(plan: Plan, pred: Prediction, options: Options, mem_budget: float) -> str:
    """Why the plan does not fit the machine ("memory: ..." or "time: ..."), or ""."""
    stage = slice_stage(plan, pred, options)
    peak = pred.memory_per_stage[stage].peak if options.slice else pred.memory.peak
    if peak > mem_budget:
        return f"memory: predicted {peak / GiB:.2f} GiB per rank over {mem_budget / GiB:.2f} GiB"
    t = predicted_time(plan, pred, options, stage)
    if t > options.max_step_s:
        return f"time: predicted {t:.1f} s per step over {options.max_step_s:g} s"
    return ""


def fit_plan(plan: Plan, options: Options, mem_budget: float) -> Fitted:
    """The plan itself if it fits this machine, else the first smaller one that does.

    Over the time budget only: fewer microbatches first (the shapes, and so every
    per-microbatch cost and the memory, stay the plan's), then a smaller model. Over the
    memory budget: a smaller model first (fewer layers, halving the layers of each model
    chunk; then narrower: hidden, head width, MLP and vocabulary halved), each also with
    fewer microbatches. The prediction is ``evaluate`` of the plan returned; raises when
    even the smallest does not fit."""
    pred = evaluate(plan)
    why = _budget_problem(plan, pred, options, mem_budget)
    if not why or not options.fit:
        return Fitted(plan, pred, ())
    last = why
    for smaller, changes in _candidates(plan, memory_first=why.startswith("memory")):
        pred = evaluate(smaller)
        problem = _budget_problem(smaller, pred, options, mem_budget)
        if not problem:
            return Fitted(smaller, pred, (f"{'; '.join(changes)} ({why})",))
        last = problem
    raise InputError.single("<plan>", "model", f"too large for this machine even made smaller: {last}")


def _candidates(plan: Plan, memory_first: bool) -> Iterator[tuple[Plan, list[str]]]:
    if not memory_first:
        yield from _fewer_microbatches(plan, [])
    for smaller, change in _smaller_models(plan):
        yield smaller, [change]
        yield from _fewer_microbatches(smaller, [change])


def _fewer_microbatches(plan: Plan, changes: list[str]) -> Iterator[tuple[Plan, list[str]]]:
    """Halving the global batch while every pipeline stage still gets pp microbatches
    (interleaved: a multiple of pp, Megatron-LM's rule)."""
    lay = plan.layout
    step = lay.dp * plan.micro_batch * (lay.pp if plan.schedule.spec.p_divides_m else 1)
    p = plan
    while p.num_microbatches // 2 >= lay.pp and (p.job.global_batch // 2) % step == 0:
        p = dataclasses.replace(p, job=dataclasses.replace(p.job, global_batch=p.job.global_batch // 2))
        yield p, [*changes, f"{p.num_microbatches} of the plan's {plan.num_microbatches} microbatches "
                            f"(global batch {p.job.global_batch})"]


def _smaller_models(plan: Plan) -> Iterator[tuple[Plan, str]]:
    """Ever smaller valid variants of the plan's model, each with what changed."""
    model, lay = plan.model, plan.layout
    chunks = lay.pp * lay.vpp
    p = plan
    per_chunk = max(plan.stage_layers) // lay.vpp
    while per_chunk > 1:
        per_chunk //= 2
        layers = chunks * per_chunk
        p = dataclasses.replace(p, model=dataclasses.replace(p.model, layers=layers), stages=None,
                                chunks=None)
        yield p, f"{layers} of the model's {model.layers} layers"
    t = lay.tp
    while p.model.kv_channels >= 32 and p.model.hidden >= 256:
        m = p.model
        narrower = dataclasses.replace(
            m, hidden=m.hidden // 2, head_dim=m.kv_channels // 2 if m.head_dim else 0,
            ffn_hidden=max(t, m.ffn_hidden // 2 // t * t), vocab=max(t, m.vocab // 2 // t * t))
        candidate = dataclasses.replace(p, model=narrower)
        if plan_problems(candidate):
            break
        p = candidate
        yield p, (f"{p.model.layers} layers of width {p.model.hidden} (the model's {model.hidden}), "
                  f"ffn {p.model.ffn_hidden}, vocab {p.model.vocab}")


# --------------------------------------------------------------------------- results

@dataclass(frozen=True, slots=True, kw_only=True)
class RankRun:
    rank: int
    stage: int
    step_times_s: tuple[float, ...]
    peak_memory_bytes: float
    predicted_peak_bytes: float
    state_bytes: dict[str, int]
    threads: int

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "stage": self.stage,
                "step_times_s": list(self.step_times_s),
                "peak_memory_gib": self.peak_memory_bytes / GiB,
                "predicted_peak_memory_gib": self.predicted_peak_bytes / GiB,
                "state_gib": {k: v / GiB for k, v in self.state_bytes.items()},
                "threads": self.threads}


@dataclass(frozen=True, slots=True, kw_only=True)
class Validation:
    source: str
    mode: str  # distributed | slice
    device: str
    plan: Plan  # what ran, on the machine descriptor
    prediction: Prediction
    descriptor: str
    step_times_s: tuple[float, ...]  # per timed step: the slowest rank's (slice: compute time)
    measured_peak_bytes: float
    predicted_time_s: float
    predicted_peak_bytes: float
    ranks: tuple[RankRun, ...]
    time_tolerance: float
    memory_tolerance: float
    adjustments: tuple[str, ...] = ()
    memory_floor_bytes: float = 0.0  # |measured - predicted| within this also passes
    notes: tuple[str, ...] = ()
    stage: int | None = None  # slice: the stage run
    load_average: float = 0.0
    wall_s: float = 0.0
    peak_window: str = ""
    # the predicted step time's 10th and 90th percentile over the learned correction's
    # trees (a distributed run on a corrected descriptor; else None)
    step_time_band_s: tuple[float, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def measured_time_s(self) -> float:
        return statistics.median(self.step_times_s)

    @property
    def time_ratio(self) -> float:
        return self.measured_time_s / self.predicted_time_s

    @property
    def memory_ratio(self) -> float:
        return self.measured_peak_bytes / self.predicted_peak_bytes

    @property
    def time_within(self) -> bool:
        return abs(self.time_ratio - 1.0) <= self.time_tolerance

    @property
    def memory_within(self) -> bool:
        gap = abs(self.measured_peak_bytes - self.predicted_peak_bytes)
        return gap <= max(self.memory_tolerance * self.predicted_peak_bytes, self.memory_floor_bytes)

    @property
    def within(self) -> bool:
        return self.time_within and self.memory_within

    @property
    def spread(self) -> tuple[float, float]:
        """(min, max) of the timed steps."""
        return min(self.step_times_s), max(self.step_times_s)

    def to_dict(self) -> dict[str, Any]:
        time_key = "step_time_s" if self.mode == "distributed" else "compute_time_s"
        lay = self.plan.layout
        out: dict[str, Any] = {
            "plan": self.source,
            "within_tolerance": self.within,
            "measured": {
                "step_time_s": self.measured_time_s,
                "peak_memory_gib": self.measured_peak_bytes / GiB,
                "step_times_s": list(self.step_times_s),
                "step_time_spread_s": list(self.spread),
            },
            "predicted": {
                "step_time_s": self.predicted_time_s,
                "peak_memory_gib": self.predicted_peak_bytes / GiB,
                "prediction": self.prediction.to_dict(),
            },
            "tolerance": {
                "step_time": self.time_tolerance, "peak_memory": self.memory_tolerance,
                "peak_memory_floor_gib": self.memory_floor_bytes / GiB,
                "step_time_ratio": self.time_ratio, "peak_memory_ratio": self.memory_ratio,
                "step_time_within": self.time_within, "peak_memory_within": self.memory_within,
            },
            "ran": {
                "mode": self.mode, "device": self.device, "time_compared": time_key,
                "model": self.plan.model.to_dict(),
                "layout": lay.to_dict(), "micro_batch": self.plan.micro_batch,
                "microbatches": self.plan.num_microbatches,
                "global_batch": self.plan.job.global_batch, "seq_len": self.plan.job.seq_len,
                "schedule": self.plan.schedule.value, "zero": int(self.plan.zero),
                "recompute": self.plan.recompute.value,
                "sequence_parallel": self.plan.sequence_parallel,
                "stage": self.stage,
                "processes": len(self.ranks),
                "descriptor": self.descriptor,
                "peak_memory_window": self.peak_window,
                "busy_before_run": self.load_average,
                "wall_s": self.wall_s,
                "adjustments": list(self.adjustments),
                "notes": list(self.notes),
                **self.extra,
            },
            "ranks": [r.to_dict() for r in self.ranks],
        }
        if self.step_time_band_s is not None:
            out["ran"]["predicted_step_time_band_s"] = list(self.step_time_band_s)
        return out


# --------------------------------------------------------------------------- running

def validate(plan: Plan, source: str, options: Options, machine: Machine | None = None) -> Validation:
    """Check, fit, predict, run, compare."""
    if options.profile is not None:  # bad input refused before torch's import (seconds)
        from autoplan.measured.profile import read_profile

        read_profile(options.profile)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise AutoplanError(TORCH_MISSING) from None
    machine = machine or Machine.local(options.device)
    if options.device == "cuda":  # one GPU runs one rank's slice (multi-GPU runs are not built)
        options = dataclasses.replace(options, slice=True)
    problems = unsupported(plan, source, options, machine)
    if problems:
        raise InputError(problems)
    desc = machine_descriptor(plan, source, options, machine)
    on_machine = dataclasses.replace(as_torch_runs(plan, options.device), cluster=desc.cluster)
    world = plan.layout.gpus
    per_rank = machine.mem_bytes if options.slice else machine.mem_bytes / world
    fitted = fit_plan(on_machine, options, per_rank * MEMORY_SHARE[options.device])
    run_plan, pred = fitted.plan, fitted.prediction
    stage = slice_stage(run_plan, pred, options) if options.slice else None
    threads = threads_per_rank(machine, world)  # a slice computes as one rank of the plan would
    if options.device == "cuda":
        threads = len(machine.cpus)
    load = busy_share()
    notes = list(desc.notes)
    if on_machine.stack.sp_saves_gathered != plan.stack.sp_saves_gathered:
        notes.append(f"memory predicted as torch runs sequence parallelism: each TP GEMM keeps its "
                     f"all-gathered input for backward ({plan.stack.name} keeps the local shard)")
    if on_machine.stack.compute_efficiency != plan.stack.compute_efficiency:
        notes.append(f"time predicted at the kernels' measured rates ({plan.stack.name}'s compute "
                     f"efficiency {plan.stack.compute_efficiency:g} and step overhead are its GPU "
                     "runs', not this machine's torch kernels')")
    if load > BUSY:
        notes.append(f"the machine was busy before the run ({load:.0%} of its CPU time in use by "
                     "other work): timings include that work")
    spec = {
        "plan": _worker_plan(run_plan),
        "threads": threads,
        "cpus": (_pinning(machine, 1 if options.slice else world, threads)
                 if options.device == "cpu" else None),
        "device": options.device,
        "warmup": options.warmup,
        "steps": options.steps,
        "collective_timeout_s": min(COLLECTIVE_TIMEOUT_S, options.timeout_s),
        "slice": options.slice,
        "stage": stage,
    }
    started, cpu0, own0 = time.monotonic(), _cpu_times(), _own_cpu_s()
    results = spawn(spec, 1 if options.slice else world, options.timeout_s, threads)
    wall, cpu1, own1 = time.monotonic() - started, _cpu_times(), _own_cpu_s()
    others = 0.0
    if cpu0 is not None and cpu1 is not None and cpu1[0] > cpu0[0]:
        others = max(0.0, (cpu1[1] - cpu0[1]) - (own1 - own0)) / (cpu1[0] - cpu0[0])
        if others > BUSY / 2:
            notes.append(f"other work used {others:.0%} of the machine's CPU time during the run: "
                         "timings include it")
    out = _compare(source, options, run_plan, pred, desc, fitted.adjustments, tuple(notes), stage,
                   results, load, wall)
    return dataclasses.replace(out, extra={**out.extra, "others_cpu_share_during_run": others},
                               step_time_band_s=_band(run_plan) if not options.slice else None)


def _band(plan: Plan) -> tuple[float, float] | None:
    """The step time's 10th and 90th percentile over the learned correction's trees, where
    the descriptor carries one (autoplan.measured.surrogate.band); else None."""
    try:
        from autoplan.measured import surrogate
    except ImportError:
        return None
    band = getattr(surrogate, "band", None)
    unc = band(plan) if band is not None else None
    return None if unc is None else (unc.step_time_s_p10, unc.step_time_s_p90)


def _compare(source: str, options: Options, plan: Plan, pred: Prediction, desc: Descriptor,
             adjustments: tuple[str, ...], notes: tuple[str, ...], stage: int | None,
             results: list[dict[str, Any]], load: float, wall: float) -> Validation:
    reserve = plan.cluster.device.reserve_bytes  # context, comm buffers, fragmentation: not tensors
    ranks = tuple(RankRun(
        rank=r["rank"], stage=r["stage"], step_times_s=tuple(r["step_times_s"]),
        peak_memory_bytes=float(r["peak_memory_bytes"]),
        predicted_peak_bytes=pred.memory_per_stage[r["stage"]].peak - reserve,
        state_bytes=r.get("state_bytes") or {}, threads=r["threads"]) for r in results)
    steps = len(ranks[0].step_times_s)
    per_step = tuple(max(r.step_times_s[i] for r in ranks) for i in range(steps))
    worst = max(ranks, key=lambda r: (r.peak_memory_bytes / r.predicted_peak_bytes, -r.rank))
    if options.slice:
        assert stage is not None
        measured_peak, predicted_peak = worst.peak_memory_bytes, worst.predicted_peak_bytes
        t_pred = predicted_time(plan, pred, options, stage)
    else:
        measured_peak = max(r.peak_memory_bytes for r in ranks)
        predicted_peak = pred.memory.peak - reserve
        t_pred = pred.step_time_s
    extra = {k: v for k, v in results[0].items() if k in ("slice_layers", "slice_widths")}
    return Validation(
        source=source, mode=options.mode, device=options.device, plan=plan, prediction=pred,
        descriptor=desc.source, step_times_s=per_step, measured_peak_bytes=measured_peak,
        predicted_time_s=t_pred, predicted_peak_bytes=predicted_peak, ranks=ranks,
        time_tolerance=options.time_tolerance, memory_tolerance=options.memory_tolerance,
        memory_floor_bytes=MEMORY_FLOOR_BYTES[options.device], adjustments=adjustments,
        notes=notes, stage=stage, load_average=load, wall_s=wall,
        peak_window=str(results[0].get("peak_window", "")), extra=extra)


BUSY = 0.25  # share of the machine's CPU time in use by others that earns a note


def _cpu_times() -> tuple[float, float] | None:
    """(all CPUs' time, their busy time) in seconds since boot, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) / tick, (sum(fields) - idle) / tick


def _own_cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def busy_share(seconds: float = 1.0) -> float:
    """Share of all CPUs' time spent busy over ``seconds`` (0 where /proc/stat is unreadable)."""
    first = _cpu_times()
    time.sleep(seconds)
    second = _cpu_times()
    if first is None or second is None or second[0] == first[0]:
        return 0.0
    return max(0.0, (second[1] - first[1]) / (second[0] - first[0]))


def _worker_plan(plan: Plan) -> dict[str, Any]:
    """The plan as the workers read it back: its model and layout; the cluster is a
    placeholder of the right size (workers use no hardware numbers)."""
    doc = plan.to_dict()
    world = plan.layout.gpus
    link = {"bandwidth_GBps": 1.0, "latency_us": 1.0}
    doc["cluster"] = {"name": "validate-local", "device": {
        "name": "validate-local-device", "peak_tflops": {"bf16": 1.0}, "mem_GiB": 1.0, "hbm_GBps": 1.0},
        "gpus_per_node": world, "nvlink_domain": world, "intra_node": link, "inter_node": link}
    return doc


def _pinning(machine: Machine, ranks: int, threads: int) -> list[list[int]]:
    """Cores of each rank: consecutive blocks of ``threads`` cores."""
    cpus = list(machine.cpus)
    return [cpus[r * threads:(r + 1) * threads] for r in range(ranks)]


def _package_root() -> str:
    import autoplan

    return str(Path(autoplan.__file__).resolve().parent.parent)


# The workers start with glibc returning memory at once (for the memory step) and switch
# to keeping it before the timed steps (see worker.py). Set for the children only.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}


def spawn(spec: dict[str, Any], ranks: int, timeout_s: float, threads: int) -> list[dict[str, Any]]:
    """Run ``ranks`` worker processes on ``spec``; their results, by rank. A rank that fails
    stops the others at once and its message becomes a :class:`ValidateError`; so does a
    run over ``timeout_s``."""
    tmp = Path(tempfile.mkdtemp(prefix="autoplan-validate-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        spec = {**spec, "store": str(tmp / "store")}
        (tmp / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, **ALLOCATOR_ENV, "OMP_NUM_THREADS": str(threads),
               "MKL_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore",
               "PYTHONPATH": os.pathsep.join(p for p in (_package_root(), os.environ.get("PYTHONPATH"))
                                             if p)}
        for rank in range(ranks):
            with open(tmp / f"rank{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "autoplan.bench.worker", str(tmp / "spec.json"), str(rank)],
                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                time.sleep(0.5)  # let the others record their own errors
                raise ValidateError(_failure(tmp, procs))
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                running = [r for r, c in enumerate(codes) if c is None]
                raise ValidateError(f"the run timed out after {timeout_s:.0f} s "
                                    f"(ranks {', '.join(map(str, running))} still running)")
            time.sleep(0.1)
        return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(ranks)]
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)
        shutil.rmtree(tmp, ignore_errors=True)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Stop one worker we started, and what it started (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait(timeout=30)


def _failure(tmp: Path, procs: list[subprocess.Popen[bytes]]) -> str:
    """The failing rank's message: the earliest error a rank recorded, else the tail of
    the log of the first rank that exited with an error."""
    errors = []
    for r in range(len(procs)):
        path = tmp / f"rank{r}.json"
        if path.exists():
            with_err = json.loads(path.read_text())
            if "error" in with_err:
                errors.append((with_err.get("time", math.inf), r, with_err["error"]))
    if errors:
        _, rank, message = min(errors)
        return f"rank {rank} failed: {message}"
    for r, p in enumerate(procs):
        if p.poll() not in (None, 0):
            tail = (tmp / f"rank{r}.log").read_text(errors="replace").strip().splitlines()[-5:]
            return f"rank {r} exited with status {p.returncode}: " + " | ".join(tail)
    return "a rank failed without a message"
