"""Fit each serving engine's host constants on ../shared/data/serving_calibration.csv, with
leave-one-source-out cross-validation.

    python benchmarks/serving_fit.py [--csv PATH] [--markdown]

The constants, in ``autoplan/serving/engines/<engine>.py``'s ``FITTED`` (per release line:
these are the default line's, which plans naming no release are predicted with): ``host_step_s``, the engine's
host time per iteration (scheduler, input preparation); ``host_seq_s``, its host time per
sequence an iteration samples (sampling, detokenizing, output processing); and
``kernel_scale``, its kernels' time (GEMMs, experts, attention, KV reads, logits) over the
roofline's at the devices' rates, as training's stack efficiency is fitted per stack. The
rates themselves (GEMM, HBM, links) come from the devices' kernel benchmarks, not from
here.

The rows the file can score are offline runs and static batches (``serving_accuracy.py``
turns each into a plan): every request is queued at once, so the scheduler's choices do not
depend on the clock and each measured time (a token's share of the run, a TTFT, a TPOT) is
exactly linear in the three constants:
``t = base + a host_step_s + b host_seq_s + c (kernel_scale - 1)``. Each row is simulated
four times (no host time at scale 1; 1 ms per iteration; 10 us per sequence; scale 2) to
read base, a, b and c; the fit then minimizes the squared relative error over the rows (each source weighing
the same),
host constants >= 0, and the final table re-simulates every row at the fitted constants
(no linear shortcut in what is reported).

Sources are the rows' ``row_id`` prefixes. Rows are grouped by the engine that ran them;
Splitwise's characterization does not state its engine (it is simulated with vLLM's
scheduler) and is its own group, whose constants no engine takes. **Held out**: each
source's rows predicted with constants fitted on the engine's other sources only (a group
with one source has none). **Files**: with the constants fitted on all of the engine's
rows, which are what the engines' files commit.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving_accuracy import CSV, case_of, predicted  # noqa: E402

from autoplan.serving.engine import Engine, Fitted, fitted_as  # noqa: E402

STEP, SEQ = 1e-3, 1e-5  # the probes: 1 ms per iteration, 10 us per sampled sequence
Constants = tuple[float, float, float]  # host_step_s, host_seq_s, kernel_scale - 1
PROBES: tuple[Constants, ...] = ((0.0, 0.0, 0.0), (STEP, 0.0, 0.0), (0.0, SEQ, 0.0), (0.0, 0.0, 1.0))
METRICS = ("throughput", "ttft_ms", "tpot_ms")


@contextmanager
def constants(engine: Engine, c: Constants) -> Iterator[None]:
    """Run with the constants of ``engine``'s default release line (what the rows' plans,
    which name no release, are predicted with; serving.engine) set to ``c``, its registered
    spec restored after. The entry keeps its ``serial`` flag: the probes' linear form holds
    for the serial engine loop, which every default line runs today (a line whose overlap
    scheduler hides host time is not linear in host_step_s)."""
    line = engine.spec.default_line
    trial = dataclasses.replace(line.fitted or Fitted(host_step_s=0.0, source=""), host_step_s=c[0],
                                host_seq_s=c[1], kernel_scale=1.0 + c[2], source="a trial of the fit")
    with fitted_as(engine, {line.fitted_line or line.version: trial}):
        yield


def _as_time(metric: str, value: float) -> float:
    """A time that is linear in the host constants: seconds per output token for a
    throughput, the latency itself otherwise."""
    return 1.0 / value if metric == "throughput" else value * 1e-3


def _of_time(metric: str, t: float) -> float:
    return 1.0 / t if metric == "throughput" else t * 1e3


@dataclass
class Point:
    """One measured metric of one row, and its prediction's linear form."""

    row_id: str
    source: str
    group: str  # the engine that ran it, or "unstated"
    device: str
    metric: str
    measured: float  # as published
    base: float  # predicted time (``_as_time``) at no host time
    a: float  # its derivative in host_step_s
    b: float  # in host_seq_s
    c: float  # in kernel_scale

    def predict(self, k: Constants) -> float:
        return _of_time(self.metric, self.base + self.a * k[0] + self.b * k[1] + self.c * k[2])


