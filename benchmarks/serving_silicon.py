"""Serving predictions against NVIDIA's measured runs of modern engines
(../shared/data/serving_silicon.csv, shipped with AIConfigurator 0.12; its .md says what
each column means).

    python benchmarks/serving_silicon.py [--csv PATH] [--rows] [--limit N] [--engine E]
                                         [--every N] [--fixed-lengths] [--applies KINDS]

Each distinct measurement (rows that repeat one, as the .md defines them, are counted
once) becomes a serving plan: the model, the GPUs of one deployment on the row's system,
the engine at the row's version, the widths (tensor, pipeline, attention data and expert
parallel; each pool's for a disaggregated run), the weights' precision, and a closed loop
of the row's concurrency over the lengths its benchmark client drew (:func:`lengths_of`:
InferenceX's client, uniform in [int(0.8 L), L], for the rows at its three length pairs;
fixed lengths for AIConfigurator's own sweeps). TTFT and TPOT are the simulation's means,
against the measured ones. The table groups them by engine, version, GPU and mode; under it,
the file's own repeatability (:func:`repeatability`): how far measurements of one
configuration repeat, which no model of the configuration can beat on average.

The rows on H200, B300 and GB300 are reserved for validation and never read here: the
loader drops them before anything looks at them.

Rows are counted as not expressible, with the reason, where the architecture is not one
autoplan models yet (``LATER``; Qwen3.5's hybrid linear attention and GLM-5's sparse
attention are modelled since issue 51), the deployment's size was not recorded, or the row
states no concurrency.
These rows calibrate the engines' constants (benchmarks/serving_silicon_fit.py).
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from autoplan.descriptors.library import builtin_names, resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.model import Model
from autoplan.errors import AutoplanError
from autoplan.measured.door import Corrected, corrected
from autoplan.serving.deployment import (
    Arrival,
    ArrivalKind,
    Deployment,
    Dist,
    Engine,
    Lengths,
    Pool,
    Precision,
    ServingPlan,
    Slo,
    Workload,
)
from autoplan.serving.evaluate import evaluate_serving
from autoplan.serving.versions import dynamo_engine_version

CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "serving_silicon.csv"
RESERVED_SYSTEMS = frozenset({"h200_sxm", "b300_sxm", "gb300"})  # validation only: never read

# the HuggingFace id -> the built-in model of the same architecture
MODELS = {
    "deepseek-ai/DeepSeek-R1": "deepseek-r1", "nvidia/DeepSeek-R1-NVFP4": "deepseek-r1",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3", "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3",
    "Qwen/Qwen3-32B": "qwen3-32b", "nvidia/Qwen3-32B-NVFP4": "qwen3-32b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "meta-llama/Llama-3.1-70B": "llama3.1-70b", "meta-llama/Llama-3.1-8B-Instruct": "llama3.1-8b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "moonshotai/Kimi-K2.5": "kimi-k2.5", "MiniMaxAI/MiniMax-M2.5": "minimax-m2.5",
    # hybrid linear and sparse attention, modelled since the today's-models issue (51)
    "Qwen/Qwen3.5-397B-A17B": "qwen3.5-397b-a17b", "zhipuai/GLM-5": "glm-5",
}
# architectures autoplan does not model yet
LATER: dict[str, str] = {}
CLUSTERS = {"h100_sxm": "dgx-h100", "b200_sxm": "dgx-b200", "gb200": "gb200-nvl72"}
ENGINES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm"}
# the GEMMs' (for MoE models: the experts') stored format -> autoplan's precision
QUANT = {"": Precision.BF16, "bf16": Precision.BF16, "fp8": Precision.FP8, "fp8_block": Precision.FP8,
         "nvfp4": Precision.FP4, "w4a16_mxfp4": Precision.FP4, "int4_wo": Precision.INT4}


@dataclass
class Case:
    row: dict[str, str]
    plan: ServingPlan | None
    why: str  # not expressible: why
    measured: dict[str, float]  # ttft_ms, tpot_ms

    @property
    def engine(self) -> str:
        return self.row["backend"]

    @property
    def version(self) -> str:
        return release(self.row) or "unstated"

    @property
    def gpu(self) -> str:
        return self.row["system"]

    @property
    def mode(self) -> str:
        return self.row["mode"]


def load_rows(path: Path = CSV) -> list[dict[str, str]]:
    """The file's rows less the reserved systems', each distinct measurement once (the
    same system, backend, lengths, concurrency, TTFT and TPOT: one run exported again)."""
    out, seen = [], set()
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["system"] in RESERVED_SYSTEMS:
                continue
            key = (row["system"], row["backend"], row["isl"], row["osl"], concurrency(row),
                   row["silicon_ttft_ms"], row["silicon_tpot_ms"])
            if key in seen:
                continue
            seen.add(key)
            out.append(row)
    return out


def override_applies(kinds: str) -> None:
    """Make every profile's correction apply ``kinds`` (comma-separated kind names, ``all``
    or ``none``) whatever its ``applies`` line says: the experiment that chose the shipped
    profiles' line (profiles/measured/README.md)."""
    from autoplan.measured import surrogate

    chosen = (surrogate.CORRECTED_KINDS if kinds == "all" else () if kinds == "none"
              else tuple(k.strip() for k in kinds.split(",") if k.strip()))
    unknown = set(chosen) - set(surrogate.CORRECTED_KINDS)
    if unknown:
        raise SystemExit(f"--applies: unknown kinds {sorted(unknown)}; expected {surrogate.CORRECTED_KINDS}")
    surrogate.applied_kinds = lambda meta: chosen
    if not chosen:  # no kind: no correction at all (the roofline everywhere)
        global corrected
        corrected = lambda cluster, *args, **kwargs: Corrected(cluster, None)  # noqa: E731


