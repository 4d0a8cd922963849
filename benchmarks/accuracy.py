"""Predicted vs measured step time on published training runs.

    python benchmarks/accuracy.py [--csv PATH] [--markdown | --fit [--fit-links]]

Reads ``calibration_runs.csv`` (default: ``shared/data/calibration_runs.csv``
beside the checkout, see its README), builds one autoplan Plan per row marked
``validation_ready == yes`` from that row's columns alone, evaluates it and
compares the predicted step time with the measured one, per source and overall.

The built-in A100 and H100 device files carry efficiency constants that
``--fit`` chose on these same rows, so the numbers printed are a *calibration* claim
(how well a few physical constants can explain these runs), not a validation
claim (how well autoplan predicts runs it has not seen).

``--fit`` chooses, per device class (A100, H100), the achievable GEMM and
attention efficiencies that minimise the mean |ln(predicted / measured)| over
that class's rows, starting from the uncalibrated defaults of
``autoplan/descriptors/hardware.py``; it prints the values (as the YAML to put
in the device files) and the error before and after. ``--fit-links`` also fits
the NVLink and network bus efficiencies. It never looks at one row alone.

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

from autoplan.cost.evaluate import evaluate
from autoplan.cost.flops import model_flops_per_step
from autoplan.descriptors import hardware
from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_device, with_gpus
from autoplan.descriptors.model import Model
from autoplan.errors import AutoplanError
from autoplan.parallel.rules import plan_problems
from autoplan.plan import Layout, Plan
from autoplan.vocab import Activation, Dtype, Norm, Position, Recompute, Schedule, ZeroStage

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
    if "zero-1" in fsdp or "distributed optimizer" in text or "distributed-optimizer" in text:
        return ZeroStage.OPTIMIZER
    return ZeroStage.NONE


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


def build_case(row: dict[str, str]) -> Case | Skip:
    """The plan a row describes, or why it cannot be built. Never adjusts a row."""
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
    plan = Plan(
        model=model, cluster=cluster, job=Job(global_batch=gbs, seq_len=seq, dtype=dtype),
        layout=Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vp), micro_batch=mbs,
        schedule=schedule_of(row, vp), recompute=recompute, zero=zero_of(row),
        sequence_parallel=row["sequence_parallel"].strip().lower() in ("yes", "true", "1"),
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

# What --fit chooses: the compute efficiencies. The link efficiencies join with
# --fit-links; on these rows they are not identified (see docs/ACCURACY.md).
FIT_PARAMS = ("gemm", "attention")
LINK_PARAMS = ("intra", "inter")
BOUNDS = {"gemm": (0.40, 0.95), "attention": (0.15, 0.90), "hbm": (0.40, 0.95), "intra": (0.40, 1.00),
          "inter": (0.40, 1.00)}

DEFAULTS = {"gemm": hardware.DEFAULT_GEMM_EFFICIENCY,
            "attention": hardware.DEFAULT_ATTENTION_EFFICIENCY,
            "hbm": hardware.DEFAULT_HBM_EFFICIENCY,
            "intra": hardware.DEFAULT_LINK_EFFICIENCY, "inter": hardware.DEFAULT_LINK_EFFICIENCY}


def profile_params(cls: DeviceClass) -> dict[str, float]:
    """The values the built-in files carry now (the first device of the class)."""
    c = resolve_cluster(cls.cluster)
    d = resolve_device(cls.devices[0], "benchmarks/accuracy.py", "device")
    return {"gemm": d.gemm_efficiency, "attention": d.attention_efficiency,
            "hbm": d.hbm_efficiency,
            "intra": c.intra_node.efficiency, "inter": c.inter_node.efficiency}


def with_params(plan: Plan, p: dict[str, float]) -> Plan:
    c = plan.cluster
    device = dataclasses.replace(c.device, gemm_efficiency=p["gemm"],
                                 attention_efficiency=p["attention"], hbm_efficiency=p["hbm"])
    cluster = dataclasses.replace(
        c, device=device,
        intra_node=dataclasses.replace(c.intra_node, efficiency=p["intra"]),
        inter_node=dataclasses.replace(c.inter_node, efficiency=p["inter"]))
    return dataclasses.replace(plan, cluster=cluster)


@dataclass(frozen=True, slots=True)
class Result:
    case: Case
    predicted_s: float
    feasible: bool

    @property
    def error(self) -> float:
        """Signed relative error (predicted - measured) / measured."""
        return self.predicted_s / self.case.measured_s - 1


def predict(cases: Iterable[Case], params: dict[str, dict[str, float]] | None) -> list[Result]:
    """Evaluate every case with the class parameters given (None: the files as they are)."""
    out = []
    for case in cases:
        plan = case.plan if params is None else with_params(case.plan, params[case.device_class])
        pred = evaluate(plan)
        out.append(Result(case, pred.step_time_s, pred.feasible))
    return out


def mape(results: Sequence[Result]) -> float:
    return 100 * statistics.fmean(abs(r.error) for r in results)


def median_signed(results: Sequence[Result]) -> float:
    return 100 * statistics.median(r.error for r in results)


def log_loss(results: Sequence[Result]) -> float:
    """Mean |ln(predicted / measured)|: symmetric in over- and under-prediction."""
    return statistics.fmean(abs(math.log(r.predicted_s / r.case.measured_s)) for r in results)


# --------------------------------------------------------------------------- fitting

def _golden(f: Callable[[float], float], lo: float, hi: float, steps: int = 14) -> float:
    """Minimise f on [lo, hi] by golden-section search (f assumed unimodal)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def fit_class(cases: Sequence[Case], start: dict[str, float], names: Sequence[str],
              sweeps: int = 4, log: Callable[[str], None] = lambda _: None) -> dict[str, float]:
    """Coordinate descent over ``names`` within BOUNDS: a coarse grid to find the basin,
    then golden-section inside it. Rounded to 0.01 (more digits would be noise)."""
    p = dict(start)

    def loss_with(name: str, value: float) -> float:
        q = dict(p, **{name: value})
        return log_loss(predict(cases, {cases[0].device_class: q}))

    for sweep in range(sweeps):
        before = dict(p)
        for name in names:
            lo, hi = BOUNDS[name]
            grid = [lo + (hi - lo) * i / 10 for i in range(11)]
            losses = [loss_with(name, v) for v in grid]
            i = min(range(len(grid)), key=lambda k: (losses[k], k))
            a, b = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
            p[name] = round(_golden(lambda v, n=name: loss_with(n, v), a, b), 2)
        log(f"  sweep {sweep + 1}: " + ", ".join(f"{k}={v:.2f}" for k, v in p.items())
            + f"  loss={log_loss(predict(cases, {cases[0].device_class: p})):.4f}\n")
        if p == before:
            break
    return p