def group_of(row: dict[str, str]) -> str:
    engine = row["engine"].lower()
    if "tensorrt" in engine:
        return "trtllm"
    if "sglang" in engine:
        return "sglang"
    if "vllm" in engine:
        return "vllm"
    return "unstated"


def points(rows: list[dict[str, str]]) -> tuple[list[Point], dict[str, int]]:
    out: list[Point] = []
    skipped: dict[str, int] = defaultdict(int)
    for row in rows:
        case = case_of(row)
        if case.plan is None:
            skipped[case.why] += 1
            continue
        engine = case.plan.engine
        got = []
        for probe in PROBES:
            with constants(engine, probe):
                got.append(predicted(case.plan)[0])
        if any(g is None for g in got):
            skipped["does not fit, or its static batch does not (serving_accuracy.py)"] += 1
            continue
        for metric, value in case.metrics.items():
            t0, t1, t2, t3 = (_as_time(metric, g[metric]) for g in got)  # type: ignore[index]
            out.append(Point(row["row_id"], row["row_id"].split("-")[0], group_of(row),
                             row["gpu_type"].split()[0], metric, value, t0, (t1 - t0) / STEP,
                             (t2 - t0) / SEQ, t3 - t0))
    return out, skipped


def fit(pts: list[Point]) -> Constants:
    """The constants minimizing the squared relative errors of the times, each source
    weighing the same, host times >= 0 (least squares over each choice of which host
    constants are held at zero)."""
    if not pts:
        return 0.0, 0.0, 0.0
    target = np.array([_as_time(p.metric, p.measured) for p in pts])
    # each source weighs the same whatever its row count (a table of 300 offline runs does
    # not drown a table of 10 first-token latencies)
    share = defaultdict(int)
    for p in pts:
        share[p.source] += 1
    w = np.sqrt(np.array([1.0 / share[p.source] for p in pts]))[:, None]
    A = w * np.array([[p.a, p.b, p.c] for p in pts]) / target[:, None]
    y = w[:, 0] * (target - np.array([p.base for p in pts])) / target
    best: tuple[float, Constants] | None = None
    for free in ((0, 1, 2), (0, 2), (1, 2), (2,)):
        sol, *_ = np.linalg.lstsq(A[:, free], y, rcond=None)
        x = np.zeros(3)
        x[list(free)] = sol
        if x[0] < 0 or x[1] < 0 or x[2] <= -1:
            continue
        r = A @ x - y
        loss = float(r @ r)
        if best is None or loss < best[0]:
            best = (loss, (float(x[0]), float(x[1]), float(x[2])))
    assert best is not None
    return best[1]


