"""Wall time of the runs log's readers on logs of 10^3, 10^4 and 10^5 rows (issue 47: "runs
logs of 10^5 rows are read, checked and calibrated in seconds").

    python benchmarks/runs_log_speed.py [--rows 1000,10000,100000] [--plans 4] [--repeat 1]

Each log is written into a temporary folder as autoplan writes one (autoplan/tune/runs.py
``csv_text``): like a real log, many repeated measurements of a handful of distinct plans
(tiny-llama on the two-process CPU descriptor, examples/cpu; each plan's runs measured at
2.5 times its prediction with a few percent of noise, one run in twenty failed). A row a
column: the file's size, then the library calls the commands make, each from the file:

- read: ``read_runs`` (what ``calibrate``, ``check --runs`` and ``evaluate --runs`` do
  first);
- check: ``read_runs`` and ``check_plan(..., runs=...)``, ``autoplan check PLAN --runs``;
- evaluate: ``read_runs``, ``fit_residual`` and the band of one plan, ``autoplan evaluate
  PLAN --runs``;
- calibrate: ``read_runs`` and ``calibrate``, ``autoplan calibrate``.

The best of ``--repeat`` runs of each. Exits 0 (a table to read, not a gate); quote it
with the machine it ran on.
"""

from __future__ import annotations

import argparse
import platform
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from autoplan.commands.check import check_plan
from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model
from autoplan.plan import Layout, Plan
from autoplan.plans.file import plan_document
from autoplan.schedules import Schedule
from autoplan.tune.calibrate import calibrate
from autoplan.tune.residual import fit_residual
from autoplan.tune.runs import Run, csv_text, read_runs
from autoplan.vocab import Recompute, ZeroStage

CPU = Path(__file__).resolve().parents[1] / "examples" / "cpu"
# (dp, tp, pp, micro-batch): the layouts two processes can run a global batch of 8 with
LAYOUTS = [(2, 1, 1, 4), (1, 2, 1, 8), (1, 1, 2, 1), (2, 1, 1, 2), (2, 1, 1, 1), (1, 2, 1, 4),
           (1, 1, 2, 2), (1, 2, 1, 2)]


def plans(n: int) -> list[Plan]:
    model = resolve_model(str(CPU / "tiny-llama.yaml"))
    cluster = resolve_cluster(str(CPU / "local-cpu.yaml"))
    return [Plan(model=model, cluster=cluster, job=Job(global_batch=8, seq_len=256),
                 layout=Layout(dp=dp, tp=tp, pp=pp), micro_batch=mb, schedule=Schedule.ONE_F_ONE_B,
                 sequence_parallel=tp > 1, recompute=Recompute.NONE, zero=ZeroStage.NONE)
            for dp, tp, pp, mb in LAYOUTS[:n]]


def write_log(path: Path, rows: int, distinct: list[Plan]) -> None:
    rng = random.Random(rows)
    predicted = [evaluate(p).step_time_s for p in distinct]
    runs = []
    for i in range(rows):
        j = i % len(distinct)
        when = f"2026-{1 + i // 100000 % 12:02d}-01T00:00:00+00:00"
        if i % 20 == 19:
            runs.append(Run(plan=distinct[j], status="failed", reason="NCCL error", source="tune",
                            runner="torchrun", time=when))
        else:
            measured = 2.5 * predicted[j] * rng.uniform(0.97, 1.03)
            runs.append(Run(plan=distinct[j], measured_step_time_s=measured, measured_peak_gib=1.5,
                            predicted_step_time_s=predicted[j], source="tune", runner="torchrun",
                            time=when, steps=3))
    path.write_text(csv_text(runs))


def best(f: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1000,10000,100000", help="row counts, comma-separated")
    parser.add_argument("--plans", type=int, default=4, choices=range(2, len(LAYOUTS) + 1),
                        help="distinct plans the rows repeat")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each call; the best is shown")
    args = parser.parse_args()
    distinct = plans(args.plans)
    print(f"# {platform.node()} {platform.machine()} {platform.python_version()}; {args.plans} distinct "
          f"plans; best of {args.repeat}; seconds (wall)")
    print(f"{'rows':>8} {'MB':>7} {'read':>7} {'check':>7} {'evaluate':>9} {'calibrate':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plan_file = folder / "plan.yaml"
        plan_file.write_text(yaml.safe_dump(plan_document(distinct[0]), sort_keys=False))
        for rows in (int(x) for x in args.rows.split(",")):
            path = folder / f"runs-{rows}.csv"
            write_log(path, rows, distinct)
            read = best(lambda path=path: read_runs(path), args.repeat)

            def check(path: Path = path) -> None:
                report = check_plan(plan_file, runs=read_runs(path), runs_source=str(path))
                assert report.exit_code in (0, 1), report.to_dict()

            def learned(path: Path = path) -> None:
                residual = fit_residual(read_runs(path), str(path))
                residual.band(distinct[0], evaluate(distinct[0]))

            def calibrated(path: Path = path) -> None:
                runs = read_runs(path)
                calibrate(runs, runs[0].plan.stack, "bench", str(path))

            size = path.stat().st_size / 1e6
            print(f"{rows:>8,} {size:>7.1f} {read:>7.2f} {best(check, args.repeat):>7.2f} "
                  f"{best(learned, args.repeat):>9.2f} {best(calibrated, args.repeat):>10.2f}", flush=True)


if __name__ == "__main__":
    main()
