"""Predicted vs measured step time on published training runs, cross-validated.

    python benchmarks/accuracy.py [--csv PATH] [--markdown | --fit | --no-cv] [--verbose]
                                  [--no-kernels | --gemm-grids]

Reads ``calibration_runs.csv`` (default: ``shared/data/calibration_runs.csv``
beside the checkout, see its README), builds one autoplan Plan per row marked
``validation_ready == yes`` from that row's columns alone (the software stack from
its framework), evaluates it and compares the predicted step time with the measured
one: MAPE and bias by source, device, dtype and stack, and per ranking group
(same model, GPUs, batch and sequence) Spearman's rank correlation and the top-1
regret.

What is fitted on these rows is small: the stacks' host costs (dispatch time per
kernel, fixed cost per step), one value for every stack. Kernel rates come from
public kernel benchmarks cited in the device files. Two columns per slice:

- *files*: the committed values, fitted on every row (a calibration claim);
- *held out*: each source's rows predicted with values fitted on the other
  sources only (leave-one-source-out cross-validation: a validation claim).

``--fit`` fits the host costs on every row and prints the lines to put in
``profiles/stacks/*.yaml``. It never looks at one row alone.

Each row's cluster comes through the training door (``measured.door.corrected``), as a
training command's does: the measured kernel grids that apply where autoplan ships them
(profiles/measured/kernels/: NCCL's collectives inside a node). ``--no-kernels`` costs on
the curves alone; ``--gemm-grids`` adds the GEMM grids that ship without applying.

Exit codes: 0 printed a table, 2 bad input (missing CSV, no usable row).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import math
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan import caches
from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import builtin_stack, resolve_cluster, resolve_device, with_gpus
from autoplan.descriptors.model import Model
from autoplan.errors import AutoplanError
from autoplan.kernels.flops import model_flops_per_step
from autoplan.measured.door import corrected, with_kernels
from autoplan.parallel.rules import plan_problems
from autoplan.plan import Layout, Plan
from autoplan.schedules import Schedule
from autoplan.tune.calibrate import descend
from autoplan.vocab import (
    Activation,
    Dtype,
    MasterWeights,
    Norm,
    Position,
    Recompute,
    StateDtype,
    ZeroStage,
)

DEFAULT_CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "calibration_runs.csv"
COMMAND = "python benchmarks/accuracy.py --markdown"


# --------------------------------------------------------------------------- architectures

@dataclass(frozen=True, slots=True)
class Family:
    """What a model family's published config says beyond the CSV's dimensions.

    Matched on the row's own ``model`` text (never on dimension ratios); a row
    whose model names no known family is skipped.
    """

    label: str
    pattern: str  # regex on the row's model name
    activation: Activation
    norm: Norm
    position: Position
    tied_embeddings: bool
    bias: bool
    dropout: bool
    ffn_ratio: int | None  # ffn_hidden = ratio * hidden when the row leaves it blank
    source: str


FAMILIES = (
    Family("Llama", r"llama", Activation.SWIGLU, Norm.RMSNORM, Position.ROPE,
           tied_embeddings=False, bias=False, dropout=False, ffn_ratio=None,
           source="Llama 2 / Llama 3 config.json (hidden_act silu, RMSNorm, RoPE, untied)"),
    # MPT and BLOOM use ALiBi: no position parameters, a bias added inside the
    # attention kernel. autoplan's Position has no ALiBi member; rope stands in for
    # it (no parameters; a small elementwise pass), learned would add max_seq_len x
    # hidden parameters that these models do not have.
    Family("MPT", r"\bmpt\b", Activation.GELU, Norm.LAYERNORM, Position.ROPE,
           tied_embeddings=True, bias=False, dropout=False, ffn_ratio=4,
           source="llm-foundry yamls/pretrain/mpt-*.yaml (gelu MLP, expansion_ratio 4, "
                  "no_bias, ALiBi, tied wte, pdrop 0)"),
    Family("BLOOM", r"bloom", Activation.GELU, Norm.LAYERNORM, Position.ROPE,
           tied_embeddings=True, bias=True, dropout=False, ffn_ratio=4,
           source="bigscience/bloom config.json (gelu, 4h MLP, ALiBi, tied, dropout 0)"),
    Family("Nemotron-4", r"nemotron[-_ ]?4", Activation.RELU2, Norm.LAYERNORM, Position.ROPE,
           tied_embeddings=False, bias=False, dropout=False, ffn_ratio=4,
           source="Nemotron-4 340B technical report Table 1 and NeMo-Framework-Launcher "
                  "nemotron_340b.yaml (squared ReLU, ffn 4h, LayerNorm1p, RoPE, untied, no bias, "
                  "dropout 0): profiles/models/nemotron-4-340b.yaml"),
    Family("GPT (Megatron-LM)", r"\bgpt", Activation.GELU, Norm.LAYERNORM, Position.LEARNED,
           tied_embeddings=True, bias=True, dropout=True, ffn_ratio=4,
           source="Megatron-LM GPT defaults (gelu, ffn 4h, LayerNorm, learned positions, "
                  "tied embeddings, biases, dropout 0.1)"),
)


def family_of(row: dict[str, str]) -> Family | None:
    text = row["model"].lower()
    return next((f for f in FAMILIES if re.search(f.pattern, text)), None)


# --------------------------------------------------------------------------- device classes

@dataclass(frozen=True, slots=True)
class DeviceClass:
    """One fitted parameter set: devices of one chip generation and the cluster they sit in."""

    name: str
    cluster: str  # built-in cluster file
    devices: tuple[str, ...]  # built-in device files sharing the class's efficiencies


CLASSES = (
    DeviceClass("A100", "dgx-a100", ("a100-40gb", "a100-80gb")),
    DeviceClass("H100", "dgx-h100", ("h100-sxm",)),
)

# gpu_type text -> (device class, device file). Order matters: the first match wins.
GPU_TYPES = (
    (r"h100", "H100", "h100-sxm"),
    (r"a100[- ]?40", "A100", "a100-40gb"),
    (r"a100[- ]?80", "A100", "a100-80gb"),
)


def cluster_for(gpu_type: str) -> tuple[str, Cluster] | None:
    text = gpu_type.lower()
    if "pcie" in text:
        return None  # the built-in A100/H100 files are SXM parts in DGX nodes
    for pattern, cls_name, device in GPU_TYPES:
        if re.search(pattern, text):
            cls = next(c for c in CLASSES if c.name == cls_name)
            cluster = resolve_cluster(cls.cluster)
            if cluster.device.name != device:
                cluster = dataclasses.replace(
                    cluster, device=resolve_device(device, "benchmarks/accuracy.py", "device"))
            return cls_name, cluster
    return None


# --------------------------------------------------------------------------- rows -> cases

@dataclass(frozen=True, slots=True)
class Case:
    row_id: str
    group: str
    device_class: str
    plan: Plan
    measured_s: float
    how: str  # how the measured step time was obtained
    derived: tuple[str, ...]  # what was read from the family rather than the row
    # where a row gives both a step time and TFLOP/s: the conversion a TFLOP/s-only row
    # would use, and how far its implied step time is from the measured one
    check: tuple[str, float] | None = None

    @property
    def source(self) -> str:
        """The publication the row comes from: the unit left out in cross-validation."""
        return self.group.split(" Table")[0] if self.group.startswith("Megatron-LM SC'21") else (
            "llm-foundry MPT" if self.group.startswith("llm-foundry MPT") else self.group)

    @property
    def stack(self) -> str:
        return self.plan.stack.name

    @property
    def dtype(self) -> str:
        return self.plan.job.dtype.value

    @property
    def job_key(self) -> tuple:
        """Rows of one ranking group: same model, GPUs (kind and count), batch and sequence,
        from one source."""
        p = self.plan
        return (p.model.name, p.cluster.device.name, p.layout.gpus, p.job.global_batch,
                p.job.seq_len, self.source)


@dataclass(frozen=True, slots=True)
class Skip:
    row_id: str
    group: str
    reason: str


def _int(row: dict[str, str], key: str, default: int | None = None) -> int | None:
    text = row.get(key, "").strip()
    if not text:
        return default
    return int(float(text))


def _float(row: dict[str, str], key: str) -> float | None:
    text = row.get(key, "").strip()
    return float(text) if text else None


SOURCES = (
    (r"narayanan", "Megatron-LM SC'21"),
    (r"korthikanti", "Korthikanti et al. 2022"),
    (r"bigscience|bloom", "BLOOM-176B"),
    (r"torchtitan", "torchtitan"),
    (r"llm-foundry|mosaicml", "llm-foundry MPT"),
)


def group_of(row: dict[str, str]) -> str:
    """Source (short name) and, where a source has several tables, the table."""
    source = row["source"]
    short = next((name for pat, name in SOURCES if re.search(pat, source, re.I)), source[:40])
    table = row["source_table"]
    if short == "Megatron-LM SC'21":
        m = re.match(r"Table \d+", table)
        return f"{short} {m.group(0)}" if m else short
    if short == "llm-foundry MPT":
        sub = table.split(":")[0].split(" with ")[0].replace(" (Large Scale, >= 128 GPUs)", " >=128")
        return f"{short} {sub}"
    return short


def dtype_of(text: str) -> tuple[Dtype, str]:
    t = text.lower()
    if "not specified" in t or ("fp16" in t and "bf16" in t):
        t = ""
    if "fp8" in t:
        return Dtype.FP8, ""
    if "fp16" in t:
        return Dtype.FP16, ""
    if "bf16" in t:
        return Dtype.BF16, ""
    # bf16 and fp16 have the same peak on every device here; only the gradient
    # bytes differ (Megatron-LM reduces bf16 grads in fp32)
    return Dtype.BF16, "precision bf16 (row says mixed precision only)"


def recompute_of(text: str) -> Recompute | None:
    t = text.strip().lower()
    if t.startswith("full"):
        return Recompute.FULL
    if t.startswith("selective"):
        return Recompute.SELECTIVE
    if t in ("", "none", "no"):
        return Recompute.NONE
    return None


def zero_of(row: dict[str, str]) -> ZeroStage:
    """FSDP FULL_SHARD / FSDP2 / ZeRO-3 shard parameters; SHARD_GRAD_OP is ZeRO-2."""
    text = f"{row['fsdp']} {row['notes']}".lower()
    fsdp = row["fsdp"].lower()
    if "shard_grad_op" in fsdp or "zero-2" in fsdp:
        return ZeroStage.GRADIENTS
    if "full_shard" in fsdp or "zero-3" in fsdp or "fsdp" in fsdp:
        return ZeroStage.PARAMETERS
    if ("zero-1" in fsdp or "distributed optimizer" in text or "distributed-optimizer" in text
            or re.search(r"distributed[_ ]fused[_ ]adam", text)):
        return ZeroStage.OPTIMIZER
    return ZeroStage.NONE


def zero_on(row: dict[str, str], stack: str) -> ZeroStage:
    """``zero_of``; a NeMo 1.x row that says nothing of its sharding ran the Launcher recipes'
    distributed_fused_adam, zero 1 (every GPT-family recipe of NeMo-Framework-Launcher 24.07
    sets it: docs/research/nemo1-distributed-fused-adam.md, "Recipe settings actually used")."""
    zero = zero_of(row)
    if stack == "nemo-1" and zero is ZeroStage.NONE and not row["fsdp"].strip():
        return ZeroStage.OPTIMIZER
    return zero


# framework text -> the software stack that ran it (profiles/stacks). First match wins.
STACKS = (
    (r"deepspeed", "deepspeed"),
    (r"megatron-core|\bmcore\b|\bnemo\b", "megatron-core"),
    (r"megatron", "megatron-lm"),
    (r"torchtitan", "torchtitan"),
    (r"llm-foundry|composer", "fsdp"),
)


# NeMo 1.x, as the 2024 NeMo-Framework-Launcher recipes ran it (apex's distributed_fused_adam:
# profiles/stacks/nemo-1.yaml): a framework naming NeMo 1.x ("NeMo 1.23", "NeMo v1", "NeMo
# (24.05)", "NeMo Megatron", "NeMo Framework Launcher"), or NeMo with a 1.x version or a 24.01-24.07
# container (before NeMo 2.0's recipes, which run Megatron-Core's distributed optimizer)
NEMO1_TEXT = re.compile(r"\bnemo\b\W*(v?1\.[\dx]|v1\b|24\.0[1-7]\b|megatron|framework[ -]launcher"
                        r"|launcher)", re.I)
NEMO1_VERSION = re.compile(r"^\W*(nemo\W*)?(v?1\.\d+|24\.0[1-7])\b", re.I)


def stack_of(row: dict[str, str]) -> str | None:
    text = row["framework"].lower()
    if re.search(r"\bnemo\b", text) and (NEMO1_TEXT.search(text)
                                          or NEMO1_VERSION.search(row.get("framework_version", ""))):
        return "nemo-1"
    name = next((stack for pat, stack in STACKS if re.search(pat, text)), None)
    if name == "torchtitan" and re.search(r"torch\.compile|compiled", row["notes"], re.I):
        return "torchtitan-compiled"
    return name


# The states a recipe sets where its stack's defaults are not what it ran, from the
# recipe's own config (not from any measurement): (stack, model-name pattern, states).
# NeMo-Framework-Launcher 24.07 (8325688d) launcher_scripts/conf/training/nemotron/
# nemotron_340b.yaml L158-165: distributed_fused_adam with grad_sync_dtype bf16 and dtype bf16,
# the model's dtype, so no master copy (NeMo megatron_base_model.py L746-747).
RECIPE_STATES = (
    ("nemo-1", re.compile(r"nemotron[-_ ]?4[-_ ]?340b", re.I),
     {"main_grads": StateDtype.BF16, "master_weights": MasterWeights.NONE,
      "optimizer_states": StateDtype.BF16}),
)


def recipe_states(row: dict[str, str], stack: str) -> dict[str, Any]:
    """The job's state fields for the row's recipe (``RECIPE_STATES``); {}: its stack's."""
    return next((states for st, pat, states in RECIPE_STATES
                 if st == stack and pat.search(row["model"])), {})


