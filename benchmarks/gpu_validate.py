"""Per-rank slices of real plans run on one GPU, against autoplan's predictions.

    python benchmarks/gpu_validate.py run [--cases SET] --out DIR   # on a machine with one CUDA GPU
    python benchmarks/gpu_validate.py table [DIR | --cases SET]     # anywhere: the table from saved runs

``run`` calls ``autoplan validate PLAN --device cuda`` (one rank's slice: one pipeline stage
at TP-sharded widths, its microbatches, its ZeRO optimizer shard, no communication) for each
case of a set below (``h200``, the default, or ``h100``: plans on that GPU's built-in cluster,
to be run on that GPU) and saves the JSON it prints as DIR/CASE.json.

``table`` reads those JSONs and predicts each slice again with this checkout's cost model, for
exactly what ran (the layers and microbatches validate kept to fit the machine and the time
budget, read back from the JSON): the compute time on the plan's built-in cluster (analytic),
the same corrected by the shipped profile of the cluster's device (``profiles/measured/``,
what search and evaluate use), and the peak memory. The measured values are the run's. A
change to the cost model shows here as a new error against the same measurements.

``table DIR`` takes the case set whose cases the saved runs are named after. Without DIR:
the newest folder under benchmarks/gpu/ named after the set (``h200-*`` unless ``--cases``
names another) that holds saved runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from autoplan import caches
from autoplan.bench.validate import Options, as_torch_runs, predicted_time
from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.strict import read_yaml
from autoplan.errors import AutoplanError
from autoplan.measured.shipped import shipped_profile
from autoplan.measured.surrogate import calibrate
from autoplan.plans.file import read_plan
from autoplan.units import GiB

HERE = Path(__file__).resolve().parent / "gpu"
PLANS = HERE / "plans"

# case name -> (plan file under benchmarks/gpu/plans, extra validate arguments)
Cases = dict[str, tuple[str, tuple[str, ...]]]
CASES: Cases = {
    "llama3-8b-8xh200": ("llama3-8b-8xh200.yaml", ()),
    "llama3-8b-8xh200-tp2-full": ("llama3-8b-8xh200-tp2-full.yaml", ()),
    "llama3-70b-64xh200": ("llama3-70b-64xh200.yaml", ()),
    "llama3-70b-64xh200-pp4": ("llama3-70b-64xh200-pp4.yaml", ()),
    "llama3-70b-64xh200-pp4-stage3": ("llama3-70b-64xh200-pp4.yaml", ("--stage", "3")),
    "llama3-70b-64xh200-pp4-vpp2": ("llama3-70b-64xh200-pp4-vpp2.yaml", ()),
}
# On dgx-h100: search's best on 8 GPUs; 8B tp2 full recompute and 70B pp4 (stage 0) as on the
# H200; search's best that validate runs (no cp) with --min-headroom 8.5 on 64 GPUs (pp2 vpp2)
# and on 32 GPUs (pp4, its last stage: its first is over validate's memory budget, 90% of the
# 79.2 GiB torch reports for an 80 GB H100); 70B tp8 with selective recompute by hand.
H100_CASES: Cases = {
    "llama3-8b-8xh100": ("llama3-8b-8xh100.yaml", ()),
    "llama3-8b-8xh100-tp2-full": ("llama3-8b-8xh100-tp2-full.yaml", ()),
    "llama3-70b-64xh100-pp4": ("llama3-70b-64xh100-pp4.yaml", ()),
    "llama3-70b-32xh100-pp4-stage3": ("llama3-70b-32xh100-pp4.yaml", ("--stage", "3")),
    "llama3-70b-64xh100-pp2-vpp2": ("llama3-70b-64xh100-pp2-vpp2.yaml", ()),
    "llama3-70b-64xh100-tp8-selective": ("llama3-70b-64xh100-tp8-selective.yaml", ()),
}
CASE_SETS: dict[str, Cases] = {"h200": CASES, "h100": H100_CASES}
DEFAULT_SET = "h200"
# each slice's step is kept under 5 s (fewer microbatches, then fewer layers) so that the
# whole set runs in about three minutes of GPU time
VALIDATE_ARGS = ("--device", "cuda", "--steps", "3", "--warmup", "1", "--max-step-s", "5",
                 "--timeout", "120", "--format", "json")


def run(out: Path, cases: Cases = CASES) -> int:
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, (plan, extra) in cases.items():
        cmd = [sys.executable, "-m", "autoplan.cli.main", "validate", _shown(PLANS / plan), *extra,
               *VALIDATE_ARGS]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode not in (0, 1):  # 1: ran, outside tolerance (still a measurement)
            print(f"{name}: exit {done.returncode}\n{done.stderr}", file=sys.stderr)
            failed += 1
            continue
        (out / f"{name}.json").write_text(done.stdout)
        print(f"{name}: exit {done.returncode}", file=sys.stderr)
    return 1 if failed else 0


def _shown(path: Path) -> str:
    """The path relative to the working directory where it lies under it (the JSON's ``plan``)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    stage: int
    layers: int
    microbatches: int
    measured_s: float
    analytic_s: float
    corrected_s: float | None  # None: no profile shipped for the device
    measured_gib: float
    predicted_gib: float


def predict(name: str, saved: dict, cases: Cases = CASES) -> Row:
    """The slice that ran, predicted again on this checkout."""
    ran = saved["ran"]
    plan_file = PLANS / cases[name][0]
    doc = dict(read_yaml(plan_file))
    doc["model"] = ran["model"]  # the layers validate kept
    doc["job"] = {**doc["job"], "global_batch": ran["global_batch"]}  # the microbatches it kept
    plan = as_torch_runs(read_plan(doc, str(plan_file)))  # what validate predicts
    opts = Options(device="cuda", slice=True)
    stage = int(ran["stage"])
    pred = evaluate(plan)
    analytic = predicted_time(plan, pred, opts, stage)
    profile = shipped_profile(plan.cluster.device.name)
    corrected = None
    if profile is not None:
        cal = dataclasses.replace(plan, cluster=calibrate(plan.cluster, profile))
        corrected = predicted_time(cal, evaluate(cal), opts, stage)
    reserve = plan.cluster.device.reserve_bytes  # validate compares tensors, not the reserve
    return Row(name=name, stage=stage, layers=ran["model"]["layers"], microbatches=ran["microbatches"],
               measured_s=saved["measured"]["step_time_s"], analytic_s=analytic, corrected_s=corrected,
               measured_gib=saved["measured"]["peak_memory_gib"],
               predicted_gib=(pred.memory_per_stage[stage].peak - reserve) / GiB)


def _err(pred: float, measured: float) -> float:
    return pred / measured - 1


def _case_set(stems: list[str], named: str | None) -> str:
    """The set named, else the one whose cases the saved runs are named after (h200 if none)."""
    if named is not None:
        return named
    for key, cases in CASE_SETS.items():
        if stems and all(s in cases for s in stems):
            return key
    return DEFAULT_SET


def table(folder: Path, case_set: str | None = None) -> int:
    files = sorted(folder.glob("*.json"))
    key = _case_set([f.stem for f in files], case_set)
    cases = CASE_SETS[key]
    unknown = [f.stem for f in files if f.stem not in cases]
    if not files or unknown:
        print(f"{folder}: expected saved runs named after the {key} cases ({', '.join(cases)}); "
              f"{'found none' if not files else 'unknown: ' + ', '.join(unknown)}", file=sys.stderr)
        return 2
    rows = [predict(f.stem, json.loads(f.read_text()), cases) for f in files]
    print(f"saved runs: {folder}")
    print("| case | stage | layers | micro | measured s | analytic s | err | with profile s | err "
          "| measured GiB | predicted GiB | err |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        corr = ("-", "-") if r.corrected_s is None else (f"{r.corrected_s:.3f}",
                                                         f"{_err(r.corrected_s, r.measured_s):+.1%}")
        print(f"| {r.name} | {r.stage} | {r.layers} | {r.microbatches} | {r.measured_s:.3f} "
              f"| {r.analytic_s:.3f} | {_err(r.analytic_s, r.measured_s):+.1%} | {corr[0]} | {corr[1]} "
              f"| {r.measured_gib:.1f} | {r.predicted_gib:.1f} "
              f"| {_err(r.predicted_gib, r.measured_gib):+.1%} |")
    mape = [abs(_err(r.analytic_s, r.measured_s)) for r in rows]
    print()
    print(f"compute time MAPE: analytic {sum(mape) / len(mape):.1%}", end="")
    corrected = [abs(_err(r.corrected_s, r.measured_s)) for r in rows if r.corrected_s is not None]
    if corrected:
        print(f", with the shipped profile {sum(corrected) / len(corrected):.1%} "
              f"({len(corrected)} of {len(rows)} cases)", end="")
    mem = [abs(_err(r.predicted_gib, r.measured_gib)) for r in rows]
    print(f"; peak memory MAPE {sum(mem) / len(mem):.1%}")
    return 0


def _latest(case_set: str) -> Path:
    """The newest folder of saved runs of the set: named SET-DATE, the latest date."""
    saved = sorted(p for p in HERE.iterdir()
                   if p.is_dir() and p.name.startswith(f"{case_set}-") and any(p.glob("*.json")))
    return saved[-1] if saved else HERE


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="validate each case of a set on this machine's GPU")
    r.add_argument("--out", type=Path, required=True, help="folder for the JSONs")
    r.add_argument("--cases", choices=sorted(CASE_SETS), default=DEFAULT_SET,
                   help=f"the case set (plans on that GPU's cluster; default {DEFAULT_SET})")
    t = sub.add_parser("table", help="the table from saved runs")
    t.add_argument("folder", type=Path, nargs="?", default=None)
    t.add_argument("--cases", choices=sorted(CASE_SETS), default=None,
                   help="the case set (default: the one the saved runs are named after; "
                        f"without FOLDER, {DEFAULT_SET})")
    args = parser.parse_args()
    try:
        if args.command == "run":
            return run(args.out, CASE_SETS[args.cases])
        folder = args.folder or _latest(args.cases or DEFAULT_SET)
        return table(folder, args.cases)
    except AutoplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    with caches.scope():  # one cost scope for the run (autoplan.caches)
        sys.exit(main())
