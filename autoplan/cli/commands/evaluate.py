"""``autoplan evaluate``: predict one plan file (training or serving), and the
prediction's rendering explain shares.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from autoplan.cli import output, render, render_serving
from autoplan.cli.app import app
from autoplan.cli.options import (
    CalibrationOpt,
    Format,
    FormatOpt,
    ProfileOpt,
    StackOpt,
)
from autoplan.plan import Plan, Prediction


def _print_prediction(path: Path, plan: Plan, pred: Prediction, *extra: Any) -> None:
    """A plan's prediction for people: summary, where time goes, (extra), memory."""
    where = (render.cluster_text(plan) if plan.placement is not None
             else f"{plan.cluster.gpus} x {plan.cluster.device.name}")
    output.out.print(f"[bold]{escape(str(path))}[/bold]: " + escape(f"{plan.model.name} on {where}"))
    output.out.print(render.summary_line(plan, pred))
    output.out.print(escape(f"stack: {plan.stack.name} ({plan.stack.summary})"
                            if plan.stack.summary else f"stack: {plan.stack.name}"))
    if pred.uncertainty is not None:
        output.out.print(escape(render.band_line(pred, pred.uncertainty)))
    if not pred.feasible:
        output.out.print(f"[red]{escape(pred.reason)}[/red]")
    output.out.print(render.breakdown_table(plan, pred, "where the step time goes"))
    for renderable in extra:
        output.out.print(renderable)
    output.out.print(render.memory_table(pred))
    if (docs := plan.job.documents) is not None:
        output.out.print(escape(render.packing_line(plan, docs)))
    from autoplan.api.plans import reliabilities

    if found := reliabilities(plan):
        for line in render.reliability_lines(found, plan.cluster.gpus):
            output.out.print(escape(line))


@app.command()
def evaluate(
    ctx: typer.Context,
    plans: Annotated[list[Path], typer.Argument(metavar="PLAN.yaml", help="Plan files.")],
    profile: ProfileOpt = None,
    stack: StackOpt = None,
    runs: Annotated[Path | None, typer.Option(
        "--runs", help="A runs log (autoplan tune, runs import): add the step time its measured "
                       "runs predict for each plan (a random forest of measured / predicted over "
                       "layout and breakdown), with its 10th-90th percentile band.")] = None,
    calibration: CalibrationOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Predict each plan with a breakdown: exit 0 all fit, 1 some do not fit, 2 bad input."""
    from autoplan.api.plans import evaluate as run_evaluate

    result = run_evaluate(plans, profile=profile, stack=stack, runs=runs, calibration=calibration)
    if fmt is Format.json:
        result.check_one_kind()
    if result.calibration is not None:  # the tables too are drawn with its constants
        from autoplan.serving.calibration import applied

        ctx.with_resource(applied(result.calibration))
    for note in result.notes:
        output.err.print(note, markup=False)
    if fmt is Format.json:
        output.emit_json(result.to_dict())
    else:
        learned = result.residual
        # serving plans first, then training plans, each kind in the order given
        for e in sorted(result.plans, key=lambda e: not e.serving):
            if e.serving:
                _print_serving(e.source, e.plan, e.prediction)
                continue
            _print_prediction(Path(e.source), e.plan, e.prediction)
            if e.learned is not None:
                p10, p50, p90 = learned.band(e.plan, e.prediction)
                output.out.print(escape(
                    f"step time: {e.prediction.step_time_s:.3f} s predicted by the cost model (above); "
                    f"{p50:.3f} s corrected by the {learned.runs_for(e.plan)} measured runs of {runs} "
                    f"on {e.plan.cluster.device.name} "
                    f"({p10:.3f} to {p90:.3f} s, 10th to 90th percentile over the trees)"))
    if not result.ok:
        raise typer.Exit(1)


def _print_serving(source: str, plan: Any, pred: Any) -> None:
    """A serving plan's evaluation for people."""
    from autoplan.serving.cost import StepModel

    step = StepModel(plan.model, plan.cluster, plan.deployment, plan.engine, plan.engine_version)
    for renderable in render_serving.serving_evaluation(source, plan, pred, step):
        output.out.print(renderable)

