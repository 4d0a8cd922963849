"""Serving predictions against published measured runs (../shared/data/serving_calibration.csv).

    python benchmarks/serving_accuracy.py [--csv PATH] [--source PREFIX] [--limit N] [--rows]

Each row is turned into a serving plan (model, GPUs, engine, TP/PP/replicas, precision, the
scenario's arrival and batch limits) and simulated; the table gives, per source, engine and
device, how many rows autoplan can express and the mean absolute percentage error of the
output throughput, the time to first token and the time per output token against what was
measured. Scenarios:

- offline (TensorRT-LLM perf overview v0.17: every request queued at once; the engine's
  batch limits are trtllm-bench's, not published: the engine defaults stand in);
- static batch (Splitwise's characterization, TensorRT-LLM v0.5/v0.6 tables): B identical
  requests prefilled in one iteration, then decoded together; TTFT = the prefill,
  TPOT = a decode iteration;
- single request first-token latency (TensorRT-LLM v0.5): batch 1, one output token.

Rows are counted as not expressible, with the reason, where the model is not built in or a
length is missing. These rows calibrate; the issue's withheld sources validate.

Then the same for NVIDIA's measured closed loops of vLLM, SGLang and TensorRT-LLM
(``serving_silicon.py``: per engine, release line, GPU and mode; ``--no-silicon`` leaves it
out); their leave-one-GPU-out and leave-one-version-out errors are
``serving_silicon_fit.py``'s.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from autoplan.descriptors.library import builtin_names, resolve_cluster, resolve_model, with_gpus
from autoplan.errors import AutoplanError
from autoplan.measured.door import corrected
from autoplan.serving.deployment import (
    Arrival,
    ArrivalKind,
    Deployment,
    Engine,
    Lengths,
    Precision,
    ServingPlan,
    Slo,
    Workload,
)
from autoplan.serving.evaluate import evaluate_serving

CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "serving_calibration.csv"

# the published name -> the built-in model of the same architecture
MODELS = {
    "Llama-3.1-8B": "llama3-8b", "Llama-3.1-70B": "llama3-70b", "Llama-3.1-70B-Instruct": "llama3-70b",
    "Llama-3.1-405B": "llama3-405b", "Llama-3.1-405B (FP8)": "llama3-405b",
    "Hermes-3-Llama-3.1-405B": "llama3-405b", "Llama-2-7B": "llama2-7b", "Llama-2-70B": "llama2-70b",
    "Mixtral-8x7B": "mixtral-8x7b", "Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
    "Mixtral-8x22B": "mixtral-8x22b", "Mixtral-8x22B-Instruct-v0.1": "mixtral-8x22b",
    "Mistral-Large-Instruct-2407 (123B)": "mistral-large-2407", "Mistral-7B": "mistral-7b",
}
# the published GPU -> the built-in cluster whose device it is
CLUSTERS = (("GH200", "gh200-node"), ("H200", "dgx-h200"), ("H100", "dgx-h100"), ("A100", "dgx-a100"),
            ("L40S", "l40s-node"))


@dataclass
class Case:
    row: dict[str, str]
    plan: ServingPlan | None
    why: str  # not expressible: why
    metrics: dict[str, float]  # measured: throughput (output tok/s), ttft_ms, tpot_ms


def _num(text: str) -> float | None:
    try:
        v = float(text.split()[0])
    except (ValueError, IndexError):
        return None
    return v if math.isfinite(v) else None


def _precision(text: str) -> Precision:
    t = text.lower()
    if t.startswith("fp8"):
        return Precision.FP8
    if t.startswith("bf16"):
        return Precision.BF16
    return Precision.FP16  # fp16, and Splitwise's unstated dtype (fp16 the likely reading)


def _engine(text: str) -> Engine:
    t = text.lower()
    return Engine.TRTLLM if "tensorrt" in t else Engine.SGLANG if "sglang" in t else Engine.VLLM


STAND_IN_RELEASE = "0.5.0"  # the vLLM line an unstated engine is simulated with (Splitwise, 2023)


def _release(row: dict[str, str]) -> str | None:
    """The engine release a row names ("v0.5.4 (docker ...)" -> "0.5.4"). Splitwise's rows
    state no engine; vLLM's scheduler stands in for the 2023 engine it profiled, at the V0
    line of that era (its prior constants: no fit on NVIDIA's 2025-26 runs reaches them)."""
    words = row["engine_version"].split()
    if words:
        return words[0].removeprefix("v")
    return STAND_IN_RELEASE if _engine(row["engine"]) is Engine.VLLM else None


def case_of(row: dict[str, str]) -> Case:
    measured = {k: v for k, v in (("throughput", _num(row["output_tok_s"])),
                                  ("ttft_ms", _num(row["ttft_mean_ms"]) or _num(row["ttft_p50_ms"])),
                                  ("tpot_ms", _num(row["tpot_mean_ms"]) or _num(row["tpot_p50_ms"])))
                if v is not None}
    name = MODELS.get(row["model"])
    if name is None or name not in builtin_names("model"):
        return Case(row, None, f"model {row['model']} not built in", measured)
    cluster = next((c for key, c in CLUSTERS if key in row["gpu_type"]), None)
    if cluster is None or cluster not in builtin_names("cluster"):
        return Case(row, None, f"GPU {row['gpu_type']} not built in", measured)
    inp, out = _num(row["input_len"]), _num(row["output_len"])
    if inp is None or out is None:
        return Case(row, None, "input or output length not published", measured)
    if not measured:
        return Case(row, None, "nothing measured that autoplan predicts", measured)
    tp, pp = int(_num(row["tp"]) or 1), int(_num(row["pp"]) or 1)
    replicas = int(_num(row["dp_replicas"]) or 1)
    gpus = int(_num(row["num_gpus"]) or tp * pp * replicas)
    w, kv = _precision(row["weight_precision"]), _precision(row["kv_precision"] or row["weight_precision"])
    scenario = row["scenario"].lower()
    try:
        model = resolve_model(name)
        # as `autoplan serve` sees it: through the one door of measured profiles, with the
        # engine whose kernels they time
        c = corrected(with_gpus(resolve_cluster(cluster), gpus), engine=_engine(row["engine"]),
                      version=_release(row)).cluster
    except AutoplanError as exc:
        return Case(row, None, str(exc), measured)
    if "static batch" in scenario or "single request" in scenario:
        b = int(_num(row["max_batch_or_concurrency"]) or 1)
        dep = Deployment(replicas=replicas, tp=tp, pp=pp, weights=w, kv_cache=kv, max_num_seqs=b,
                         max_batched_tokens=int(b * inp), chunked_prefill=False)
        workload = Workload(Lengths(inp), Lengths(out), Arrival(ArrivalKind.OFFLINE), b * replicas)
    elif "offline" in scenario or "at once" in scenario:
        n = int(_num(row["num_requests"]) or 1000)
        dep = Deployment(replicas=replicas, tp=tp, pp=pp, weights=w, kv_cache=kv)
        workload = Workload(Lengths(inp), Lengths(out), Arrival(ArrivalKind.OFFLINE), n)
    else:
        return Case(row, None, f"scenario not modelled: {row['scenario'][:40]}", measured)
    plan = ServingPlan(model, c, _engine(row["engine"]), dep, workload, Slo(), engine_version=_release(row))
    return Case(row, plan, "", measured)


def predicted(plan: ServingPlan) -> tuple[dict[str, float] | None, str]:
    """The prediction, or None and why it cannot stand for the row."""
    pred = evaluate_serving(plan)
    if not pred.fits or not pred.simulated_requests:
        return None, "does not fit the GPUs in autoplan's memory model"
    d = plan.deployment
    if d.chunked_prefill is False and d.max_num_seqs and pred.max_concurrency < d.max_num_seqs:
        # a static batch ran together; where autoplan's KV cache cannot hold it, its
        # requests would queue, and the times would not be the batch's
        return None, "static batch larger than the KV cache autoplan's memory model leaves"
    return {"throughput": pred.output_tokens_per_s, "ttft_ms": pred.ttft_ms.mean,
            "tpot_ms": pred.tpot_ms.mean}, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--source", default="", help="only rows whose row_id starts with this")
    parser.add_argument("--limit", type=int, default=0, help="at most this many rows (0: all)")
    parser.add_argument("--rows", action="store_true", help="print every row's prediction")
    parser.add_argument("--no-silicon", action="store_true",
                        help="leave out the table of NVIDIA's measured runs (serving_silicon.py)")
    args = parser.parse_args()
    with args.csv.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["row_id"].startswith(args.source)]
    if args.limit:
        rows = rows[:args.limit]
    t0 = time.perf_counter()
    Key = tuple[str, str, str, str]  # source, engine, GPU, complete
    errors: dict[Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    counts: Counter[Key] = Counter()
    expressed: Counter[Key] = Counter()
    skipped: Counter[str] = Counter()
    for row in rows:
        case = case_of(row)
        key = (row["row_id"].split("-")[0], _engine(row["engine"]).value, row["gpu_type"].split()[0],
               row["complete"])
        counts[key] += 1
        if case.plan is None:
            skipped[case.why] += 1
            continue
        got, why = predicted(case.plan)
        if got is None:
            skipped[why] += 1
            continue
        expressed[key] += 1
        for metric, value in case.metrics.items():
            err = abs(got[metric] - value) / value
            errors[key][metric].append(err)
            errors[("all", "", "", "")][metric].append(err)
            if row["complete"] == "yes":
                errors[("all", "", "", "yes")][metric].append(err)
        if args.rows:
            shown = ", ".join(f"{m} {got[m]:.1f}/{v:.1f}" for m, v in case.metrics.items())
            print(f"{row['row_id']:<16} {case.plan.deployment.label():<12} {shown}  (predicted/measured)")
    print(f"{'source':<10} {'engine':<7} {'GPU':<16} {'compl.':<6} {'rows':>5} {'expr.':>5} "
          f"{'thr. MAPE':>14} {'TTFT MAPE':>14} {'TPOT MAPE':>14}")

    def cell(errs: list[float]) -> str:
        return f"{100 * sum(errs) / len(errs):>7.1f}% ({len(errs):>3})" if errs else f"{'-':>14}"

    for key in sorted(counts):
        e = errors.get(key, {})
        print(f"{key[0]:<10} {key[1]:<7} {key[2][:16]:<16} {key[3]:<6} {counts[key]:>5} "
              f"{expressed[key]:>5} {cell(e.get('throughput', []))} {cell(e.get('ttft_ms', []))} "
              f"{cell(e.get('tpot_ms', []))}")
    total, done = sum(counts.values()), sum(expressed.values())
    for label, k in (("all rows", ("all", "", "", "")), ("complete rows", ("all", "", "", "yes"))):
        e = errors[k]
        print(f"{label:<48} {cell(e.get('throughput', []))} {cell(e.get('ttft_ms', []))} "
              f"{cell(e.get('tpot_ms', []))}")
    print(f"expressible: {done} of {total} rows ({100 * done / max(1, total):.0f}%); "
          f"{time.perf_counter() - t0:.0f} s")
    for why, n in skipped.most_common():
        print(f"  not expressed {n:>4}: {why}")
    sys.stdout.flush()
    if not (args.no_silicon or args.source or args.limit or args.csv != CSV):  # the whole default file
        import serving_silicon

        print()
        print("NVIDIA's measured runs of modern engines (serving_silicon.csv; held out: "
              "serving_silicon_fit.py):")
        serving_silicon.report(serving_silicon.load_rows(), args.rows)


if __name__ == "__main__":
    main()
