"""``autoplan validate``: a plan's slice measured on this machine against its prediction.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from autoplan.api import outputs
from autoplan.cli import files, output
from autoplan.cli.app import app
from autoplan.cli.options import (
    Device,
    Format,
    FormatOpt,
)
from autoplan.units import GiB, MiB

if TYPE_CHECKING:
    from autoplan.bench.validate import Validation


@app.command()
def validate(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.yaml", help="A plan file.")],
    device_kind: Annotated[Device, typer.Option(
        "--device", "-d", help="cpu: the plan's world size as local processes over gloo; cuda: one "
                               "rank's slice on one GPU (--slice implied).")] = Device.cpu,
    profile: Annotated[Path | None, typer.Option(
        "--profile", help="Profile CSV from `autoplan bench` on this machine: the prediction is made "
                          "on a descriptor fitted on it (default: the plan's own cluster, which must "
                          "describe this machine, e.g. examples/cpu/local-cpu.yaml).")] = None,
    cluster: Annotated[str | None, typer.Option(
        "--cluster", "-c", help="Built-in cluster name or descriptor path of this machine to predict "
                                "on, such as the one `autoplan bench --describe` wrote (default: the "
                                "plan's own).")] = None,
    slice_: Annotated[bool, typer.Option(
        "--slice", help="Run one rank's share of the plan (one pipeline stage at TP-sharded widths, "
                        "its ZeRO optimizer shard, no communication) and compare its compute time "
                        "and peak memory.")] = False,
    stage: Annotated[int | None, typer.Option(
        "--stage", min=0, help="--slice: the pipeline stage to run (default: the one with the highest "
                               "predicted peak memory).")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed steps (the median is compared).")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", min=1, help="Untimed steps before them.")] = 2,
    tolerance: Annotated[float | None, typer.Option(
        "--tolerance", min=0.0, help="Allowed relative error of the step time (slice: compute time); "
                                     "default 0.5 on cpu (eager PyTorch, no overlap on one core), "
                                     "0.3 on cuda.")] = None,
    memory_tolerance: Annotated[float, typer.Option(
        "--memory-tolerance", min=0.0, help=(
            "Allowed relative error of peak memory (on cpu a gap under 48 MiB also passes: "
            "eager PyTorch's own objects)."))] = 0.25,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1.0, help="Seconds the whole run may take before its processes are stopped.")
    ] = 900.0,
    max_step_s: Annotated[float, typer.Option(
        "--max-step-s", min=0.01, help="Make a plan predicted slower than this per step smaller "
                                       "(fewer layers, then narrower, then fewer microbatches).")] = 20.0,
    exact: Annotated[bool, typer.Option(
        "--exact", help="Run the plan as it is, even where it is larger than the machine's budget.")
    ] = False,
    runs: Annotated[Path | None, typer.Option(
        "--runs", parser=files.out_path, metavar="<path>",
        help="Append the run to this runs log (what ran, on this machine's descriptor; "
             "distributed runs only: a slice's compute time is not a step time).")] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Run the plan for real with torch's distributed engine and compare measured with predicted
    step time and peak memory: exit 0 within tolerance, 1 not, 2 bad input or a failed run."""
    from autoplan.bench.validate import Options, check_options
    from autoplan.bench.validate import validate as run_validation
    from autoplan.descriptors.strict import read_yaml
    from autoplan.plans.file import read_plan

    device = device_kind.value
    check_options(cluster=cluster, profile=profile, runs=runs, slice_=slice_, device=device)
    if runs is not None:
        from autoplan.api.loop import appended_runs

        files.check_target(runs)
        files.check_apart([("--runs", runs)], [plan_path])
        outputs.not_stdout("--runs", runs, "the runs log is a file to append to, not stdout")
        appended_runs(runs, [])  # refused before the run, not after it
    plan = read_plan(read_yaml(plan_path), str(plan_path))
    options = Options(device=device, profile=profile, cluster=cluster, slice=slice_, stage=stage,
                      steps=steps, warmup=warmup, tolerance=tolerance, memory_tolerance=memory_tolerance,
                      timeout_s=timeout, max_step_s=max_step_s, fit=not exact)
    what = "one rank's slice" if slice_ or device == "cuda" else f"{plan.layout.gpus} processes"
    with output.working(fmt.value, f"validating {plan_path}: {what} on {device} ..."):
        result = run_validation(plan, str(plan_path), options)
    if runs is not None:
        import datetime

        from autoplan.api.loop import appended_runs
        from autoplan.tune.runs import Run

        files.write_text(runs, appended_runs(runs, [Run(
            plan=result.plan, measured_step_time_s=result.measured_time_s,
            measured_peak_gib=result.measured_peak_bytes / GiB,
            predicted_step_time_s=result.predicted_time_s,
            predicted_peak_gib=result.predicted_peak_bytes / GiB, source="validate", runner="local",
            time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            steps=len(result.step_times_s))]))
    if fmt is Format.json:
        output.emit_json(result.to_dict())
    else:
        _print_validation(result)
    if runs is not None:
        output.err.print(f"appended the run to {files.name(runs)}")
    if not result.within:
        raise typer.Exit(1)


