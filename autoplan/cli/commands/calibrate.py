"""``autoplan calibrate``: a stack (or serving constants) learned from the runs log.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from autoplan.api.loop import percent_text, serving_held_out_text
from autoplan.cli import files, output
from autoplan.cli.app import app
from autoplan.cli.options import (
    Format,
    FormatOpt,
)
from autoplan.cli.render_serving import ms


@app.command()
def calibrate(
    runs_path: Annotated[Path, typer.Argument(metavar="RUNS.csv", help="A runs log (autoplan tune, "
                                                                      "runs import, or your own).")],
    stack: Annotated[str | None, typer.Option(
        "--stack", help="The stack to calibrate: a built-in name or stack file (default: the one "
                        "every run names).")] = None,
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", parser=files.out_path, metavar="<path>",
        help="Write the calibrated stack file here (search, evaluate, serve and check take it "
             "with --stack FILE).")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="The calibrated stack's name (default: the base's, with -calibrated).")] = None,
    engine: Annotated[str | None, typer.Option(
        "--engine", help="Calibrate a serving engine's constants (host time per iteration and per "
                         "sequence, kernel scale, launch and request time) on the log's serving runs: "
                         "vllm, sglang or trtllm (default: the one the serving runs name, where the "
                         "log holds no training run).")] = None,
    engine_version: Annotated[str | None, typer.Option(
        "--engine-version", help="With --engine: the release whose release line to calibrate (default: "
                                 "the one line the runs ran).")] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Fit a stack's constants (compute efficiency, step overhead, host cost per kernel,
    overlap slowdown) to measured runs, or a serving engine release line's to measured
    serving runs, with held-out error before and after: exit 0, 2 bad input or runs that
    identify no constant."""
    from autoplan.api.loop import calibrate as run_calibrate

    if out_path is not None:
        files.check_target(out_path)
        files.check_apart([("--out", out_path)], [runs_path])
    calibrated = run_calibrate(runs_path, stack=stack, name=name, engine=engine,
                               engine_version=engine_version)
    if out_path is not None:
        files.write_text(out_path, calibrated.file_text())
    if fmt is Format.json:
        output.emit_json(calibrated.to_dict())
    elif calibrated.serving:

        print_serving_calibration(calibrated.result)
    else:
        _print_calibration(calibrated.result)
    if out_path is not None and not files.is_stdout(out_path):
        output.err.print(f"wrote the calibrated constants to {files.name(out_path)} (serve and evaluate take "
                         "it with --calibration)" if calibrated.serving
                         else f"wrote the calibrated stack to {files.name(out_path)}")


MAX_SHOWN_PLANS = 20  # the held-out table's rows; --format json lists every run


def _short_plan(plan: Any, models: int) -> str:
    """A plan in a few words for a narrow table: its layout and micro-batch, and what else
    sets it apart from the default (the model where the log holds several)."""
    from autoplan.tune.tune import layout_words

    parts = ([plan.model.name] if models > 1 else []) + layout_words(plan)
    parts.append(f"mbs{plan.micro_batch}")
    if int(plan.zero):
        parts.append(f"zero{int(plan.zero)}")
    if plan.recompute.value != "none":
        parts.append(f"rc-{plan.recompute.value}")
    return " ".join(parts)