# --------------------------------------------------------------------------- report

@dataclass(frozen=True, slots=True)
class Report:
    csv_path: Path
    rows_total: int
    rows_ready: int
    cases: tuple[Case, ...]
    skips: tuple[Skip, ...]
    calibrated: tuple[Result, ...]  # the built-in files as they are
    uncalibrated: tuple[Result, ...]  # hardware.py defaults everywhere


def build_report(path: Path) -> Report:
    rows = read_rows(path)
    ready = [r for r in rows if r.get("validation_ready", "").strip().lower() == "yes"]
    built = [build_case(r) for r in ready]
    cases = tuple(c for c in built if isinstance(c, Case))
    skips = tuple(c for c in built if isinstance(c, Skip))
    defaults = {cls.name: dict(DEFAULTS) for cls in CLASSES}
    return Report(path, len(rows), len(ready), cases, skips,
                  tuple(predict(cases, None)), tuple(predict(cases, defaults)))


def _groups(results: Sequence[Result]) -> dict[str, list[Result]]:
    out: dict[str, list[Result]] = {}
    for r in results:
        out.setdefault(r.case.group, []).append(r)
    return out


def _summary_rows(rep: Report) -> list[tuple[str, int, float, float, float, float]]:
    """(label, rows, MAPE uncal., MAPE cal., median signed cal., median signed uncal.)"""
    cal, unc = _groups(rep.calibrated), _groups(rep.uncalibrated)
    rows = []
    for g in sorted(cal):
        rows.append((g, len(cal[g]), mape(unc[g]), mape(cal[g]), median_signed(cal[g]),
                     median_signed(unc[g])))
    for cls in CLASSES:
        c = [r for r in rep.calibrated if r.case.device_class == cls.name]
        u = [r for r in rep.uncalibrated if r.case.device_class == cls.name]
        if c:
            rows.append((f"all {cls.name}", len(c), mape(u), mape(c), median_signed(c),
                         median_signed(u)))
    rows.append(("overall", len(rep.calibrated), mape(rep.uncalibrated), mape(rep.calibrated),
                 median_signed(rep.calibrated), median_signed(rep.uncalibrated)))
    return rows


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


def _param_text(cls: DeviceClass) -> str:
    p = profile_params(cls)
    return (f"gemm {p['gemm']:.2f}, attention {p['attention']:.2f}, "
            f"NVLink bus {p['intra']:.2f}, network bus {p['inter']:.2f}")


