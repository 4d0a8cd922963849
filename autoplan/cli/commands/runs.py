"""``autoplan runs import``: launcher logs (or serving benchmark results) into the runs log.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autoplan.api import outputs
from autoplan.api.loop import appended_runs
from autoplan.cli import files, output
from autoplan.cli.app import app
from autoplan.errors import InputError, Problem
from autoplan.units import GiB

runs_app = typer.Typer(help="The runs log: measured runs that calibrate and check --runs read.",
                       no_args_is_help=True)
app.add_typer(runs_app, name="runs")

MAX_LOG_BYTES = 512 * 2**20  # a training log of many thousands of steps; more is not one run's


@runs_app.command("import")
def runs_import(
    logs: Annotated[list[Path], typer.Argument(
        metavar="LOG...", help="Megatron-LM or torchtitan training logs (stdout of the run, or "
                               "Slurm's output file), or serving benchmark results (vllm bench serve's "
                               "--save-result JSON, sglang.bench_serving's --output-file, aiperf's "
                               "profile_export_aiperf.json), one run each.")],
    out_path: Annotated[Path, typer.Option(
        "--runs", "--out", "-o", parser=files.out_path, metavar="<path>",
        help="The runs log to append to (created if missing; --out is its other name).")],
    plan_path: Annotated[Path | None, typer.Option(
        "--plan", "-p", help="The plan file the logged runs ran (what the runs log records); for "
                             "serving results, the serving plan the client drove (default: the "
                             "autoplan-trial.json tune --serving writes beside each result).")] = None,
    warmup: Annotated[int, typer.Option(
        "--warmup", min=0, max=10**6, help="Logged steps to leave out before the timed ones.")] = 2,
    group: Annotated[str, typer.Option(
        "--group", help="Runs calibrate holds out together (default: the plan's id).")] = "",
) -> None:
    """Read step times and peak memory from training logs into the runs log: the median
    logged step after --warmup, the peak the launcher reports; a log that ran out of memory
    is recorded as such. Exit 0, 2 bad input."""
    import datetime
    import statistics

    from autoplan.cli.serving_loop import import_serving, is_serving_result
    from autoplan.cli.serving_loop import said as said_serving
    from autoplan.cost.evaluate import evaluate
    from autoplan.descriptors.strict import name_problem, read_limited, read_yaml
    from autoplan.planfile import read_plan
    from autoplan.tune.logs import read_log
    from autoplan.tune.runs import Run, peak_gib_problem, run_problems, step_time_problem

    if group and (why := name_problem(group)):
        raise InputError.single("--group", "", why)
    files.check_target(out_path)
    files.check_apart([("--runs", out_path)], [plan_path, *logs])
    outputs.not_stdout("--runs", out_path, "the runs log is a file to append to, not stdout")
    appended_runs(out_path, [], room=len(logs))  # refused, every row of it, before any log is read
    serving = [is_serving_result(path) for path in logs]
    if any(serving):
        if not all(serving):
            raise InputError.single(str(logs[serving.index(False)]), "", (
                "a training log beside serving results: import each kind on its own"))
        imported = import_serving(logs, plan_path, group)
        files.write_text(out_path, appended_runs(out_path, imported, check=False))
        for run, path in zip(imported, logs, strict=True):
            output.err.print(said_serving(run, path), markup=False)
        output.err.print(f"appended {len(imported)} runs to {files.name(out_path)}")
        return
    if plan_path is None:
        raise InputError.single("--plan", "", "missing: the plan file the logged runs ran")
    plan = read_plan(read_yaml(plan_path), str(plan_path))
    pred = evaluate(plan)
    # the prediction is recorded where it is in the runs log's range (calibrate predicts again)
    pred_step = pred.step_time_s if step_time_problem(pred.step_time_s) is None else None
    pred_peak = pred.memory.peak / GiB if peak_gib_problem(pred.memory.peak / GiB) is None else None
    tokens = plan.job.global_batch * plan.job.seq_len
    found: list[Run] = []
    said: list[str] = []
    for path in logs:
        text = read_limited(path, MAX_LOG_BYTES, "a training log").decode("utf-8", "replace")
        reading = read_log(text, tokens_per_step=tokens, gpus=plan.layout.gpus)
        if reading.problems:  # a number that is no measurement: the log, not the runs log, is wrong
            raise InputError([Problem(str(path), f"line {n}", message) for n, message in reading.problems])
        timed = reading.timed(warmup)
        when = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).isoformat(
            timespec="seconds")
        if reading.oom:
            run = Run(plan=plan, status="oom", reason=f"{path.name}: out of memory",
                      measured_peak_gib=reading.peak_gib, source="import", runner=reading.format,
                      time=when, group=group, predicted_step_time_s=pred_step, predicted_peak_gib=pred_peak)
        elif not timed:
            got = len(reading.step_times_s)
            raise InputError.single(str(path), "", (
                f"{got} step lines, none after --warmup {warmup}" if reading.format else
                "no Megatron-LM (iteration ... elapsed time per iteration) or torchtitan "
                "(step: ... tps:) step line"))
        else:
            run = Run(plan=plan, measured_step_time_s=statistics.median(timed),
                      measured_peak_gib=reading.peak_gib, source="import", runner=reading.format,
                      time=when, steps=len(timed), group=group, predicted_step_time_s=pred_step,
                      predicted_peak_gib=pred_peak)
        if problems := run_problems(run, str(path)):  # what the runs log would refuse to read back
            raise InputError(problems)
        found.append(run)
        shown = (f"{run.measured_step_time_s:.4g} s per step over {len(timed)} steps"
                 if run.ok else run.status)
        said.append(f"{files.name(path)}: {reading.format or 'log'}: {shown}")
    files.write_text(out_path, appended_runs(out_path, found, check=False))
    for line in said:
        output.err.print(line, markup=False)
    output.err.print(f"appended {len(found)} runs to {files.name(out_path)}")