def release(row: dict[str, str]) -> str | None:
    """The engine release a row ran: its ``backend_version``, except where the image is
    NVIDIA Dynamo's runtime container (``.../ai-dynamo/<engine>-runtime:<tag>``), whose tag
    is Dynamo's release: the engine release inside it
    (:func:`autoplan.serving.versions.dynamo_engine_version`)."""
    v = row["backend_version"].strip()
    if not v:
        return None
    if "ai-dynamo/" in row["silicon_data_source"] and v.startswith("nightly") is False:
        return dynamo_engine_version(row["backend"], v) or v
    return v


def concurrency(row: dict[str, str]) -> int | None:
    m = re.search(r"silicon_concurrency=(\d+)", row["silicon_data_source"])
    return int(m.group(1)) if m else None


def _int(text: str, default: int = 1) -> int:
    try:
        v = float(text)
    except ValueError:
        return default
    return int(v) if math.isfinite(v) and v >= 1 else default


def _precision(row: dict[str, str], moe: bool) -> Precision:
    text = row["moe_quant_mode"] if moe and row["moe_quant_mode"] else row["gemm_quant_mode"]
    return QUANT.get(text, Precision.BF16)


def _widths(row: dict[str, str], prefix: str) -> dict[str, int]:
    p = prefix
    return {"tp": _int(row[f"{p}tp_size"]), "pp": _int(row[f"{p}pp_size"]),
            "attention_dp": _int(row[f"{p}attention_dp_size"]),
            "moe_tp": _int(row[f"{p}moe_tp_size"]), "ep": _int(row[f"{p}moe_ep_size"])}


def instance(w: dict[str, int], moe: bool, heads: int) -> dict[str, int]:
    """One instance's widths as the rows mean them (serving_silicon.md, "Read before use").

    - A dense model has no attention data parallel or experts: those columns mean nothing.
    - Rows that fold expert parallelism into the widths (the id's ``tp8_ep8`` given as
      ``tp_size`` or ``attention_dp_size`` 64 with ``moe_tp`` x ``moe_ep`` = 64, moe_tp =
      moe_ep): the instance is the experts' ``moe_ep`` GPUs, the wide column divided by
      ``moe_tp``.
    - MoE rows whose ``tp_size`` does not divide the attention heads (GB200's tp 12-72 with
      ``moe_tp`` the same): attention cannot be split so; the engines run such a width with
      attention data parallel (TensorRT-LLM's ``enable_attention_dp``, SGLang's
      ``--enable-dp-attention``) and the experts over every GPU: attention_dp = that width,
      ep = that width."""
    w = dict(w)
    if not moe:
        w["attention_dp"], w["ep"], w["moe_tp"] = 1, 1, 1
        return w
    wide = w["tp"] * w["attention_dp"]
    if w["moe_tp"] == w["ep"] > 1 and wide == w["moe_tp"] * w["ep"]:
        if w["tp"] > 1:
            w["tp"] //= w["moe_tp"]
        else:
            w["attention_dp"] //= w["moe_tp"]
        w["moe_tp"] = 1
        return w
    if w["tp"] > 1 and heads % w["tp"]:
        w["attention_dp"], w["ep"], w["tp"], w["moe_tp"] = w["tp"] * w["attention_dp"], wide, 1, 1
    return w