def schedule_of(row: dict[str, str], vp: int) -> Schedule:
    text = row["pipeline_schedule"].lower()
    if vp > 1 or "interleav" in text:
        return Schedule.INTERLEAVED
    if "gpipe" in text:
        return Schedule.GPIPE
    return Schedule.ONE_F_ONE_B


HFU_TEXT = re.compile(r"hardware|\bhfu\b|counts? (the )?recompute|recompute flops", re.I)
MFU_TEXT = re.compile(r"model (t)?flop|\bmfu\b", re.I)


def eq3_flops(batch: int, s: int, l: int, h: int, vocab: int,  # noqa: E741 (the paper's l)
              full_recompute: bool) -> float:
    """Hardware FLOPs of one step, Narayanan et al. SC'21 eq. (3) (it counts the
    recompute forward): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)); without recompute
    the same accounting gives 72 B s l h^2 (1 + s/(6h) + V/(12 l h)). It assumes a
    4h GELU MLP, multi-head attention and the full s x s attention square."""
    if full_recompute:
        return 96 * batch * s * l * h**2 * (1 + s / (6 * h) + vocab / (16 * l * h))
    return 72 * batch * s * l * h**2 * (1 + s / (6 * h) + vocab / (12 * l * h))


def step_from_tflops(row: dict[str, str], model: Model, recompute: Recompute,
                     gpus: int) -> tuple[float, str] | str:
    """Step time implied by the row's TFLOP/s per GPU, inverted with the formula its
    source used, as (seconds, how); or why it cannot be."""
    tflops = _float(row, "measured_tflops_per_gpu")
    if not tflops:
        return "no step time, tokens/s or TFLOP/s measured"
    batch, seq = int(row["global_batch_size"]), int(row["seq_len"])
    text = " ".join(row[k] for k in ("notes", "recompute", "source"))
    if HFU_TEXT.search(text):
        if (model.ffn_hidden != 4 * model.hidden or model.kv_heads != model.heads
                or model.activation.gated):
            return "TFLOP/s is HFU (SC'21 eq. 3) but eq. 3 assumes a 4h MLP and MHA"
        flops = eq3_flops(batch, seq, model.layers, model.hidden, model.vocab,
                          recompute is Recompute.FULL)
        return flops / (tflops * 1e12 * gpus), "HFU TFLOP/s inverted with SC'21 eq. 3"
    if MFU_TEXT.search(text):
        # llm-foundry's MFU (the only model-FLOP TFLOP/s source in the CSV) counts the
        # full s x s attention square: non-causal model FLOPs (the cross-check in the
        # report confirms it on the rows that also give a step time)
        flops = model_flops_per_step(model, batch * seq, seq, causal=False)
        return flops / (tflops * 1e12 * gpus), "model TFLOP/s inverted (non-causal model FLOPs)"
    return "TFLOP/s given but the row does not say whether it is model or hardware FLOPs"


