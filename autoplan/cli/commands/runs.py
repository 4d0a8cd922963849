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

runs_app = typer.Typer(help="The runs log: measured runs that calibrate and check --runs read.",
                       no_args_is_help=True)
app.add_typer(runs_app, name="runs")

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
    from autoplan.api.runs import check_group, import_runs

    check_group(group)
    files.check_target(out_path)
    files.check_apart([("--runs", out_path)], [plan_path, *logs])
    outputs.not_stdout("--runs", out_path, "the runs log is a file to append to, not stdout")
    appended_runs(out_path, [], room=len(logs))  # refused, every row of it, before any log is read
    imported = import_runs(logs, plan_path, warmup=warmup, group=group)
    files.write_text(out_path, appended_runs(out_path, list(imported.runs), check=False))
    for line in imported.said:
        output.err.print(line, markup=False)
    output.err.print(f"appended {len(imported.runs)} runs to {files.name(out_path)}")