def case_of(row: dict[str, str]) -> Case:
    assert row["system"] not in RESERVED_SYSTEMS
    measured = {"ttft_ms": float(row["silicon_ttft_ms"]), "tpot_ms": float(row["silicon_tpot_ms"])}
    path = row["model_path"]
    if path in LATER:
        return Case(row, None, f"{LATER[path]}: not modelled yet", measured)
    name = MODELS.get(path)
    if name is None or name not in builtin_names("model"):
        return Case(row, None, f"model {path} not built in", measured)
    c = concurrency(row)
    if c is None:
        return Case(row, None, "no concurrency stated", measured)
    isl, osl = _int(row["isl"]), _int(row["osl"])
    try:
        model = resolve_model(name)
    except AutoplanError as exc:
        return Case(row, None, str(exc), measured)
    weights = _precision(row, model.is_moe)
    # the KV cache's precision is not stated: the engines' default ("auto": the model's
    # 16 bits) for vLLM and SGLang; TensorRT-LLM's quantized checkpoints (ModelOpt) carry
    # an fp8 KV cache with fp8/fp4 weights
    kv = Precision.FP8 if row["backend"] == "trtllm" and weights in (Precision.FP8, Precision.FP4) \
        else Precision.BF16
    workload = Workload(*lengths_of(row, isl, osl), Arrival(ArrivalKind.CONCURRENCY, concurrency=c),
                        requests=requests_for(row, c))
    if row["mode"] == "disagg":
        if not row["decode_num_workers"] or not row["prefill_num_workers"]:
            return Case(row, None, "disaggregated: the pools' worker counts not recorded", measured)
        pools = []
        for side in ("prefill", "decode"):
            w = instance(_widths(row, f"{side}_"), model.is_moe, model.heads)
            pools.append(Pool(_int(row[f"{side}_num_workers"]), w["tp"], w["pp"], w["attention_dp"], w["ep"]))
        pre, dec = pools
        dep = Deployment.split(pre, dec, weights=weights, kv_cache=kv,
                               max_num_seqs=max(1, math.ceil(c / (dec.replicas * dec.attention_dp))))
        return _case(row, model, dep, workload, measured)
    w = instance(_widths(row, ""), model.is_moe, model.heads)
    # batch_size x attention_dp is one instance's load; where the concurrency is a whole
    # multiple of it, the deployment ran that many instances
    per_instance = _int(row["batch_size"], 0) * w["attention_dp"]
    replicas = c // per_instance if per_instance and c % per_instance == 0 else 1
    dep = Deployment(replicas=replicas, tp=w["tp"], pp=w["pp"], ep=w["ep"], attention_dp=w["attention_dp"],
                     weights=weights, kv_cache=kv,
                     max_num_seqs=max(1, math.ceil(c / (replicas * w["attention_dp"]))))
    return _case(row, model, dep, workload, measured)