def measured_step(row: dict[str, str], model: Model, recompute: Recompute,
                  gpus: int) -> tuple[float, str] | str:
    """(seconds, how) or the reason there is none. Preference: a reported step
    time, then tokens/s, then TFLOP/s per GPU inverted with the source's formula."""
    step = _float(row, "measured_step_time_s")
    if step:
        return step, "step time column"
    tokens_s = _float(row, "measured_tokens_per_s")
    if tokens_s:
        return (int(row["global_batch_size"]) * int(row["seq_len"]) / tokens_s,
                "global_batch*seq_len / tokens/s")
    return step_from_tflops(row, model, recompute, gpus)


def build_case(row: dict[str, str], kernels: bool = True, every: bool = False) -> Case | Skip:
    """The plan a row describes, or why it cannot be built. Never adjusts a row. Its cluster
    comes through the door training commands take (``measured.door.corrected``: the measured
    kernel grids that apply, where shipped for the device); ``kernels`` False: the curves
    alone; ``every``: every shipped grid, those that do not apply too (the GEMM grids)."""
    rid, group = row["row_id"], group_of(row)
    fam = family_of(row)
    if fam is None:
        return Skip(rid, group, f"model {row['model']!r} names no known architecture family")
    placed = cluster_for(row["gpu_type"])
    if placed is None:
        return Skip(rid, group, f"GPU {row['gpu_type']!r} is not among the built-in devices")
    cls_name, cluster = placed
    derived: list[str] = []
    try:
        layers, hidden = _int(row, "num_layers"), _int(row, "hidden_size")
        heads = _int(row, "num_attention_heads")
        vocab, seq = _int(row, "vocab_size"), _int(row, "seq_len")
        gpus = _int(row, "num_gpus")
        tp, pp, dp = _int(row, "tp", 1), _int(row, "pp", 1), _int(row, "dp")
        cp, vp, ep = _int(row, "cp", 1), _int(row, "vp", 1), _int(row, "ep", 1)
        mbs, gbs = _int(row, "micro_batch_size"), _int(row, "global_batch_size")
        kv = _int(row, "num_kv_heads", heads)
        ffn = _int(row, "ffn_hidden_size")
        experts = _int(row, "num_experts", 0)
    except ValueError as exc:
        return Skip(rid, group, f"unreadable number: {exc}")
    missing = [k for k, v in (("num_layers", layers), ("hidden_size", hidden),
                              ("num_attention_heads", heads), ("vocab_size", vocab),
                              ("seq_len", seq), ("num_gpus", gpus), ("dp", dp),
                              ("micro_batch_size", mbs), ("global_batch_size", gbs)) if v is None]
    if missing:
        return Skip(rid, group, "missing " + ", ".join(missing))
    assert hidden is not None and heads is not None and kv is not None and gpus is not None
    if experts not in (0, 1):
        return Skip(rid, group, "mixture-of-experts rows are not modelled here")
    if heads % kv or hidden % heads:
        return Skip(rid, group, f"heads={heads} must divide hidden={hidden} and be a multiple "
                                f"of kv_heads={kv}")
    if ffn is None:
        if fam.ffn_ratio is None:
            return Skip(rid, group, "ffn_hidden_size missing and the family has no fixed ratio")
        ffn = fam.ffn_ratio * hidden
        derived.append(f"ffn_hidden {fam.ffn_ratio}h ({fam.label} config)")
    stack = stack_of(row)
    if stack is None:
        return Skip(rid, group, f"framework {row['framework']!r} names no known software stack")
    recompute = recompute_of(row["recompute"])
    if recompute is None:
        return Skip(rid, group, f"recompute {row['recompute']!r} not understood")
    dtype, note = dtype_of(row["precision"])
    if note:
        derived.append(note)
    model = Model(
        name=row["model"], layers=layers, hidden=hidden, heads=heads, kv_heads=kv,
        ffn_hidden=ffn, vocab=vocab, activation=fam.activation, position=fam.position,
        tied_embeddings=fam.tied_embeddings, max_seq_len=seq, norm=fam.norm, bias=fam.bias,
        dropout=fam.dropout,
    )
    try:
        cluster = with_gpus(cluster, gpus, source=rid)
    except AutoplanError as exc:
        return Skip(rid, group, str(exc))
    if kernels:  # the training door (measured/door.py): the device's measured grids, if shipped
        cluster = with_kernels(cluster, every=True) if every else corrected(cluster).cluster
    plan = Plan(
        model=model, cluster=cluster,
        job=Job(global_batch=gbs, seq_len=seq, dtype=dtype, **recipe_states(row, stack)),
        layout=Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vp), micro_batch=mbs,
        schedule=schedule_of(row, vp), recompute=recompute, zero=zero_on(row, stack),
        sequence_parallel=row["sequence_parallel"].strip().lower() in ("yes", "true", "1"),
        stack=builtin_stack(stack),
    )
    problems = plan_problems(plan)
    if problems:
        return Skip(rid, group, "plan rule: " + "; ".join(f"{k}: {msg}" for k, msg in problems))
    try:
        measured = measured_step(row, model, recompute, gpus)
        implied = step_from_tflops(row, model, recompute, gpus)
    except ValueError as exc:
        return Skip(rid, group, f"unreadable measurement: {exc}")
    if isinstance(measured, str):
        return Skip(rid, group, measured)
    check = None
    if not isinstance(implied, str) and implied[1] != measured[1]:
        check = (implied[1], implied[0] / measured[0] - 1)
    return Case(rid, group, cls_name, plan, measured[0], measured[1], tuple(derived), check)


