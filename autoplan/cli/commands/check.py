"""``autoplan check``: gate a plan file in CI.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

import contextlib
import enum
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from autoplan.cli import files, output, render
from autoplan.cli.app import app
from autoplan.cli.options import (
    LauncherOpt,
    StackOpt,
)


class CheckFormat(str, enum.Enum):
    text = "text"
    table = "table"  # the other commands' name for the text for people: the same report
    json = "json"
    junit = "junit"


@app.command("check")
def check_plan_file(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.yaml", help="A committed plan file.")],
    max_regression: Annotated[float | None, typer.Option(
        "--max-regression", "-r", min=0.0,
        help="Fail when the plan's predicted step time is more than this fraction (0.05 = 5%) "
             "slower than the best plan the search finds for the same model, cluster and job.")] = None,
    min_headroom: Annotated[float, typer.Option(
        "--min-headroom", min=0.0, help="GiB every pipeline stage must leave free on the device "
                                        "(beyond its peak, which includes the device's reserve).")] = 0.0,
    space: Annotated[str | None, typer.Option(
        "--space", help="Search space of --max-regression: launchable (every launcher's plans), "
                        "any (launcher-free; its former name default), megatron, deepspeed, "
                        "torchtitan, fsdp, or a path (default: the one the plan file records it "
                        "was searched in, else launchable).")
    ] = None,
    launcher: LauncherOpt = None,
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", parser=files.out_path, metavar="<path>",
        help="Write the report here (in --format, also on bad input) and print the text "
                            "report to stdout.")] = None,
    fmt: Annotated[CheckFormat, typer.Option(
        "--format", "-f", help="text (or table) for people and CI logs, json for machines, junit "
                               "for CI test reports.")] = CheckFormat.text,
    runs: Annotated[Path | None, typer.Option(
        "--runs", help="A runs log (autoplan tune, runs import): fail when the last measured run of "
                       "this plan is more than --max-slowdown slower than its baseline (the plan "
                       "file's recorded measurement, else the run before).")] = None,
    max_slowdown: Annotated[float, typer.Option(
        "--max-slowdown", min=0.0, max=1e6, help="With --runs: the measured slowdown allowed "
                                                 "(0.10 = 10%).")] = 0.10,
    stack: StackOpt = None,
) -> None:
    """CI gate for a committed plan: valid, fits memory (with --min-headroom), within
    --max-regression of the best plan: exit 0 pass, 1 a rule failed (each named), 2 bad input.
    With --format json or junit a plan that does not read is still reported, rule `valid` in error."""
    from autoplan.api.plans import check, check_space
    from autoplan.commands.check import Status

    searchspace = check_space(space, launcher)
    if out_path is not None:
        files.check_target(out_path)
        files.check_apart([("--out", out_path)], [plan_path] + ([runs] if runs else []))
    searching = output.working(fmt.value, f"checking {plan_path}: searching the "
                               f"{searchspace.name if searchspace else 'recorded'} space ...")
    with searching if max_regression is not None else contextlib.nullcontext():
        report = check(plan_path, max_regression=max_regression, min_headroom=min_headroom, space=searchspace,
                       runs=runs, max_slowdown=max_slowdown, stack=stack).report
    if fmt is CheckFormat.json:
        doc = output.json_text(report.to_dict())
    elif fmt is CheckFormat.junit:
        doc = render.check_junit(report)
    else:
        doc = render.check_text(report)
    if files.is_stdout(out_path):
        out_path = None  # the report in --format, to stdout as without --out
    if out_path is not None:
        files.write_text(out_path, doc)
    if not report.bad_input:
        sys.stdout.write(doc if out_path is None else render.check_text(report))
    elif fmt not in (CheckFormat.text, CheckFormat.table) and out_path is None:
        sys.stdout.write(doc)  # a complete report for the CI's reporter; the reason on stderr
    for result in report.rules:
        if result.status is Status.ERROR:
            for line in (result.message, *result.details):
                output.err.print(f"autoplan: error: {line}", markup=False)
    if out_path is not None:
        output.err.print(f"wrote the {fmt.value} report to {escape(str(out_path))}")
    if report.exit_code:
        raise typer.Exit(report.exit_code)