def mape(pts: list[Point], predict: dict[str, float]) -> tuple[float, float]:
    """(MAPE, mean signed error) of the points given their predictions by row_id/metric."""
    errs = [(predict[f"{p.row_id}/{p.metric}"] - p.measured) / p.measured for p in pts]
    return 100 * float(np.mean(np.abs(errs))), 100 * float(np.mean(errs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--markdown", action="store_true", help="the tables for docs/ACCURACY.md")
    args = parser.parse_args()
    with args.csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    t0 = time.perf_counter()
    pts, skipped = points(rows)
    groups: dict[str, list[Point]] = defaultdict(list)
    for p in pts:
        groups[p.group].append(p)

    files: dict[str, Constants] = {}
    held: dict[str, float] = {}  # row_id/metric -> prediction with its source left out
    folds: list[tuple[str, str, Constants | None]] = []
    for group, gpts in sorted(groups.items()):
        files[group] = fit(gpts)
        sources = sorted({p.source for p in gpts})
        for source in sources:
            rest = [p for p in gpts if p.source != source]
            if not rest:
                folds.append((group, source, None))
                continue
            c = fit(rest)
            folds.append((group, source, c))
            for p in gpts:
                if p.source == source:
                    held[f"{p.row_id}/{p.metric}"] = p.predict(c)

    # what is reported: every row re-simulated at its group's fitted constants
    final: dict[str, float] = {}
    by_row = {r["row_id"]: r for r in rows}
    for group, gpts in groups.items():
        ids = sorted({p.row_id for p in gpts})
        for rid in ids:
            case = case_of(by_row[rid])
            assert case.plan is not None
            with constants(case.plan.engine, files[group]):
                got, _ = predicted(case.plan)
            assert got is not None
            for metric in case.metrics:
                final[f"{rid}/{metric}"] = got[metric]
    linear_gap = max((abs(final[f"{p.row_id}/{p.metric}"] - p.predict(files[p.group]))
                      / p.measured for p in pts), default=0.0)

    md = args.markdown
    sep = " | " if md else "  "

    def line(cells: list[str]) -> str:
        return ("| " + sep.join(cells) + " |") if md else sep.join(f"{c:<18}" for c in cells)

    print(("## " if md else "") + "Engine host constants (fitted on all of each engine's rows)")
    print()
    print(line(["engine", "host_step_s (ms)", "host_seq_s (us)", "kernel_scale", "rows", "sources"]))
    if md:
        print("|---|---:|---:|---:|---:|---|")
    for group, (s, q, k) in sorted(files.items()):
        gpts = groups[group]
        print(line([group, f"{s * 1e3:.3f}", f"{q * 1e6:.2f}", f"{1 + k:.3f}",
                    str(len({p.row_id for p in gpts})), ", ".join(sorted({p.source for p in gpts}))]))
    print()
    print(("## " if md else "") + "Constants per fold (each source left out in turn)")
    print()
    print(line(["engine", "left out", "host_step_s (ms)", "host_seq_s (us)", "kernel_scale"]))
    if md:
        print("|---|---|---:|---:|---:|")
    for group, source, c in folds:
        print(line([group, source, "-" if c is None else f"{c[0] * 1e3:.3f}",
                    "-" if c is None else f"{c[1] * 1e6:.2f}", "-" if c is None else f"{1 + c[2]:.3f}"]))
    print()
    print(("## " if md else "") + "Error per engine, device and metric")
    print()
    print(line(["engine", "device", "metric", "points", "MAPE (files)", "bias (files)",
                "MAPE (held out)", "bias (held out)"]))
    if md:
        print("|---|---|---|---:|---:|---:|---:|---:|")
    cells: dict[tuple[str, str, str], list[Point]] = defaultdict(list)
    for p in pts:
        cells[(p.group, p.device, p.metric)].append(p)
        cells[(p.group, "all", p.metric)].append(p)
    for (group, device, metric), cpts in sorted(cells.items()):
        f_mape, f_bias = mape(cpts, final)
        hp = [p for p in cpts if f"{p.row_id}/{p.metric}" in held]
        h = mape(hp, held) if hp else None
        print(line([group, device, metric, str(len(cpts)), f"{f_mape:.1f}%", f"{f_bias:+.1f}%",
                    "-" if h is None else f"{h[0]:.1f}%", "-" if h is None else f"{h[1]:+.1f}%"]))
    print()
    print(f"{len(pts)} points from {len({p.row_id for p in pts})} rows; largest gap between the "
          f"linear form and the re-simulation: {100 * linear_gap:.2f}% of a measured value; "
          f"{time.perf_counter() - t0:.0f} s")
    for why, n in sorted(skipped.items(), key=lambda kv: -kv[1]):
        print(f"- not scored {n:>4}: {why}")


if __name__ == "__main__":
    main()