def read_rows(path: Path) -> list[dict[str, str]]:
    """Rows as dicts of stripped strings ("" where a short line leaves a cell out)."""
    with path.open(newline="", encoding="utf-8") as fh:
        return [{k: (v or "").strip() for k, v in r.items() if k is not None}
                for r in csv.DictReader(fh)]


# --------------------------------------------------------------------------- parameters

# What --fit chooses. Kernel rates are not fitted here: they come from kernel benchmarks,
# cited in the device files. Fitted: the stacks' fixed cost per step and the compute
# slowed while NCCL overlaps it, one value for every stack; and each stack's sustained
# share of the kernel rates (compute_efficiency), per stack where the rows fitted on
# include that stack, else one value fitted on all stacks. Not fitted: the host's
# dispatch time per kernel (host_kernel_us): no row here is host-bound, so the loss is
# flat in it (docs/ACCURACY.md); the stack files carry a documented prior.
GLOBAL_PARAMS = ("step_overhead_ms", "comm_compute_slowdown", "compute_efficiency")
BOUNDS = {"step_overhead_ms": (0.0, 400.0),
          # NCCL runs one CTA per channel, at most 32 channels by default (NCCL_MAX_NCHANNELS):
          # at most a quarter of a 108-132-SM GPU
          "comm_compute_slowdown": (0.0, 0.25),
          # below 0.6 a stack would lose more inside its kernels than it keeps: a value
          # there absorbs a cost the model lacks rather than measuring the kernels
          "compute_efficiency": (0.6, 1.0)}
MIN_STACK_ROWS = 5  # a stack's own efficiency is fitted on at least this many rows
STACK_NAMES = ("megatron-core", "megatron-lm", "deepspeed", "torchtitan", "torchtitan-compiled",
               "torchtitan-async-tp", "fsdp", "nemo-1")


def _eff_key(stack: str) -> str:
    return f"compute_efficiency:{stack}"


def committed_params() -> dict[str, float]:
    """What the built-in stack files carry now: the shared values (megatron-core's, which
    has no calibration rows of its own) and each stack's compute efficiency."""
    s = builtin_stack("megatron-core")
    p = {"step_overhead_ms": s.step_overhead_s * 1e3,
         "comm_compute_slowdown": s.comm_compute_slowdown,
         "compute_efficiency": s.compute_efficiency}
    for name in STACK_NAMES:
        p[_eff_key(name)] = builtin_stack(name).compute_efficiency
    return p


def with_params(plan: Plan, p: dict[str, float]) -> Plan:
    stack = dataclasses.replace(
        plan.stack, step_overhead_s=p["step_overhead_ms"] * 1e-3,
        comm_compute_slowdown=p["comm_compute_slowdown"],
        compute_efficiency=p.get(_eff_key(plan.stack.name), p["compute_efficiency"]))
    return dataclasses.replace(plan, stack=stack)


