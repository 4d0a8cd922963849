"""``autoplan explain``: one plan's time, memory and stages in full.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from autoplan.api import outputs
from autoplan.cli import files, output, render
from autoplan.cli.app import app
from autoplan.cli.commands.evaluate import _print_prediction, _print_serving
from autoplan.cli.options import (
    Format,
    FormatOpt,
    ProfileOpt,
    StackOpt,
)


@app.command()
def explain(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.yaml", help="A plan file.")],
    timeline: Annotated[Path | None, typer.Option(
        "--timeline", parser=files.out_path, metavar="<path>",
        help="Also write the simulated schedule as an image (.svg, or .png "
        "with matplotlib installed).")] = None,
    microbatches: Annotated[int | None, typer.Option(
        "--microbatches", min=1, help="Draw the schedule with this many microbatches instead of "
        "the plan's (a readable picture of the same schedule).")] = None,
    profile: ProfileOpt = None,
    stack: StackOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Where time and memory go, and the simulated pipeline schedule as a timeline. --format
    json gives evaluate's JSON of the plan with the explanation added (per-stage times, the
    simulated schedule's makespan and idle share per stage)."""
    from autoplan.api.plans import explain as run_explain
    from autoplan.schedules import timeline as tl

    if timeline is not None:
        from autoplan.api.plans import check_timeline

        outputs.not_stdout("--timeline", timeline, "expected a file, got '-'")
        files.check_image("--timeline", timeline)
        check_timeline(plan_path)
    result = run_explain(plan_path, microbatches=microbatches, profile=profile, stack=stack)
    for note in result.notes:
        output.err.print(note, markup=False)
    plan, pred = result.plan, result.prediction
    if result.serving:
        if fmt is Format.json:
            output.emit_json(result.to_dict())
        else:
            _print_serving(str(plan_path), plan, pred)
        raise typer.Exit(0 if result.ok else 1)
    sim = result.timeline
    if fmt is Format.json:
        output.emit_json(result.to_dict())
    else:
        _print_prediction(plan_path, plan, pred, render.stage_table(plan, result.stages or ()))
        output.out.print(f"[bold]timeline[/bold]: {escape(result.title)}")
        label = len(f"stage {plan.layout.pp - 1} ") + 12  # stage label and idle share per line
        output.out.print(tl.timeline_rich(sim.events, plan.layout.pp,
                                          width=max(20, min(160, output.out.width - label))))
    if timeline is not None:
        if timeline.suffix.lower() == ".svg":
            files.write_text(timeline, result.timeline_svg())
        else:
            files.write_bytes(timeline, tl.timeline_png(sim.events, plan.layout.pp, title=result.title))
        output.err.print(f"wrote the timeline to {escape(str(timeline))}")

