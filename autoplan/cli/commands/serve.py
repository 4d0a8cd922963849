"""``autoplan serve``: rank serving deployments under traffic and latency SLOs.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from autoplan.api.outputs import check_folder
from autoplan.cli import files, output, render_serving
from autoplan.cli.app import app
from autoplan.cli.options import (
    MAX_TOP,
    CalibrationOpt,
    ClusterOpt,
    Format,
    FormatOpt,
    ModelOpt,
    objective_choices,
)
from autoplan.serving.engine import Engine


@app.command()
def serve(
    ctx: typer.Context,
    job_file: Annotated[Path | None, typer.Argument(
        metavar="JOB.yaml", help="Serving job file: model, cluster, gpus, engine, workload, slo "
                                 "(options override it).")] = None,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    gpus: Annotated[str | None, typer.Option(
        "--gpus", "-n", help="GPUs to deploy on; several to compare: 8,16,32, or 8..64 (doubling).")] = None,
    input_len: Annotated[int | None, typer.Option("--input-len", help="Prompt tokens per request.")] = None,
    output_len: Annotated[int | None, typer.Option(
        "--output-len", help="Generated tokens per request.")] = None,
    rate: Annotated[float | None, typer.Option("--rate", help="Poisson arrivals, requests/s.")] = None,
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", help="Closed loop: this many requests in flight.")] = None,
    offline: Annotated[bool, typer.Option(
        "--offline", help="Every request queued at once (throughput).")] = False,
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="Recorded requests: a CSV file with columns arrival_s, input_len and "
                        "output_len (other columns ignored); replaces --rate and the lengths.")] = None,
    requests: Annotated[int | None, typer.Option(
        "--requests", help="Requests in the workload (default 1000; with a trace, its first N).")] = None,
    ttft_slo: Annotated[float | None, typer.Option(
        "--ttft-slo", help="Time to first token SLO, ms (at --percentile).")] = None,
    tpot_slo: Annotated[float | None, typer.Option(
        "--tpot-slo", help="Time per output token SLO, ms (at --percentile).")] = None,
    percentile: Annotated[float | None, typer.Option(
        "--percentile", help="SLO percentile (default 99).")] = None,
    engine: Annotated[str | None, typer.Option(
        "--engine", help=f"Serving engine: {' | '.join(e.value for e in Engine)} (a registered "
                         "engine's name; default vllm).")] = None,
    engine_version: Annotated[str | None, typer.Option(
        "--engine-version", help="The engine's release, such as 0.19.0 or 1.2.0rc6 (default: the newest "
                                 "one fitted): the plans name it and their launch scripts pin it.")] = None,
    weights: Annotated[str, typer.Option(
        "--weights", help="Weight precisions to try, comma-separated: bf16, fp16, fp8, int8, int4, fp4.")
    ] = "bf16",
    kv_cache: Annotated[str, typer.Option(
        "--kv-cache", help="KV cache precisions to try, comma-separated: bf16, fp16, fp8.")] = "bf16",
    price: Annotated[float | None, typer.Option(
        "--price", help="USD per GPU-hour for the cost per million tokens (default: the device "
                        "file's price_per_gpu_hour).")] = None,
    disaggregated: Annotated[bool, typer.Option(
        "--disaggregated", help="Also try prefill/decode disaggregated deployments: splits of the "
                                "GPUs into a prefill pool and a decode pool (every one on a small "
                                "cluster, prefill shares of k/16 on a large one).")] = False,
    prefix_share: Annotated[float | None, typer.Option(
        "--prefix-share", help="Share of the mean prompt that is a prefix shared across requests "
                               "(system prompt, chat history): prefix caching skips it in prefill "
                               "and holds it once in the KV cache.")] = None,
    prefix_groups: Annotated[int | None, typer.Option(
        "--prefix-groups", help="Distinct shared prefixes the requests fall into (default 1).")] = None,
    speculative: Annotated[str | None, typer.Option(
        "--speculative", help="Also try every deployment with speculative decoding: draft, eagle, mtp "
                              "(the model's own module) or ngram; with --spec-tokens and "
                              "--acceptance-length or --acceptance-rate.")] = None,
    spec_tokens: Annotated[int | None, typer.Option(
        "--spec-tokens", help="Tokens proposed per decode step.")] = None,
    acceptance_length: Annotated[float | None, typer.Option(
        "--acceptance-length", help="Mean tokens a verify step yields (the accepted proposals and "
                                    "the target's own token).")] = None,
    acceptance_rate: Annotated[float | None, typer.Option(
        "--acceptance-rate", help="Probability each proposed token is accepted (independently).")] = None,
    draft_model: Annotated[str | None, typer.Option(
        "--draft-model", help="The draft model of --speculative draft (built-in, descriptor or "
                              "config.json).")] = None,
    objective: Annotated[str | None, typer.Option(
        "--objective", metavar="<goodput|cost|energy>",
        callback=objective_choices("serve", ("goodput", "cost", "energy")),
        help="With several --gpus: choose the count by goodput per GPU (goodput, the default), "
             "dollars per million tokens (cost) or energy per million tokens (energy). (search's "
             "time is a training objective: docs/CLI.md.)")] = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", parser=files.out_path, metavar="<path>",
        help="Draw the front, tokens/s per GPU against tokens/s per user, to FILE.svg, or FILE.png "
             "(the png extra: matplotlib).")] = None,
    traffic: Annotated[Path | None, typer.Option(
        "--traffic", metavar="FILE.csv",
        help="Plan for traffic that changes over the day: a CSV of periods (start, rate_rps; "
             "optional input_len, output_len, concurrency, end): one replica shape, the replicas "
             "each period needs, static against scaled GPU-hours, energy and cost, the autoscaler's "
             "thresholds; replaces --rate (--gpus, or the job's gpus: the most GPUs it may scale "
             "to).")] = None,
    autoscale_out: Annotated[Path | None, typer.Option(
        "--autoscale-out", parser=files.out_path, metavar="<dir>",
        help="With --traffic: write the autoscaler settings to this folder (made if need be): "
             "hpa.yaml (HorizontalPodAutoscaler), keda-scaledobject.yaml (KEDA) and "
             "dynamo-planner.yaml (Dynamo planner).")] = None,
    top: Annotated[int | None, typer.Option(
        "--top", "-k", min=1, max=MAX_TOP, help="How many plans to show (default 10).")] = None,
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Write the best plan here.", parser=files.out_path, metavar="<path>")] = None,
    calibration: CalibrationOpt = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress on stderr (a spinner on a terminal, lines elsewhere).")] = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """Rank serving deployments under a workload: exit 0 one meets the SLO, 1 none fits or
    meets it, 2 bad input."""
    from autoplan.api.serve import check_autoscale_out, check_traffic_options, prepare_serve

    if quiet:
        output.quiet()
    if traffic is not None:
        check_traffic_options((("--rate", rate), ("--concurrency", concurrency),
                               ("--offline", offline or None), ("--trace", trace),
                               ("--disaggregated", disaggregated or None),
                               ("--objective", objective), ("--plot", plot), ("--top", top)))
    check_autoscale_out(autoscale_out, traffic)
    if plot is not None:
        files.check_plot(plot)
    outputs = [("--out", out_path), ("--plot", plot), ("--autoscale-out", autoscale_out)]
    if out_path is not None:
        files.check_target(out_path)
        if files.is_stdout(out_path):
            output.data_to_stderr()
    if autoscale_out is not None:
        _check_autoscale_dir(autoscale_out)
    files.check_apart([(flag, path) for flag, path in outputs if path is not None],
                      [job_file, traffic])
    prepared = prepare_serve(
        job_file, model=model, cluster=cluster, gpus=gpus, input_len=input_len, output_len=output_len,
        rate=rate, concurrency=concurrency, offline=offline, trace=trace, requests=requests,
        ttft_slo=ttft_slo, tpot_slo=tpot_slo, percentile=percentile, engine=engine,
        engine_version=engine_version,
        weights=weights, kv_cache=kv_cache, price=price, disaggregated=disaggregated,
        prefix_share=prefix_share, prefix_groups=prefix_groups, speculative=speculative,
        spec_tokens=spec_tokens, acceptance_length=acceptance_length, acceptance_rate=acceptance_rate,
        draft_model=draft_model, objective=objective, traffic=traffic, top=top, calibration=calibration)
    if prepared.calibration is not None:  # the tables too are drawn with its constants
        from autoplan.serving.calibration import applied

        ctx.with_resource(applied(prepared.calibration))
    for note in prepared.notes:
        output.err.print(f"autoplan: note: {note}", markup=False)
    if traffic is not None:
        _serve_traffic(prepared, traffic, autoscale_out, out_path, fmt)
        return
    if prepared.sweep:
        _serve_sweep(prepared, plot, out_path, fmt)
        return
    req = prepared.request
    c = req.cluster
    where = (f"{req.pools.gpus} GPUs in {len(req.pools.pools)} pools" if req.pools is not None
             else f"{c.gpus} GPUs")
    with output.working(fmt.value, f"simulating deployments on {where} ..."):
        result = prepared.run()
    search = result.search
    shown = result.plans
    if out_path is not None and shown:
        _write_serving_plan(out_path, result)
    if fmt is Format.json:
        output.emit_json(result.to_dict())
    else:
        workload = req.workload
        where = (" + ".join(f"{p.gpus} x {p.device.name} ({p.name})" for p in req.pools.pools)
                 + f" of {req.pools.name}" if req.pools is not None
                 else f"{c.gpus} x {c.device.name} ({c.name})")
        title = escape(f"{req.model.name} on {where}, {_engine_label(req)}, "
                       f"{workload.input_len.mean:g} in / {workload.output_len.mean:g} out, "
                       f"{workload.arrival.label()}"
                       + (f", {workload.prefix.label()}" if workload.prefix is not None else ""))
        output.out.print(render_serving.serving_table(shown, req.slo, title))
        output.out.print(render_serving.serving_front_table(search.front))
        output.out.print(escape(
            f"deployments: {search.evaluated} simulated, {search.not_fitting} leave no room for "
            "the KV cache; TTFT/TPOT over the simulated requests of one scheduler "
            "(autoplan/serving/simulate.py)"))
        if shown:
            for line in render_serving.evidence_lines(shown[0].prediction, "#1: "):
                output.out.print(line)
    if out_path is not None and shown and not files.is_stdout(out_path):
        output.err.print(f"wrote the best plan to {files.name(out_path)}")
    if plot is not None and search.plans:
        _write_serving_front(plot, result)
        output.err.print(f"wrote the front to {files.name(plot)}")
    if not result.ok:
        output.err.print(f"autoplan: {result.reason}", markup=False)
        raise typer.Exit(1)


def _serve_traffic(prepared: Any, traffic: Path, autoscale_out: Path | None, out_path: Path | None,
                   fmt: Format) -> None:
    """``serve --traffic FILE.csv``: one replica shape for the day, the replicas each period
    needs, static against scaled provisioning, the autoscaler's thresholds
    (autoplan.serving.traffic_plan); ``--out`` the plan with its ``autoscale`` block,
    ``--autoscale-out`` the autoscalers' settings (autoplan.export.autoscale)."""
    req, table = prepared.request, prepared.traffic
    m, c = req.model, req.base_cluster
    with output.working(fmt.value, f"planning {len(table.periods)} periods of {files.name(traffic)} ..."):
        result = prepared.run()
    tp = result.traffic
    if tp is None:
        if fmt is Format.json:
            output.emit_json(result.to_dict())
        output.err.print(f"autoplan: {result.reason}", markup=False)
        raise typer.Exit(1)
    if out_path is not None:
        _write_serving_plan(out_path, result)
    written: dict[str, str] = {}
    if autoscale_out is not None:
        from autoplan.export.autoscale import autoscale_files

        written, notes = autoscale_files(tp.plan)
        directory = autoscale_out.expanduser()
        for name in written:
            files.check_target(directory / name)
        for name, text in written.items():
            files.write_text(directory / name, text)
        for note in notes:
            output.err.print(f"autoplan: note: {note}", markup=False)
    if fmt is Format.json:
        output.emit_json(result.to_dict())
    else:
        slo = req.slo
        shape = tp.shape
        d = dataclasses.replace(shape.deployment, replicas=1)
        seqs = d.max_num_seqs
        q = f"p{slo.percentile:g}"
        terms = [f"{name} {q} {ms:g} ms" for name, ms in (("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms))
                 if ms is not None]
        title = escape(f"{m.name} on {c.device.name} ({c.name}), {_engine_label(req)}, SLO "
                       f"{', '.join(terms) or 'none'}: {files.name(traffic)}, {len(table.periods)} periods "
                       f"over {table.span_h:g} h")
        output.out.print(render_serving.traffic_table(tp, title))
        output.out.print(render_serving.traffic_totals_table(tp))
        output.out.print(escape(
            f"replica: {d.label()} ({d.gpus} GPU{'s' * (d.gpus > 1)}, max seqs {seqs or 'default'}), "
            f"{shape.rate_rps:,.3g} req/s at {shape.lengths[0]:,.0f} in / {shape.lengths[1]:,.0f} out "
            f"meeting the SLO: the most per GPU of {tp.shapes_tried} shapes tried ({tp.evaluations} "
            "simulations; autoplan/serving/traffic_plan.py)"))
        for line in render_serving.autoscale_lines(tp):
            output.out.print(escape(line))
        energy = c.device.power_load_W is not None and c.device.power_idle_W is not None
        output.out.print(escape(
            "energy: " + (f"board power between {c.device.power_idle_W:g} W idle and "
                          f"{c.device.power_load_W:g} W by the share of each period the GPUs run "
                          f"iterations, PUE {c.pue:g} (an upper estimate)" if energy
                          else f"{c.device.name}'s file gives no power_W") + "; cost: " +
            (f"${tp.price_per_gpu_hour:g}/GPU-hour" if tp.price_per_gpu_hour is not None
             else "no price (give --price)")))
    if out_path is not None and not files.is_stdout(out_path):
        output.err.print(f"wrote the plan for the busiest period with its autoscale block to "
                         f"{files.name(out_path)}")
    if written:
        output.err.print(f"wrote {', '.join(written)} to {files.name(autoscale_out or Path())}")
    if not result.ok:
        output.err.print(f"autoplan: {result.reason}", markup=False)
        raise typer.Exit(1)


def _check_autoscale_dir(path: Path) -> None:
    """``--autoscale-out DIR``: a folder (made if need be), refused before any work."""
    check_folder("--autoscale-out", path, "writes a folder of files, not stdout")


def _engine_label(req: Any) -> str:
    """The engine as the tables name it: with its release where one was given."""
    return req.engine.value + (f" {req.engine_version}" if req.engine_version is not None else "")


def _write_serving_plan(out_path: Path, result: Any) -> None:
    """The best serving deployment as its plan file; a trace is named relative to the plan
    file, so the two can move together."""
    here = None if files.is_stdout(out_path) else str(Path(os.path.abspath(out_path)).parent)
    files.write_text(out_path, result.plan_yaml(here))


def _write_serving_front(plot: Path, result: Any) -> None:
    """``serve --plot``: the serving front as an SVG, or a PNG for a .png file."""
    if files.is_png(plot):
        from autoplan.api.png import serving_front_png

        points, front, chosen, label_gpus, title = result.front_parts()
        files.write_bytes(plot, serving_front_png(points, front, chosen, title, label_gpus=label_gpus))
    else:
        files.write_text(plot, result.front_svg())


def _serve_sweep(prepared: Any, plot: Path | None, out_path: Path | None, fmt: Format) -> None:
    """``serve --gpus 8,16,32``: the serve search at each count, the count the objective
    prefers, the front over all of them (autoplan.serving.sweep)."""
    req, counts = prepared.request, prepared.counts
    m, c = req.model, req.base_cluster
    with output.working(fmt.value, f"simulating deployments on {', '.join(map(str, counts))} GPUs ...",
                        lines=True) as tell:
        result = prepared.run(tell)
    sweep = result.sweep
    best = None if sweep.result.chosen is None else sweep.result.chosen.best
    if out_path is not None and best is not None:  # checked by serve before the sweep ran
        here = None if files.is_stdout(out_path) else str(Path(os.path.abspath(out_path)).parent)
        from autoplan.api.search import plan_yaml
        from autoplan.serving.evaluate import serving_document

        files.write_text(out_path, plan_yaml(serving_document(best.plan, best.prediction, here)))
    if fmt is Format.json:
        output.emit_json(result.to_dict())
    else:
        output.out.print(render_serving.serving_sweep_table(list(sweep.rows), sweep.objective.value, escape(
            f"{m.name} on {c.device.name} ({c.name}), {_engine_label(req)}, "
            f"{req.workload.input_len.mean:g} in / "
            f"{req.workload.output_len.mean:g} out, {req.workload.arrival.label()}: by GPU count")))
        output.out.print(render_serving.serving_front_table(sweep.result.front, show_gpus=True))
    if plot is not None and any(cr.result.plans for cr in sweep.result.counts):
        _write_serving_front(plot, result)
        output.err.print(f"wrote the front to {files.name(plot)}")
    if out_path is not None and best is not None and not files.is_stdout(out_path):
        output.err.print(f"wrote the chosen plan to {files.name(out_path)}")
    if not result.ok:
        why = ("no GPU count's best deployment meets the SLO" if best is not None
               else "no deployment fits at any GPU count")
        output.err.print(f"autoplan: {why}", markup=False)
        raise typer.Exit(1)