@dataclass(frozen=True, slots=True)
class Result:
    case: Case
    predicted_s: float
    feasible: bool

    @property
    def error(self) -> float:
        """Signed relative error (predicted - measured) / measured."""
        return self.predicted_s / self.case.measured_s - 1


def predict(cases: Iterable[Case], params: dict[str, float] | None) -> list[Result]:
    """Evaluate every case with the parameters given (None: the files as they are)."""
    out = []
    for case in cases:
        plan = case.plan if params is None else with_params(case.plan, params)
        pred = evaluate(plan)
        out.append(Result(case, pred.step_time_s, pred.feasible))
    return out


def mape(results: Sequence[Result]) -> float:
    return 100 * statistics.fmean(abs(r.error) for r in results)


def median_signed(results: Sequence[Result]) -> float:
    return 100 * statistics.median(r.error for r in results)


def bias(results: Sequence[Result]) -> float:
    """Mean signed error, percent: negative means predicted too fast."""
    return 100 * statistics.fmean(r.error for r in results)


def log_loss(results: Sequence[Result]) -> float:
    """Mean |ln(predicted / measured)|: symmetric in over- and under-prediction."""
    return statistics.fmean(abs(math.log(r.predicted_s / r.case.measured_s)) for r in results)


def _ranks(values: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson on average ranks); None if either is constant."""
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    if va == 0 or vb == 0:
        return None
    return sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True)) / math.sqrt(va * vb)


@dataclass(frozen=True, slots=True)
class Ranking:
    """One group of rows a planner would choose between (same model, GPUs, batch, sequence)."""

    key: tuple
    rows: int
    spearman: float | None
    regret: float  # measured time of the plan predicted fastest over the fastest measured, - 1


def rankings(results: Sequence[Result]) -> list[Ranking]:
    by: dict[tuple, list[Result]] = {}
    for r in results:
        by.setdefault(r.case.job_key, []).append(r)
    out = []
    for key, rs in sorted(by.items()):
        if len(rs) < 2 or len({r.case.measured_s for r in rs}) < 2:
            continue
        pick = min(rs, key=lambda r: r.predicted_s)
        best = min(r.case.measured_s for r in rs)
        out.append(Ranking(key, len(rs), spearman([r.predicted_s for r in rs],
                                                  [r.case.measured_s for r in rs]),
                           pick.case.measured_s / best - 1))
    return out


# --------------------------------------------------------------------------- fitting

def _descend(cases: Sequence[Case], p: dict[str, float], names: Sequence[str],
             sweeps: int, log: Callable[[str], None]) -> dict[str, float]:
    """Coordinate descent over ``names`` within BOUNDS minimising mean |ln(pred/meas)|:
    a coarse grid to find the basin, then golden-section inside it (the library's
    ``autoplan.tune.calibrate.descend``, which ``autoplan calibrate`` runs on a user's runs)."""
    def after(sweep: int, q: dict[str, float]) -> None:
        log(f"  sweep {sweep + 1}: " + ", ".join(f"{k}={q[k]:g}" for k in names)
            + f"  loss={log_loss(predict(cases, q)):.4f}\n")

    return descend(lambda q: log_loss(predict(cases, q)), p, names,
                   lambda name: BOUNDS[name.split(":")[0]], sweeps, after)


def fit(cases: Sequence[Case], start: dict[str, float], sweeps: int = 2,
        log: Callable[[str], None] = lambda _: None) -> dict[str, float]:
    """The shared values on every case (each stack at the shared efficiency), then each
    stack with enough cases its own efficiency, then the shared values again. It sees
    only the cases given; stacks it has no cases of keep the shared efficiency."""
    p = {k: v for k, v in start.items() if ":" not in k}
    p = _descend(cases, p, GLOBAL_PARAMS, sweeps, log)
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.stack] = counts.get(c.stack, 0) + 1
    own = [_eff_key(s) for s, n in sorted(counts.items()) if n >= MIN_STACK_ROWS]
    for key in own:
        p[key] = p["compute_efficiency"]
    p = _descend(cases, p, own, 1, log)
    return _descend(cases, p, GLOBAL_PARAMS[:2], 1, log)


def cross_validate(cases: Sequence[Case], log: Callable[[str], None] = lambda _: None
                   ) -> tuple[list[Result], dict[str, dict[str, float]]]:
    """Leave one source out: each source's rows predicted with parameters fitted on the
    other sources only. Returns the held-out predictions and each fold's parameters."""
    out: list[Result] = []
    folds: dict[str, dict[str, float]] = {}
    start = committed_params()
    for source in sorted({c.source for c in cases}):
        train = [c for c in cases if c.source != source]
        held = [c for c in cases if c.source == source]
        log(f"fold without {source}: {len(train)} rows to fit, {len(held)} held out\n")
        params = fit(train, start, log=log) if train else dict(start)
        folds[source] = params
        out.extend(predict(held, params))
    order = {c.row_id: i for i, c in enumerate(cases)}
    out.sort(key=lambda r: order[r.case.row_id])
    return out, folds


# --------------------------------------------------------------------------- report

@dataclass(frozen=True, slots=True)
class Report:
    csv_path: Path
    rows_total: int
    rows_ready: int
    cases: tuple[Case, ...]
    skips: tuple[Skip, ...]
    committed: tuple[Result, ...]  # the built-in files as they are (fitted on all rows)
    held_out: tuple[Result, ...]  # leave-one-source-out (empty with --no-cv)
    folds: dict[str, dict[str, float]]


def build_report(path: Path, cv: bool = True, log: Callable[[str], None] = lambda _: None,
                 kernels: bool = True, every: bool = False) -> Report:
    rows = read_rows(path)
    ready = [r for r in rows if r.get("validation_ready", "").strip().lower() == "yes"]
    built = [build_case(r, kernels, every) for r in ready]
    cases = tuple(c for c in built if isinstance(c, Case))
    skips = tuple(c for c in built if isinstance(c, Skip))
    held, folds = cross_validate(cases, log) if cv and cases else ([], {})
    return Report(path, len(rows), len(ready), cases, skips, tuple(predict(cases, None)),
                  tuple(held), folds)