def _print_calibration(result: Any) -> None:
    import statistics

    from rich.table import Table

    from autoplan.tune.calibrate import by_regime, constants_of
    from autoplan.tune.runs import distinct_plans

    held = result.held_out
    before, after = result.mape_before, result.mape_after
    base = constants_of(result.base)
    _print_constants(f"stack {result.base.name} calibrated on {result.runs} runs ({result.groups} groups)",
                     "base", base, base, constants_of(result.stack), result)
    # held out, a row a plan: its runs' median measurement and predictions
    plans, of = distinct_plans(h.run.plan for h in held)
    mine: list[list[Any]] = [[] for _ in plans]
    for h, j in zip(held, of, strict=True):
        mine[j].append(h)
    models = len({p.model.name for p in plans})
    runs = Table(title="held out: each group predicted by constants fitted without it",
                 title_justify="left")
    for col in ("plan", "runs", "measured s", "base s", "calibrated s"):
        runs.add_column(col, justify="left" if col == "plan" else "right")
    for plan, hs in list(zip(plans, mine, strict=True))[:MAX_SHOWN_PLANS]:
        runs.add_row(escape(_short_plan(plan, models)), str(len(hs)),
                     f"{statistics.median(h.measured_s for h in hs):.4g}",
                     f"{statistics.median(h.before_s for h in hs):.4g}",
                     f"{statistics.median(h.after_s for h in hs):.4g}")
    output.out.print(runs)
    if len(plans) > MAX_SHOWN_PLANS:
        output.out.print(f"... and {len(plans) - MAX_SHOWN_PLANS} more plans (--format json lists every run)")
    if any(len(hs) > 1 for hs in mine):
        output.out.print("(seconds: the median of each plan's runs)")
    for regime, (n, b, a) in by_regime(held).items():
        output.out.print(escape(f"{regime}: {n} runs, held-out error {percent_text(b)} before, "
                                f"{percent_text(a)} after"))
    output.out.print(f"all: held-out step time error {percent_text(before)} before, "
                     f"{percent_text(after)} after (mean absolute percentage)")


def _print_constants(title: str, before: str, names: Any, base: Any, calibrated: Any, result: Any) -> None:
    """A calibration's constants (a stack's or an engine line's): each one's value ``before``
    and calibrated, and whether the runs fitted it, with a numbered note of why not."""
    from rich.table import Table

    table = Table(title=escape(title), title_justify="left")
    for col in ("constant", before, "calibrated", "fitted"):
        table.add_column(col, justify="left" if col in ("constant", "fitted") else "right")
    notes: list[str] = []
    for k in names:
        if k in result.fitted:
            mark = "yes"
        else:
            notes.append(f"({len(notes) + 1}) {k} kept: {result.not_fitted.get(k, '')}")
            mark = f"no ({len(notes)})"
        table.add_row(k, f"{base[k]:.4g}", f"{calibrated[k]:.4g}", mark)
    output.out.print(table)
    for line in notes:
        output.out.print(escape(line))


def _load_text(run: Any) -> str:
    a, w = run.plan.workload.arrival, run.plan.workload
    how = (f"{a.rate_rps:g} r/s" if a.rate_rps else f"c{a.concurrency}" if a.concurrency else "offline")
    return f"{w.input_len.mean:g}/{w.output_len.mean:g} {how}"


def print_serving_calibration(result: Any) -> None:
    from rich.table import Table

    from autoplan.serving.calibration import CONSTANTS

    held = result.held_out
    label = f"{result.engine.value} release line {result.line}" if result.line else result.engine.value
    _print_constants(f"{label} calibrated on {result.runs} serving runs ({result.groups} groups)", "line's",
                     CONSTANTS, result.base, result.constants, result)
    runs = Table(title="held out: each group predicted by constants fitted without it (ms)",
                 title_justify="left")
    for col in ("deployment", "load", "TTFT meas", "TTFT line's", "TTFT calib", "TPOT meas", "TPOT line's",
                "TPOT calib"):
        runs.add_column(col, justify="left" if col in ("deployment", "load") else "right")
    for h in held[:20]:
        runs.add_row(escape(h.run.label or h.run.plan.deployment.label()), escape(_load_text(h.run)),
                     ms(h.measured[0]), ms(h.before[0]), ms(h.after[0]), ms(h.measured[1]),
                     ms(h.before[1]), ms(h.after[1]))
    output.out.print(runs)
    if len(held) > 20:
        output.out.print(f"... and {len(held) - 20} more runs (--format json lists every run)")
    output.out.print(f"held-out error (mean absolute percentage): {serving_held_out_text(result)}")
