"""``autoplan tune --serving JOB.yaml``: serve's best deployments run with their engines and
benchmark clients (:func:`autoplan.api.loop.prepare_tune_serving` searches and runs them);
here its progress lines and its table. :mod:`autoplan.cli.commands.tune` parses the options
and calls :func:`tune_serving_command`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from autoplan.api import outputs
from autoplan.cli import files, output
from autoplan.cli.options import Format
from autoplan.cli.render_serving import ms


def tune_serving_command(job_file: Path, *, top_k: int, log: Path | None, workdir: Path | None,
                         out_path: Path | None, checkpoint: str | None, health_timeout: float, timeout: float,
                         fmt: Format, ctrl_c: Any) -> None:
    """``autoplan tune --serving JOB.yaml --runner local``: exit 0 a deployment measured, 1
    none did (or none the local runner can run), 2 bad input."""
    from autoplan.api.loop import prepare_tune_serving

    for target in (out_path, log):
        if target is not None:
            files.check_target(target)
    files.check_apart([("--out", out_path), ("--runs", log)], [job_file])
    outputs.not_stdout("--runs", log, "the runs log is a file to append to, not stdout")
    prepared = prepare_tune_serving(job_file, top=top_k, runs=log, workdir=workdir, checkpoint=checkpoint,
                                    health_timeout=health_timeout, timeout=timeout)
    if files.is_stdout(out_path):
        output.data_to_stderr()
    req = prepared.request
    for note in prepared.notes:
        output.err.print(f"autoplan: note: {note}", markup=False)
    with output.working(fmt.value, f"simulating deployments on {req.cluster.gpus} GPUs ..."):
        found = prepared.search()
    if not found.plans:
        output.err.print(f"autoplan: {found.why_none(req.slo)}", markup=False)
        raise typer.Exit(1)
    with ctrl_c as stopping, output.working(fmt.value, "tuning on local ...", lines=True) as told:
        def done(t: Any) -> None:
            o, m = t.outcome, t.outcome.measured
            what = (f"TTFT {m.ttft_ms.mean:.4g} ms, TPOT {m.tpot_ms.mean:.4g} ms measured "
                    f"({t.replica_prediction.ttft_ms.mean:.4g}, {t.replica_prediction.tpot_ms.mean:.4g} "
                    "predicted)" if m is not None else f"{o.status}: {o.reason}")
            line = f"trial done: {t.deployment.deployment.label()}: {what}"
            if output.interactive(fmt.value):
                output.err.print(f"autoplan: {line}", markup=False)
            else:
                told(line)

        result = prepared.run(told, found=found, stop=stopping.stopping, on_trial=done)
    if not result.trials and result.reason is not None:  # none the local runner can run
        for rank, plan, why in result.skipped:
            output.err.print(f"autoplan: searched deployment {rank} ({plan.deployment.label()}): {why}",
                             markup=False)
        output.err.print(f"autoplan: {result.reason}", markup=False)
        raise typer.Exit(1)
    best = result.best
    if out_path is not None and best is not None:
        files.write_text(out_path, result.best_yaml())
    if fmt is Format.json:
        output.emit_json(result.to_dict())
    else:
        _print_tuning(result, req, result.searched)
    if log is not None and result.trials and fmt is not Format.json:
        output.err.print(f"appended {len(result.trials)} runs to {files.name(log)}")
    if out_path is not None and best is not None and not files.is_stdout(out_path):
        output.err.print(f"wrote the best measured deployment to {files.name(out_path)}")
    if best is None:
        raise typer.Exit(1)


def _print_tuning(result: Any, req: Any, searched: int) -> None:
    from rich.table import Table

    slo = req.slo
    by = "goodput" if slo.any else "output tokens/s"
    title = escape(f"{req.model.name} on {req.cluster.gpus} x {req.cluster.device.name}, {req.engine.value}: "
                   f"measured on local (one replica each, at its share of the traffic), by measured {by}")
    table = Table(title=title, title_justify="left")
    for col in ("#", "deployment", "searched", "client", "TTFT ms pred", "TTFT ms meas", "TPOT ms pred",
                "TPOT ms meas", "goodput r/s pred", "goodput r/s meas", "tok/s pred", "tok/s meas", "status"):
        table.add_column(col, justify="left" if col in ("deployment", "client", "status") else "right")
    for i, t in enumerate(result.trials, start=1):
        o, m, p = t.outcome, t.outcome.measured, t.replica_prediction
        table.add_row(str(i), escape(t.deployment.deployment.label()), str(t.searched_rank), t.client,
                      ms(p.ttft_ms.mean), ms(None if m is None else m.ttft_ms.mean), ms(p.tpot_ms.mean),
                      ms(None if m is None else m.tpot_ms.mean), f"{t.predicted_goodput_rps:.3g}",
                      "-" if t.measured_goodput_rps is None else f"{t.measured_goodput_rps:.3g}",
                      f"{t.predicted_tokens_per_s:,.0f}",
                      "-" if t.measured_tokens_per_s is None else f"{t.measured_tokens_per_s:,.0f}",
                      o.status if o.status == "ok" else escape(f"{o.status}: {o.reason}"))
    output.out.print(table)
    if result.best is not None:
        b = result.trials[result.best]
        output.out.print(escape(f"best measured: {b.deployment.deployment.label()} (searched rank "
                                f"{b.searched_rank} of {searched}); the trials' logs and results are in "
                                f"{b.folder.parent if b.folder is not None else '-'}"))
    else:
        output.out.print("no deployment measured")
    for rank, plan, why in result.skipped:
        output.err.print(f"note: skipped searched deployment {rank} ({plan.deployment.label()}): {why}",
                         markup=False)
    if result.interrupted:
        output.err.print("note: interrupted: the trials above are what was measured", markup=False)
    for t in result.trials:
        for line in t.outcome.notes:
            output.err.print(f"note: {t.deployment.deployment.label()}: {line}", markup=False)