def _by(results: Sequence[Result], key: Callable[[Case], str]) -> dict[str, list[Result]]:
    out: dict[str, list[Result]] = {}
    for r in results:
        out.setdefault(key(r.case), []).append(r)
    return out


def regime_of(c: Case) -> str:
    """The regimes the issue tracker's accuracy targets name: one node or many, small
    models or large, model-parallel (Megatron / DeepSpeed) or sharded data parallel."""
    p = c.plan
    nodes = "1 node" if p.layout.gpus <= p.cluster.gpus_per_node else "multi-node"
    size = "<= 1.3B" if p.model.params_total <= 1.3e9 else "> 1.3B"
    kind = "FSDP / ZeRO-3" if p.stack.name in ("fsdp", "torchtitan", "torchtitan-compiled") or (
        p.zero == ZeroStage.PARAMETERS) else "model parallel"
    return f"{nodes}, {size}, {kind}"


SLICES: tuple[tuple[str, Callable[[Case], str]], ...] = (
    ("regime", regime_of),
    ("source", lambda c: c.source),
    ("source table", lambda c: c.group),
    ("device", lambda c: c.device_class),
    ("dtype", lambda c: c.dtype),
    ("stack", lambda c: c.stack),
)


def _slice_rows(rep: Report, key: Callable[[Case], str]) -> list[tuple]:
    """(label, rows, committed MAPE, committed bias, held-out MAPE, held-out bias,
    median Spearman, worst regret, groups) per value of ``key``."""
    com, held = _by(rep.committed, key), _by(rep.held_out, key)
    out = []
    for label in sorted(com):
        h = held.get(label, [])
        ranks = rankings(h or com[label])
        rhos = [r.spearman for r in ranks if r.spearman is not None]
        out.append((label, len(com[label]), mape(com[label]), bias(com[label]),
                    mape(h) if h else None, bias(h) if h else None,
                    statistics.median(rhos) if rhos else None,
                    max((r.regret for r in ranks), default=None), len(ranks)))
    return out


def _overall(rep: Report) -> tuple:
    ranks = rankings(rep.held_out or rep.committed)
    rhos = [r.spearman for r in ranks if r.spearman is not None]
    h = rep.held_out
    return ("overall", len(rep.committed), mape(rep.committed), bias(rep.committed),
            mape(h) if h else None, bias(h) if h else None,
            statistics.median(rhos) if rhos else None,
            max((r.regret for r in ranks), default=None), len(ranks))


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1f}%" if signed else f"{x:.1f}%"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _how_counts(rep: Report) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in rep.cases:
        out[c.how] = out.get(c.how, 0) + 1
    return out


def _checks(rep: Report) -> list[tuple[str, int, float, float]]:
    """(conversion, rows, median, max |deviation|) over rows that give both a step time
    and TFLOP/s: how well each TFLOP/s inversion reproduces a measured step time."""
    by: dict[str, list[float]] = {}
    for c in rep.cases:
        if c.check is not None:
            by.setdefault(c.check[0], []).append(c.check[1])
    return [(how, len(v), 100 * statistics.median(v), 100 * max(abs(x) for x in v))
            for how, v in sorted(by.items())]


def _skip_reasons(rep: Report) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in rep.skips:
        out.setdefault(s.reason, []).append(s.row_id)
    return out


def _params_text(p: dict[str, float]) -> str:
    return ", ".join(f"{k.replace('compute_efficiency:', 'eff ')} {v:g}" for k, v in p.items())


TABLE_HEAD = ("rows", "MAPE (files)", "bias (files)", "MAPE (held out)", "bias (held out)",
              "Spearman (median)", "top-1 regret (worst)", "groups")


def _row_cells(row: tuple) -> list[str]:
    label, n, m_c, b_c, m_h, b_h, rho, regret, groups = row
    return [label, str(n), _pct(m_c), _pct(b_c, True), _pct(m_h), _pct(b_h, True), _num(rho),
            _pct(None if regret is None else 100 * regret), str(groups)]


def print_text(rep: Report, out=sys.stdout) -> None:
    w = out.write
    w(f"calibration rows: {rep.csv_path}\n")
    w(f"  {rep.rows_total} rows, {rep.rows_ready} validation-ready, {len(rep.cases)} predicted, "
      f"{len(rep.skips)} skipped\n")
    w(f"  in the files: {_params_text(committed_params())} (fitted on all rows: calibration); "
      "held out: each source predicted by a fit on the others\n")
    for name, key in SLICES:
        w(f"\nby {name}:\n")
        w(f"{name:<40} " + " ".join(f"{h:>12}" for h in TABLE_HEAD) + "\n")
        for row in _slice_rows(rep, key):
            cells = _row_cells(row)
            w(f"{cells[0]:<40} " + " ".join(f"{c:>12}" for c in cells[1:]) + "\n")
    cells = _row_cells(_overall(rep))
    w(f"\n{cells[0]:<40} " + " ".join(f"{c:>12}" for c in cells[1:]) + "\n")
    if rep.folds:
        w("\nparameters fitted per fold (without the source named):\n")
        for src, p in rep.folds.items():
            w(f"  {src:<38} {_params_text(p)}\n")
    w("\nmeasured step time obtained from:\n")
    for how, n in sorted(_how_counts(rep).items()):
        w(f"  {n:>4}  {how}\n")
    for how, n, med, worst in _checks(rep):
        w(f"  cross-check, {n} rows giving both step time and TFLOP/s: {how} reproduces the "
          f"step time to {med:+.1f}% (median), {worst:.1f}% (worst)\n")
    if rep.skips:
        w("\nskipped validation-ready rows:\n")
        for reason, ids in sorted(_skip_reasons(rep).items()):
            w(f"  {len(ids):>4}  {reason}  ({', '.join(ids)})\n")
    held = {r.case.row_id: r for r in rep.held_out}
    w("\nper row:\n")
    w(f"{'row':<11} {'class':<5} {'stack':<12} {'measured s':>10} {'files s':>9} {'error':>7} "
      f"{'held out':>8}  how\n")
    for r in rep.committed:
        h = held.get(r.case.row_id)
        oom = "  [predicted OOM]" if not r.feasible else ""
        w(f"{r.case.row_id:<11} {r.case.device_class:<5} {r.case.stack:<12} "
          f"{r.case.measured_s:>10.3f} {r.predicted_s:>9.3f} {100 * r.error:>+6.1f}% "
          f"{'' if h is None else f'{100 * h.error:+.1f}%':>8}  {r.case.how}{oom}\n")
    mh = f", {mape(rep.held_out):.1f}% held out" if rep.held_out else ""
    w(f"\nMAPE overall: {mape(rep.committed):.1f}% with the files{mh}, "
      f"over {len(rep.committed)} rows\n")