def print_text(rep: Report, out=sys.stdout) -> None:
    w = out.write
    w(f"calibration rows: {rep.csv_path}\n")
    w(f"  {rep.rows_total} rows, {rep.rows_ready} validation-ready, {len(rep.cases)} predicted, "
      f"{len(rep.skips)} skipped\n")
    w("  calibration, not validation: the efficiencies in profiles/ were fitted on these rows\n")
    for cls in CLASSES:
        w(f"  {cls.name} ({cls.cluster}): {_param_text(cls)}\n")
    w("\n")
    head = f"{'group':<44} {'rows':>4} {'MAPE uncal':>10} {'MAPE cal':>9} {'median err':>10}\n"
    w(head)
    w("-" * (len(head) - 1) + "\n")
    for label, n, m_u, m_c, med_c, _ in _summary_rows(rep):
        w(f"{label:<44} {n:>4} {m_u:>9.1f}% {m_c:>8.1f}% {med_c:>+9.1f}%\n")
    w("\nMAPE uncal: every device and link at the defaults of autoplan/descriptors/hardware.py\n")
    w("MAPE cal: the built-in profiles as they are; median err: signed, (pred - meas) / meas\n")
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
    w("\nper row (calibrated):\n")
    w(f"{'row':<11} {'class':<5} {'measured s':>10} {'predicted s':>11} {'error':>7}  how\n")
    for r in rep.calibrated:
        oom = "  [predicted OOM]" if not r.feasible else ""
        w(f"{r.case.row_id:<11} {r.case.device_class:<5} {r.case.measured_s:>10.3f} "
          f"{r.predicted_s:>11.3f} {100 * r.error:>+6.1f}%  {r.case.how}{oom}\n")
    w(f"\nMAPE overall (calibrated): {mape(rep.calibrated):.1f}% over {len(rep.calibrated)} rows\n")


def print_markdown(rep: Report, out=sys.stdout) -> None:
    w = out.write
    today = datetime.date.today().isoformat()
    w("# Prediction accuracy on published training runs\n\n")
    w("**This is a calibration result, not a validation result.** The efficiency constants in "
      "`profiles/hardware/` (achievable GEMM and attention efficiency per device class) were "
      "fitted with `python benchmarks/accuracy.py --fit` on the same rows this table scores; "
      "the link efficiencies and the other device constants keep their defaults. The numbers "
      "say how well a handful of physical constants explain these runs, not how well autoplan "
      "predicts a run it has not seen. No row is special-cased.\n\n")
    w(f"- Command: `{COMMAND}` (generated {today}); everything above the hand-written "
      "section *What dominates the error* at the end is its output\n")
    w(f"- Data: `shared/data/calibration_runs.csv`: {rep.rows_total} rows, {rep.rows_ready} "
      f"marked `validation_ready`, {len(rep.cases)} predicted, {len(rep.skips)} skipped (below)\n")
    for cls in CLASSES:
        w(f"- {cls.name} (`{cls.cluster}`, devices {', '.join(cls.devices)}): {_param_text(cls)}\n")
    w("\n## Step time, per source\n\n")
    w("| source group | rows | MAPE uncalibrated | MAPE calibrated | median signed error "
      "(calibrated) |\n|---|---:|---:|---:|---:|\n")
    for label, n, m_u, m_c, med_c, _ in _summary_rows(rep):
        bold = "**" if label == "overall" else ""
        w(f"| {bold}{label}{bold} | {n} | {m_u:.1f}% | {bold}{m_c:.1f}%{bold} | {med_c:+.1f}% |\n")
    w("\n*Uncalibrated*: every device and link at the defaults of "
      "`autoplan/descriptors/hardware.py` (gemm "
      f"{DEFAULTS['gemm']:.2f}, attention {DEFAULTS['attention']:.2f}, links "
      f"{DEFAULTS['intra']:.2f}). *Calibrated*: the built-in profiles as committed. "
      "Signed error is (predicted - measured) / measured: negative means autoplan predicts "
      "a faster step than was measured.\n\n")
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
        w("Cross-check on rows that report both a step time and TFLOP/s:\n\n"
          "| conversion | rows | median deviation | worst |\n|---|---:|---:|---:|\n")
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
    w("- Recompute: `full...` is full, `selective...` selective. torchtitan's *selective layer* "
      "and *selective op* checkpointing are not Megatron-LM's attention-core recompute; "
      "autoplan has no closer choice.\n")
    w("- Sharding: FSDP FULL_SHARD, FSDP2 and ZeRO-3 are zero 3, SHARD_GRAD_OP zero 2, "
      "ZeRO-1 or a distributed optimizer zero 1, anything else zero 0.\n")
    w("- Cluster: A100-40GB rows run on `dgx-a100` with `a100-40gb` devices, other A100 rows "
      "on `dgx-a100`, H100 rows on `dgx-h100`, whatever site the row names.\n")
    for d, ids in sorted(derived.items()):
        w(f"- {d}: {len(ids)} row{'s' if len(ids) > 1 else ''} ({_id_span(ids)})\n")
    w("\n## Per row (calibrated)\n\n<details><summary>"
      f"{len(rep.calibrated)} rows</summary>\n\n")
    w("| row | group | class | measured s | predicted s | error | measured from |\n"
      "|---|---|---|---:|---:|---:|---|\n")
    for r in rep.calibrated:
        oom = " (predicted OOM)" if not r.feasible else ""
        w(f"| {r.case.row_id} | {r.case.group} | {r.case.device_class} | "
          f"{r.case.measured_s:.3f} | {r.predicted_s:.3f} | {100 * r.error:+.1f}%{oom} | "
          f"{r.case.how} |\n")
    w("\n</details>\n")