def _print_validation(result: Validation) -> None:
    """A validation for people: what ran, measured against predicted, per rank, notes."""
    import statistics

    from rich.table import Table

    plan, lay = result.plan, result.plan.layout
    degrees = [("dp", lay.dp), ("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp), ("ep", lay.ep),
               ("vpp", lay.vpp)] + ([("etp", lay.etp)] if lay.etp != lay.tp else [])
    shown = ", ".join(f"{k}={v}" for k, v in degrees if v != 1 or k in ("dp", "tp", "pp"))
    output.out.print(f"[bold]{escape(result.source)}[/bold]: " + escape(
        f"{plan.model.name} ({plan.model.layers} layers, hidden {plan.model.hidden}), "
        f"{shown}, {plan.schedule.value}, zero {int(plan.zero)}, {plan.num_microbatches} microbatches "
        f"of {plan.micro_batch} x {plan.job.seq_len}, {result.mode} on {result.device}"
        + (f", stage {result.stage}" if result.stage is not None else "")))
    output.out.print(escape(f"predicted on {result.descriptor}"))
    what = "step time" if result.mode == "distributed" else "compute time (fwd+bwd)"
    table = Table(title="measured against predicted", title_justify="left")
    for col in ("", "measured", "predicted", "ratio", "tolerance", ""):
        table.add_column(col, justify="left" if col == "" else "right")
    lo, hi = result.spread
    table.add_row(what, f"{result.measured_time_s:.3f} s", f"{result.predicted_time_s:.3f} s",
                  f"{result.time_ratio:.2f}", f"±{result.time_tolerance:.0%}",
                  "[green]ok[/green]" if result.time_within else "[red]outside[/red]")
    table.add_row("peak memory", f"{result.measured_peak_bytes / GiB:.3f} GiB",
                  f"{result.predicted_peak_bytes / GiB:.3f} GiB", f"{result.memory_ratio:.2f}",
                  f"±{result.memory_tolerance:.0%}"
                  + (f" or {result.memory_floor_bytes / MiB:.0f} MiB" if result.memory_floor_bytes else ""),
                  "[green]ok[/green]" if result.memory_within else "[red]outside[/red]")
    output.out.print(table)
    output.out.print(f"timed steps {len(result.step_times_s)}: {lo:.3f} to {hi:.3f} s; "
                     f"peak memory over {escape(result.peak_window)}")
    if result.step_time_band_s is not None:
        p10, p90 = result.step_time_band_s
        output.out.print(f"predicted step time over the learned correction's trees: {p10:.3f} to "
                         f"{p90:.3f} s (10th to 90th percentile)")
    ranks = Table(title="per rank", title_justify="left")
    for col in ("rank", "stage", "median step s", "peak GiB", "predicted GiB", "threads"):
        ranks.add_column(col, justify="right")
    for r in result.ranks:
        ranks.add_row(str(r.rank), str(r.stage), f"{statistics.median(r.step_times_s):.3f}",
                      f"{r.peak_memory_bytes / GiB:.3f}", f"{r.predicted_peak_bytes / GiB:.3f}",
                      str(r.threads))
    output.out.print(ranks)
    for line in (*result.adjustments, *result.notes):
        output.err.print(f"note: {line}", markup=False)