def _md_table(rows: list[tuple], first: str, w: Callable[[str], None]) -> None:
    w(f"| {first} | " + " | ".join(TABLE_HEAD) + " |\n|---|" + "---:|" * len(TABLE_HEAD) + "\n")
    for row in rows:
        cells = _row_cells(row)
        bold = "**" if cells[0] == "overall" else ""
        w(f"| {bold}{cells[0]}{bold} | " + " | ".join(cells[1:]) + " |\n")


def print_markdown(rep: Report, out=sys.stdout) -> None:
    w = out.write
    today = datetime.date.today().isoformat()
    w("# Prediction accuracy on published training runs\n\n")
    w("Two numbers per slice. **Held out** is the validation claim: every source's rows are "
      "predicted with the stack constants fitted on the *other* sources only "
      "(leave-one-source-out cross-validation). **Files** is a calibration result: the "
      "values committed in `profiles/stacks/` were fitted on all rows these tables score. "
      "Kernel rates (GEMM, attention, HBM, links) are not fitted here: they come from public "
      "kernel benchmarks cited in `profiles/hardware/`. No row is special-cased.\n\n")
    w(f"- Command: `{COMMAND}` (generated {today}); everything above the hand-written "
      "section *What dominates the error* at the end is its output\n")
    w(f"- Data: `shared/data/calibration_runs.csv`: {rep.rows_total} rows, {rep.rows_ready} "
      f"marked `validation_ready`, {len(rep.cases)} predicted, {len(rep.skips)} skipped (below)\n")
    w(f"- In the files: {_params_text(committed_params())}\n")
    w("- Ranking: a group is the rows with the same model, GPU kind and count, global batch "
      "and sequence length from one source (the choices a planner makes between); Spearman is the rank "
      "correlation of predicted and measured step time within a group (median over groups), "
      "top-1 regret how much slower the plan predicted fastest measured than the fastest "
      "measured (worst group)\n")
    w("- Bias is the mean signed error (predicted - measured) / measured: negative means "
      "autoplan predicts a faster step than was measured\n\n")
    for name, key in SLICES:
        w(f"## By {name}\n\n")
        _md_table(_slice_rows(rep, key) + ([_overall(rep)] if name == "regime" else []), name, w)
        w("\n")
    if rep.folds:
        w("## Parameters per fold\n\n| left out | fitted on the others |\n|---|---|\n")
        for src, p in rep.folds.items():
            w(f"| {src} | {_params_text(p)} |\n")
        w("\n")
    w("## How the measured step time was obtained\n\n")
    w("| rows | from |\n|---:|---|\n")
    for how, n in sorted(_how_counts(rep).items()):
        w(f"| {n} | {how} |\n")
    w("\nTFLOP/s in the Megatron-LM SC'21 tables and in BLOOM's logs count the recompute "
      "forward (hardware FLOPs, HFU); they are inverted with eq. (3) of Narayanan et al. "
      "(SC'21), 96·B·s·l·h²·(1 + s/6h + V/16lh) with full recompute. llm-foundry's model "
      "TFLOP/s count the full s x s attention square (non-causal). Rows with a step time or "
      "tokens/s use those directly; the cross-check below applies each inversion to rows that "
      "give both.\n\n")
    if _checks(rep):
        w("| conversion | rows | median deviation | worst |\n|---|---:|---:|---:|\n")
        for how, n, med, worst in _checks(rep):
            w(f"| {how} | {n} | {med:+.1f}% | {worst:.1f}% |\n")
        w("\n")
    w("## Skipped validation-ready rows\n\n")
    if rep.skips:
        w("| rows | reason | row ids |\n|---:|---|---|\n")
        for reason, ids in sorted(_skip_reasons(rep).items()):
            w(f"| {len(ids)} | {reason} | {', '.join(ids)} |\n")
    else:
        w("None.\n")
    derived: dict[str, list[str]] = {}
    for c in rep.cases:
        for d in c.derived:
            derived.setdefault(d, []).append(c.row_id)
    w("\n## What was not in the row\n\n")
    w("Architecture details the CSV does not carry come from the family the row's `model` "
      "names (never from dimension ratios):\n\n")
    for fam in FAMILIES:
        w(f"- {fam.label}: {fam.activation.value}, {fam.norm.value}, {fam.position.value}, "
          f"{'tied' if fam.tied_embeddings else 'untied'} embeddings, "
          f"{'biases' if fam.bias else 'no biases'}, "
          f"{'dropout' if fam.dropout else 'no dropout'}; {fam.source}\n")
    w("- MPT and BLOOM use ALiBi, which autoplan's `Position` cannot express; `rope` stands in "
      "(no position parameters either).\n")
    w("- Stack, from the row's framework: " + "; ".join(f"`{pat}` -> {st}" for pat, st in STACKS)
      + " (torchtitan rows naming torch.compile: torchtitan-compiled; NeMo 1.x rows, by the "
        "framework's text or a 1.x or 24.01-24.07 version: nemo-1).\n")
    w("- Recompute: `full...` is full, `selective...` selective. torchtitan's *selective layer* "
      "and *selective op* checkpointing are not Megatron-LM's attention-core recompute; "
      "autoplan has no closer choice.\n")
    w("- Sharding: FSDP FULL_SHARD, FSDP2 and ZeRO-3 are zero 3, SHARD_GRAD_OP zero 2, "
      "ZeRO-1, a distributed optimizer or distributed_fused_adam zero 1 (a NeMo 1.x row that "
      "names none: its recipes' distributed_fused_adam), anything else zero 0.\n")
    w("- States: the stack's (profiles/stacks/*.yaml `states`), but where a recipe's own config "
      "sets others: " + "; ".join(f"{pat.pattern} on {st}: "
                                  + ", ".join(f"{k} {v.value}" for k, v in states.items())
                                  for st, pat, states in RECIPE_STATES) + ".\n")
    w("- Cluster: A100-40GB rows run on `dgx-a100` with `a100-40gb` devices, other A100 rows "
      "on `dgx-a100`, H100 rows on `dgx-h100`, whatever site the row names.\n")
    for d, ids in sorted(derived.items()):
        w(f"- {d}: {len(ids)} row{'s' if len(ids) > 1 else ''} ({_id_span(ids)})\n")
    held = {r.case.row_id: r for r in rep.held_out}
    w("\n## Per row\n\n<details><summary>"
      f"{len(rep.committed)} rows</summary>\n\n")
    w("| row | group | stack | class | measured s | files s | error | held out |\n"
      "|---|---|---|---|---:|---:|---:|---:|\n")
    for r in rep.committed:
        h = held.get(r.case.row_id)
        oom = " (predicted OOM)" if not r.feasible else ""
        w(f"| {r.case.row_id} | {r.case.group} | {r.case.stack} | {r.case.device_class} | "
          f"{r.case.measured_s:.3f} | {r.predicted_s:.3f} | {100 * r.error:+.1f}%{oom} | "
          f"{'-' if h is None else f'{100 * h.error:+.1f}%'} |\n")
    w("\n</details>\n")