def _case(row: dict[str, str], model: Model, dep: Deployment, workload: Workload,
          measured: dict[str, float]) -> Case:
    engine, version = Engine(ENGINES[row["backend"]]), release(row)
    try:
        # as `autoplan serve` sees it: through the one door of measured profiles
        cluster = resolve_cluster(CLUSTERS[row["system"]])
        per_node = cluster.gpus_per_node
        cluster = corrected(with_gpus(cluster, -(-dep.gpus // per_node) * per_node), engine=engine,
                            version=version).cluster
    except AutoplanError as exc:
        return Case(row, None, str(exc), measured)
    plan = ServingPlan(model, cluster, engine, dep, workload, Slo(), engine_version=version)
    return Case(row, plan, "", measured)


# InferenceX's benchmark client (SemiAnalysisAI/InferenceX, formerly InferenceMAX; its README's
# "Benchmark Client Configuration"): the three (ISL, OSL) pairs it sweeps, and its
# ``--random-range-ratio 0.8``
INFERENCEX_LENGTHS = frozenset({(1024, 1024), (1024, 8192), (8192, 1024)})
RANGE_RATIO = 0.8
PROTOCOL = True  # --fixed-lengths: every row as fixed lengths (the experiment)


def inferencex(row: dict[str, str]) -> bool:
    """Whether a row was measured with InferenceX's client: its lengths are one of the
    three pairs that client sweeps. The file does not say how lengths were drawn
    (serving_silicon.md, "Read before use"); its rows come in two families: the recipe
    sweeps (``source_file=2026-*.csv``, ``db-dump``, the ``*-gap-analysis.csv`` files),
    every one at those three pairs, and AIConfigurator's own sweeps (``aic-auto-gap-analysis``)
    at other lengths (1024-4096 in, 128-512 out), whose generated scripts fix the lengths
    (15 of its 706 rows sit at those pairs too, and are taken as InferenceX's: the rule reads
    the lengths, never a row's source)."""
    return (_int(row["isl"]), _int(row["osl"])) in INFERENCEX_LENGTHS


def lengths_of(row: dict[str, str], isl: int, osl: int) -> tuple[Lengths, Lengths]:
    """The lengths a row's client drew: InferenceX's benchmark_serving.py samples each
    request's input and output lengths as integers uniform in
    ``[int(L x range_ratio), L]`` (``sample_random_requests``: ``np.random.randint(int(L *
    range_ratio), L + 1)``); AIConfigurator's scripts send fixed lengths."""
    if not (PROTOCOL and inferencex(row)):
        return Lengths(isl), Lengths(osl)

    def drawn(n: int) -> Lengths:
        low = int(n * RANGE_RATIO)
        return Lengths((low + n) / 2, Dist.UNIFORM, low=low, high=n)

    return drawn(isl), drawn(osl)


def requests_for(row: dict[str, str], c: int) -> int:
    """Requests a closed loop of ``c`` runs: AIConfigurator's generated benchmark scripts
    run ``--num-requests 20C`` after a warm-up; InferenceX's client ``--num-prompts 10C``
    (:func:`inferencex`). The simulation measures the burst of the first ``c`` in that
    proportion (serving.simulate)."""
    return max(64, (10 if inferencex(row) and PROTOCOL else 20) * c)


def predicted(plan: ServingPlan) -> tuple[dict[str, float] | None, str]:
    pred = evaluate_serving(plan)
    if not pred.fits or not pred.simulated_requests:
        return None, "does not fit the GPUs in autoplan's memory model"
    return {"ttft_ms": pred.ttft_ms.mean, "tpot_ms": pred.tpot_ms.mean}, ""


def version_line(engine: str, version: str) -> str:
    """The release line a version belongs to (major.minor; nightlies their own)."""
    if not version or version == "unstated":
        return "unstated"
    if version.startswith("nightly"):
        return "nightly"
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--rows", action="store_true", help="print every row's prediction")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--engine", default="")
    parser.add_argument("--every", type=int, default=1, help="every N-th distinct measurement")
    parser.add_argument("--fixed-lengths", action="store_true",
                        help="every row as fixed lengths and 20C requests, InferenceX's rows too "
                             "(the experiment that shows what the client's protocol is worth)")
    parser.add_argument("--applies", default="",
                        help="the kinds the engine profiles apply, comma-separated, 'all' or 'none' "
                             "(an experiment; default: their 'applies' header line)")
    args = parser.parse_args()
    if args.fixed_lengths:
        global PROTOCOL
        PROTOCOL = False
    if args.applies:
        override_applies(args.applies)
    rows = [r for r in load_rows(args.csv) if r["backend"].startswith(args.engine)][::args.every]
    if args.limit:
        rows = rows[:args.limit]
    report(rows, args.rows)


def report(rows: list[dict[str, str]], show_rows: bool = False) -> None:
    """The table of TTFT and TPOT errors per engine, release line, GPU and mode, with the
    engines' shipped constants (held-out errors: serving_silicon_fit.py)."""
    t0 = time.perf_counter()
    Key = tuple[str, str, str, str]
    errors: dict[Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    signed: dict[Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    counts: Counter[Key] = Counter()
    expressed: Counter[Key] = Counter()
    skipped: Counter[str] = Counter()
    for row in rows:
        case = case_of(row)
        key = (case.engine, version_line(case.engine, case.version), case.gpu, case.mode)
        counts[key] += 1
        if case.plan is None:
            skipped[case.why] += 1
            continue
        try:
            got, why = predicted(case.plan)
        except AutoplanError as exc:
            got, why = None, str(exc).splitlines()[0][:80]
        if got is None:
            skipped[why] += 1
            continue
        expressed[key] += 1
        for k in (key, (case.engine, "", "", ""), ("all", "", "", "")):
            for metric, value in case.measured.items():
                errors[k][metric].append(abs(got[metric] - value) / value)
                signed[k][metric].append((got[metric] - value) / value)
        if show_rows:
            shown = ", ".join(f"{m} {got[m]:.1f}/{v:.1f}" for m, v in case.measured.items())
            print(f"{row['id'][:60]:<60} {case.plan.deployment.label():<20} {shown}")

    def cell(k: Key, metric: str) -> str:
        e, s = errors.get(k, {}).get(metric, []), signed.get(k, {}).get(metric, [])
        if not e:
            return f"{'-':>20}"
        return f"{100 * sum(e) / len(e):>6.1f}% {100 * sum(s) / len(s):>+6.0f}% ({len(e):>3})"

    print(f"{'engine':<7} {'version':<9} {'GPU':<9} {'mode':<6} {'rows':>5} {'expr.':>5} "
          f"{'TTFT MAPE  bias (n)':>20} {'TPOT MAPE  bias (n)':>20}")
    for key in sorted(counts):
        print(f"{key[0]:<7} {key[1]:<9} {key[2]:<9} {key[3]:<6} {counts[key]:>5} {expressed[key]:>5} "
              f"{cell(key, 'ttft_ms')} {cell(key, 'tpot_ms')}")
    for eng in sorted({k[0] for k in counts}):
        k = (eng, "", "", "")
        print(f"{eng + ' (all)':<34} {sum(expressed[x] for x in counts if x[0] == eng):>5} "
              f"{cell(k, 'ttft_ms')} {cell(k, 'tpot_ms')}")
    k = ("all", "", "", "")
    total, done = sum(counts.values()), sum(expressed.values())
    print(f"{'all':<34} {done:>5} {cell(k, 'ttft_ms')} {cell(k, 'tpot_ms')}")
    print(f"expressible: {done} of {total} distinct measurements ({100 * done / max(1, total):.0f}%); "
          f"{time.perf_counter() - t0:.0f} s")
    for why, n in skipped.most_common():
        print(f"  not expressed {n:>4}: {why}")
    print("the file's own repeatability (no predictor can be closer on average): each measurement "
          "of a configuration measured more than once against the median of its other measurements")
    for eng, (n, ttft, tpot) in sorted(repeatability(rows).items()):
        print(f"  {eng:<7} {n:>4} measurements: TTFT {100 * ttft:5.1f}%  TPOT {100 * tpot:5.1f}% MAPE")
    sys.stdout.flush()


# what makes two rows one configuration: the system, the engine and its release, the model, the
# precision, every width and worker count, the lengths (and the concurrency)
CONFIGURATION = ("system", "backend", "backend_version", "model_path", "mode", "gemm_quant_mode",
                 "moe_quant_mode", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size",
                 "prefill_tp_size", "prefill_pp_size", "prefill_attention_dp_size", "prefill_moe_ep_size",
                 "prefill_num_workers", "decode_tp_size", "decode_pp_size", "decode_attention_dp_size",
                 "decode_moe_ep_size", "decode_num_workers", "isl", "osl")


def repeatability(rows: list[dict[str, str]]) -> dict[str, tuple[int, float, float]]:
    """Per engine: (measurements, TTFT MAPE, TPOT MAPE) of the file against itself. Where one
    configuration at one concurrency was measured more than once with different results,
    each measurement is "predicted" by the median of the others: the error no model of the
    configuration can beat on average, since it gives every such measurement one answer."""
    groups: dict[tuple[str, ...], list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        c = concurrency(row)
        if c is not None:
            key = tuple(row.get(k, "") for k in CONFIGURATION) + (str(c),)
            groups[key].append((float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"])))
    errors: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for key, found in groups.items():
        if len(found) < 2:
            continue
        for i, (ttft, tpot) in enumerate(found):
            others = found[:i] + found[i + 1:]
            mt = statistics.median(o[0] for o in others)
            mp = statistics.median(o[1] for o in others)
            errors[key[1]].append((abs(mt - ttft) / ttft, abs(mp - tpot) / tpot))
    return {eng: (len(e), sum(x[0] for x in e) / len(e), sum(x[1] for x in e) / len(e))
            for eng, e in errors.items()}


if __name__ == "__main__":
    main()
