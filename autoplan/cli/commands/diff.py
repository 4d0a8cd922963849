"""``autoplan diff``: compare two plan files.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from autoplan.cli import output, render
from autoplan.cli.app import app
from autoplan.cli.options import (
    Format,
    FormatOpt,
)


@app.command("diff")
def diff_plan_files(
    a_path: Annotated[Path, typer.Argument(metavar="A.yaml", help="The plan to compare against.")],
    b_path: Annotated[Path, typer.Argument(metavar="B.yaml", help="The plan compared.")],
    fmt: FormatOpt = Format.table,
) -> None:
    """What changed from plan A to plan B, and what it does to the predicted step time,
    throughput, MFU and memory (each term, each stage): exit 0, 2 bad input."""
    from autoplan.api.plans import diff

    result = diff(a_path, b_path)
    if fmt is Format.json:
        output.emit_json(result.to_dict())
        return
    output.out.print(escape(render.diff_summary(result)))
    output.out.print(render.diff_changes_table(result))
    output.out.print(render.diff_metrics_table(result))

