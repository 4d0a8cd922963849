"""``autoplan diff``: compare two plan files.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from autoplan.cli import output, render
from autoplan.cli.app import app
from autoplan.cli.options import (
    Format,
    FormatOpt,
)
from autoplan.errors import InputError, Problem


@app.command("diff")
def diff_plan_files(
    a_path: Annotated[Path, typer.Argument(metavar="A.yaml", help="The plan to compare against.")],
    b_path: Annotated[Path, typer.Argument(metavar="B.yaml", help="The plan compared.")],
    fmt: FormatOpt = Format.table,
) -> None:
    """What changed from plan A to plan B, and what it does to the predicted step time,
    throughput, MFU and memory (each term, each stage): exit 0, 2 bad input."""
    from autoplan.descriptors.strict import read_yaml
    from autoplan.diff import diff_plans, diff_serving
    from autoplan.planfile import read_plan
    from autoplan.serving.planfile import is_serving, read_serving_plan

    problems: list[Problem] = []
    plans: list[Any] = []
    documents = [read_yaml(a_path), read_yaml(b_path)]
    kinds = [is_serving(d) for d in documents]
    if kinds[0] != kinds[1]:
        raise InputError.single(str(b_path), "kind", "one plan is a serving plan and the other a training "
                                                     "plan: diff compares two of a kind")
    for path, data in zip((a_path, b_path), documents, strict=True):  # every problem at once
        try:
            plans.append(read_serving_plan(data, str(path)) if kinds[0] else read_plan(data, str(path)))
        except InputError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    result = (diff_serving(plans[0], plans[1], str(a_path), str(b_path)) if kinds[0]
              else diff_plans(plans[0], plans[1], str(a_path), str(b_path)))
    if fmt is Format.json:
        output.emit_json(result.to_dict())
        return
    output.out.print(escape(render.diff_summary(result)))
    output.out.print(render.diff_changes_table(result))
    output.out.print(render.diff_metrics_table(result))