def _id_span(ids: list[str]) -> str:
    return ", ".join(ids) if len(ids) <= 6 else f"{ids[0]} ... {ids[-1]}"


# --------------------------------------------------------------------------- main

def run_fit(rep: Report, fit_links: bool, out=sys.stdout) -> None:
    w = out.write
    names = FIT_PARAMS + (LINK_PARAMS if fit_links else ())
    w(f"fitting {', '.join(names)} per device class, minimising mean |ln(pred/meas)| over the "
      "class's rows, from the defaults of autoplan/descriptors/hardware.py\n")
    today = datetime.date.today().isoformat()
    for cls in CLASSES:
        cases = [c for c in rep.cases if c.device_class == cls.name]
        if not cases:
            w(f"{cls.name}: no rows\n")
            continue
        w(f"{cls.name}: {len(cases)} rows\n")
        start = dict(DEFAULTS)
        before = predict(cases, {cls.name: start})
        fitted = fit_class(cases, start, names, log=w)
        after = predict(cases, {cls.name: fitted})
        at_bound = [n for n in names if fitted[n] in BOUNDS[n]]
        w(f"  MAPE {mape(before):.1f}% -> {mape(after):.1f}%   "
          f"mean |ln| {log_loss(before):.4f} -> {log_loss(after):.4f}\n")
        if at_bound:
            w(f"  at a bound of its range: {', '.join(at_bound)} (the data push past what is "
              "physically plausible; the term absorbs something the model lacks)\n")
        for g, res in sorted(_groups(after).items()):
            b = _groups(before)[g]
            w(f"    {g:<44} {len(res):>4}  MAPE {mape(b):5.1f}% -> {mape(res):5.1f}%  "
              f"median {median_signed(res):+.1f}%\n")
        comment = (f"# fitted by `python benchmarks/accuracy.py --fit` on "
                   f"shared/data/calibration_runs.csv ({len(cases)} {cls.name} rows, {today}); "
                   "calibration, not validation")
        w(f"  device files {', '.join(cls.devices)}:\n")
        w(f"    {comment}\n    efficiency: {{gemm: {fitted['gemm']:.2f}, gemm_half_gflop: "
          f"{hardware.DEFAULT_GEMM_HALF_GFLOP:g}, attention: {fitted['attention']:.2f}, "
          f"hbm: {fitted['hbm']:.2f}}}\n")
        if fit_links:
            w(f"  cluster file {cls.cluster}: intra_node efficiency: {fitted['intra']:.2f}, "
              f"inter_node efficiency: {fitted['inter']:.2f}\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV,
                    help=f"calibration CSV (default: {DEFAULT_CSV})")
    ap.add_argument("--markdown", action="store_true", help="print docs/ACCURACY.md")
    ap.add_argument("--fit", action="store_true",
                    help="fit gemm and attention efficiency per device class and print them")
    ap.add_argument("--fit-links", action="store_true",
                    help="with --fit: also fit the NVLink and network bus efficiencies")
    args = ap.parse_args(argv)
    if not args.csv.is_file():
        print(f"error: calibration CSV not found: {args.csv} (pass --csv PATH)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        rep = build_report(args.csv)
    except (KeyError, csv.Error) as exc:
        print(f"error: {args.csv}: not a calibration CSV ({exc})", file=sys.stderr)
        return 2
    if not rep.cases:
        print(f"error: {args.csv}: no validation-ready row could be predicted", file=sys.stderr)
        return 2
    if args.fit or args.fit_links:
        run_fit(rep, args.fit_links)
    elif args.markdown:
        print_markdown(rep)
    else:
        print_text(rep)
    print(f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