def _id_span(ids: list[str]) -> str:
    return ", ".join(ids) if len(ids) <= 6 else f"{ids[0]} ... {ids[-1]}"


# --------------------------------------------------------------------------- main

def run_fit(rep: Report, out=sys.stdout) -> None:
    w = out.write
    w(f"fitting {', '.join(GLOBAL_PARAMS)} (shared) and each stack's compute_efficiency on "
      f"all {len(rep.cases)} rows, minimising mean |ln(pred/meas)|\n")
    start = committed_params()
    before = predict(rep.cases, start)
    fitted = fit(rep.cases, start, log=w)
    after = predict(rep.cases, fitted)
    w(f"  MAPE {mape(before):.1f}% -> {mape(after):.1f}%   "
      f"mean |ln| {log_loss(before):.4f} -> {log_loss(after):.4f}\n")
    at_bound = [n for n in fitted if fitted[n] in BOUNDS[n.split(":")[0]]]
    if at_bound:
        w(f"  at a bound of its range: {', '.join(at_bound)} (the term absorbs something the "
          "model lacks)\n")
    today = datetime.date.today().isoformat()
    w(f"  profiles/stacks/*.yaml (calibration, not validation; {today}):\n")
    for name in STACK_NAMES:
        eff = fitted.get(_eff_key(name), fitted["compute_efficiency"])
        own = "own rows" if _eff_key(name) in fitted else "no rows: the shared value"
        w(f"    {name}: step_overhead_ms: "
          f"{fitted['step_overhead_ms']:g}, comm_compute_slowdown: "
          f"{fitted['comm_compute_slowdown']:g}, compute_efficiency: {eff:g} ({own})\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV,
                    help=f"calibration CSV (default: {DEFAULT_CSV})")
    ap.add_argument("--markdown", action="store_true", help="print docs/ACCURACY.md")
    ap.add_argument("--fit", action="store_true",
                    help="fit the stacks' host costs on every row and print them")
    ap.add_argument("--no-cv", action="store_true",
                    help="skip leave-one-source-out cross-validation (the files' numbers only)")
    ap.add_argument("--verbose", action="store_true", help="log each fit's sweeps to stderr")
    grids = ap.add_mutually_exclusive_group()
    grids.add_argument("--no-kernels", action="store_true",
                       help="cost on the efficiency curves alone, without the devices' measured kernel "
                            "grids (profiles/measured/kernels/)")
    grids.add_argument("--gemm-grids", action="store_true",
                       help="cost with every shipped grid, the GEMM grids (applies: no) too")
    args = ap.parse_args(argv)
    if not args.csv.is_file():
        print(f"error: calibration CSV not found: {args.csv} (pass --csv PATH)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    log = sys.stderr.write if args.verbose else (lambda _: None)
    # one cost scope for the whole run: the fits' sweeps evaluate the same plans again and
    # again, and share their layers' costs (autoplan.caches)
    with caches.scope():
        return _report(args, log, t0)


def _report(args: argparse.Namespace, log: Callable[[str], None], t0: float) -> int:
    try:
        rep = build_report(args.csv, cv=not (args.no_cv or args.fit), log=log,
                           kernels=not args.no_kernels, every=args.gemm_grids)
    except (KeyError, csv.Error) as exc:
        print(f"error: {args.csv}: not a calibration CSV ({exc})", file=sys.stderr)
        return 2
    if not rep.cases:
        print(f"error: {args.csv}: no validation-ready row could be predicted", file=sys.stderr)
        return 2
    if args.fit:
        run_fit(rep)
    elif args.markdown:
        print_markdown(rep)
    else:
        print_text(rep)
        print_kernel_checks()
    print(f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0


def print_kernel_checks(out=sys.stdout) -> None:
    """What no calibration row exercises, checked at the kernel level: MoE dispatch against
    DeepEP's published bandwidths (benchmarks/moe_dispatch.py), and the host time per
    launched kernel measured by benchmarks/host_dispatch.py (saved under benchmarks/host/)."""
    import importlib.util
    import json
    from pathlib import Path

    here = Path(__file__).resolve().parent
    out.write("\nkernel-level checks (no calibration row runs MoE or is host-bound):\n")
    spec = importlib.util.spec_from_file_location("moe_dispatch", here / "moe_dispatch.py")
    assert spec is not None and spec.loader is not None
    moe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moe)
    moe.main()
    out.write("host time per launched kernel, eager decoder layer (benchmarks/host_dispatch.py; "
              "stacks' prior 10 us):\n")
    for path in sorted(here.glob("host/*-dispatch.json")):
        runs = json.loads(path.read_text())
        fwd = sorted(r[0]["seconds"] for r in runs["runs"])[len(runs["runs"]) // 2]
        bwd = sorted(r[1]["seconds"] for r in runs["runs"])[len(runs["runs"]) // 2]
        k_f, k_b = runs["runs"][0][0]["k"], runs["runs"][0][1]["k"]
        out.write(f"  {path.name}: {runs['device']} ({runs['device_name']}), torch {runs['torch']}: "
                  f"forward {fwd * 1e6:.2f} us x {k_f} kernels, backward {bwd * 1e6:.2f} us x "
                  f"{k_b} kernels\n")


if __name__ == "__main__":
    sys.exit(main())
