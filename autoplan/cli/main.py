"""`autoplan`: thin commands that parse, call the library and render."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from autoplan.api.search import OTHER_OBJECTIVE as SEARCH_OTHER
from autoplan.api.serve import OTHER_OBJECTIVE as SERVE_OTHER
from autoplan.cli import files, output, render
from autoplan.cli.app import (
    MAX_TOP,
    ClusterOpt,
    Device,
    DtypeOpt,
    Format,
    FormatOpt,
    GlobalBatchOpt,
    JobFileArg,
    LauncherOpt,
    ModelOpt,
    ProfileOpt,
    SeqLenOpt,
    StackOpt,
    _yaml,
    app,
)
from autoplan.errors import AutoplanError, InputError, Problem
from autoplan.plan import Plan, Prediction
from autoplan.serving.engine import Engine
from autoplan.units import GiB, MiB
from autoplan.whatif.economics import Objective

if TYPE_CHECKING:
    from autoplan.bench.validate import Validation
    from autoplan.measured.profile import Profile

# The objectives' one vocabulary (docs/CLI.md): cost and energy mean the same to both commands
# (dollars, energy per unit of work); the third is each command's own measure of speed, with
# no meaning to the other: days to train a run (search's time) is not goodput per GPU of a
# deployment (serve's goodput), which ranks counts as cost does at one price
_OTHER_OBJECTIVE = {"search": {"goodput": SEARCH_OTHER}, "serve": {"time": SERVE_OTHER}}


def _objective_choices(command: str, names: tuple[str, ...]) -> Any:
    """The ``--objective`` option's check, a usage error as a choice's is (``FLAG:
    expected one of ..., got ...``, then where the help is); the other command's word
    refused with what it means there and the word here."""
    def check(value: str | None) -> str | None:
        if value is None or value in names:
            return value
        exc = typer.BadParameter(f"expected one of {', '.join(names)}")
        hint = _OTHER_OBJECTIVE[command].get(value)
        if hint:
            exc.autoplan_hint = hint  # type: ignore[attr-defined]
        raise exc
    return check


@app.command()
def search(
    job_file: JobFileArg = None,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    gpus: Annotated[str | None, typer.Option(
        "--gpus", "-n", help="Total GPUs; several to compare: 64,128,256, or 64..1024 (doubling).")] = None,
    global_batch: GlobalBatchOpt = None,
    seq_len: SeqLenOpt = None,
    dtype: DtypeOpt = None,
    space: Annotated[str | None, typer.Option(
        "--space", help="Search space: launchable (the default: plans some launcher runs), any "
                        "(launcher-free, for what-if questions; its former name default), megatron, "
                        "deepspeed, torchtitan, fsdp, or a path.")] = None,
    launcher: LauncherOpt = None,
    export_dir: Annotated[Path | None, typer.Option(
        "--export", metavar="<dir>", parser=files.out_path,
        help="Write the best plan's launch files to DIR (as export --to its first launcher, or "
             "--launcher's), with the plan as plan.yaml.")] = None,
    moe_imbalance: Annotated[float | None, typer.Option(
        "--moe-imbalance", help="MoE: tokens of the busiest expert rank over the mean "
                                "(default 1.25, Switch Transformer's capacity factor).")] = None,
    top: Annotated[int, typer.Option("--top", "-k", min=1, max=MAX_TOP, help="How many plans to show.")] = 10,
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Write the best plan here.", parser=files.out_path, metavar="<path>")] = None,
    profile: ProfileOpt = None,
    stack: StackOpt = None,
    min_headroom: Annotated[float | None, typer.Option(
        "--min-headroom", min=0.0, help="GiB every plan must leave free on each GPU beyond its "
        "predicted peak (default: 5% of the device, for the allocator's fragmentation).")] = None,
    train_tokens: Annotated[float | None, typer.Option(
        "--train-tokens", help="Tokens to train on (e.g. 15e12): adds days, GPU-hours, cost and "
                               "energy per GPU count, and their Pareto front.")] = None,
    objective_name: Annotated[str | None, typer.Option(
        "--objective", metavar="<time|cost|energy>",
        callback=_objective_choices("search", tuple(o.value for o in Objective)),
        help="With --train-tokens: rank GPU counts by days to train (time), GPU-hours x price "
             "(cost) or energy. Default: time. (serve's goodput is a serving objective: "
             "docs/CLI.md.)")] = None,
    price: Annotated[float | None, typer.Option(
        "--price", help="USD per GPU-hour (default: the device file's price_per_gpu_hour).")] = None,
    deadline: Annotated[float | None, typer.Option(
        "--deadline", help="With --train-tokens: keep plans that train within DAYS.")] = None,
    budget: Annotated[float | None, typer.Option(
        "--budget", help="With --train-tokens: keep plans that cost at most USD.")] = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", parser=files.out_path, metavar="<path>",
        help="With --train-tokens: draw the front (days against dollars) to FILE.svg, or FILE.png "
             "(the png extra: matplotlib).")] = None,
    no_offload: Annotated[bool, typer.Option(
        "--no-offload", help="Keep optimizer states and activations on the GPUs (the space "
                             "may otherwise offload them to host memory).")] = False,
    allow_bf16_states: Annotated[bool, typer.Option(
        "--allow-bf16-states", help="Also try bf16 gradient reduction and bf16 Adam moments "
                                    "(Megatron-Core's --grad-reduce-in-bf16 and precision-aware "
                                    "optimizer; the plan names them), where the launcher runs "
                                    "them.")] = False,
    recompute_modules: Annotated[str | None, typer.Option(
        "--recompute-modules", help="What selective recompute recomputes in this search, "
                                    "Megatron-Core's modules: e.g. moe_act,layernorm,mla_up_proj "
                                    "(default: the attention core).")] = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress on stderr (a spinner on a terminal, lines elsewhere).")] = False,
    async_checkpoint: Annotated[bool, typer.Option(
        "--async-checkpoint", help="With --train-tokens on a cluster that gives its failure rate "
                                   "and storage: checkpoints saved behind training (a copy to host "
                                   "memory stalls it), not synchronously.")] = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """Rank the plans that fit: exit 0 found, 1 none fits, 2 bad input."""
    from autoplan.api.search import prepare_search

    if quiet:
        output.quiet()
    for target in (out_path, plot):  # refused before the search, not after it
        if target is not None:
            files.check_target(target)
    if plot is not None:
        _check_image("--plot", plot)
    if export_dir is not None:
        _check_export_dir(export_dir)
    files.check_apart([("--out", out_path), ("--plot", plot), ("--export", export_dir)], [job_file])
    if files.is_stdout(out_path) and files.is_stdout(plot):
        raise InputError.single("--plot", "", "--out already writes to stdout ('-')")
    if files.is_stdout(out_path) or files.is_stdout(plot):
        output.data_to_stderr()
    prepared = prepare_search(
        job_file, model=model, cluster=cluster, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
        dtype=dtype, space=space, launcher=launcher, moe_imbalance=moe_imbalance, top=top, profile=profile,
        stack=stack, min_headroom=min_headroom, train_tokens=train_tokens, objective=objective_name,
        price=price, deadline=deadline, budget=budget, no_offload=no_offload,
        allow_bf16_states=allow_bf16_states, recompute_modules=recompute_modules,
        async_checkpoint=async_checkpoint)
    if plot is not None and not prepared.sweep:
        raise InputError.single("--plot", "", "needs --train-tokens (the run it prices)")
    if export_dir is not None and (prepared.sweep or prepared.pooled):
        raise InputError.single("--export", "", "writes the best plan of one search: save a plan "
                                "of the sweep or the pools with --out and `autoplan export` it")
    for line in prepared.notes:
        output.err.print(f"autoplan: note: {line}", markup=False)
    req = prepared.request
    if req.pools is not None:
        _search_pooled(prepared, out_path, fmt, min_headroom)
        return
    if prepared.sweep:
        _search_whatif(prepared, out_path, fmt, plot)
        return
    with output.working(fmt.value, f"searching {req.space.name} space on {req.cluster.gpus} GPUs ..."):
        result = prepared.run()
    headroom = result.headroom_bytes
    assert headroom is not None
    if not result.ok:
        if fmt is Format.json:
            output.emit_json(result.to_dict())
        else:
            output.out.print(render.stats_text(result.stats))
        output.err.print(f"autoplan: {result.reason}", markup=False)
        if headroom > 0 and result.closest is not None:
            output.err.print(f"autoplan: plans must leave {headroom / GiB:.1f} GiB free per GPU "
                             "(--min-headroom 0 allows up to the device's memory)", markup=False)
        raise typer.Exit(1)
    runs_on = [r.launchers or () for r in result.plans]
    best = result.plans[0]
    if export_dir is not None:
        _export_best(best.plan, best.to_dict(), runs_on[0], launcher, export_dir)
    if out_path is not None:
        files.write_text(out_path, _yaml(best.to_dict()))
    if fmt is Format.json:
        output.emit_json(result.to_dict())
    else:
        gap = result.launcher_free
        # names come from user files: escape them, or rich reads "[...]" as markup
        title = escape(f"{req.model.name} on {req.cluster.gpus} x {req.cluster.device.name} "
                       f"({req.cluster.name}), global batch {req.job.global_batch} x "
                       f"{req.job.seq_len} tokens, {req.job.dtype.value}, {render.space_words(req.space)}")
        any_space = req.space.launcher == "any"
        output.out.print(render.plans_table([(r.plan, r.prediction) for r in result.plans], title,
                                            launchers=None if any_space else runs_on))
        if any_space:  # a space of every launcher's choices: say whose each is
            output.out.print(escape(render.launchers_line(runs_on)))
        if gap is not None:
            output.out.print(escape(render.gap_line(gap, gap.faster_by)))
        hint = render.uneven_hint(best.plan) if req.space.parts else None
        if hint is not None:
            output.out.print(escape(hint))
        output.out.print(render.stats_text(result.stats))
        output.out.print(render.headroom_note(headroom, min_headroom is None))
        if req.profile is not None:
            output.out.print(escape(render.profile_text(req.profile.source)))
        if out_path is not None:
            output.err.print(f"wrote the best plan to {files.name(out_path)}")


def _check_export_dir(path: Path) -> None:
    """``search --export DIR``: a folder (made if need be), refused before the search."""
    if files.is_stdout(path):
        raise InputError.single("--export", "", "writes a folder of launch files, not stdout")
    path = path.expanduser()
    if path.exists() and not path.is_dir():
        raise InputError.single("--export", "", f"{files.name(path)} is not a directory")


def _export_best(plan: Plan, doc: dict[str, Any], runs_on: Sequence[str], launcher: str | None,
                 directory: Path) -> None:
    """The best plan's launch files (``export --to`` its first launcher, or ``--launcher``)
    and the plan itself (``plan.yaml``) into ``directory``; every target checked first."""
    from autoplan.export import Target
    from autoplan.export import export as run_export

    name = launcher or (runs_on[0] if runs_on else None)
    if name is None:
        raise InputError.single("--export", "", "no launcher runs the best plan as it is "
                                                "(--space any): search without --space")
    written = {**run_export(plan, Target(name), "the best plan"), "plan.yaml": _yaml(doc)}
    directory = directory.expanduser()
    paths = {n: directory / n for n in written}
    for path in paths.values():
        files.check_target(path)
    for n, path in paths.items():
        files.write_text(path, written[n], executable=n.endswith((".sh", ".sbatch")))
    output.err.print(f"wrote the best plan's {name} launch files to {escape(str(directory))}: "
                     f"{', '.join(written)}")


def _search_pooled(prepared: Any, out_path: Path | None, fmt: Format, min_headroom: float | None) -> None:
    """``search`` on a cluster of pools: plans across pools and on each alone, ranked
    together, and which pools the best leaves out (autoplan.search.pooled)."""
    req = prepared.request
    pools = req.pools
    with output.working(fmt.value, f"searching {req.space.name} space on {pools.gpus} GPUs in "
                        f"{len(pools.pools)} pools ...", lines=True) as tell:
        result = prepared.run(tell)
    assert result.pools is not None
    if not result.ok:
        if fmt is Format.json:
            output.emit_json(result.to_dict())
        else:
            output.out.print(render.stats_text(result.stats))
        output.err.print(f"autoplan: {result.pools.verdict}", markup=False)
        raise typer.Exit(1)
    runs_on = [r.launchers or () for r in result.plans]
    if out_path is not None:
        files.write_text(out_path, _yaml(result.plans[0].to_dict()))
    if fmt is Format.json:
        output.emit_json(result.to_dict())
    else:
        what = "; ".join(f"{p.name}: {p.gpus} x {p.device.name}" for p in pools.pools)
        title = escape(f"{req.model.name} on {pools.name} ({what}), global batch "
                       f"{req.job.global_batch} x {req.job.seq_len} tokens, "
                       f"{req.job.dtype.value}, {render.space_words(req.space)}")
        any_space = req.space.launcher == "any"
        output.out.print(render.plans_table([(r.plan, r.prediction) for r in result.plans], title,
                                            launchers=None if any_space else runs_on))
        if any_space:  # a space of every launcher's choices: say whose each is
            output.out.print(escape(render.launchers_line(runs_on)))
        output.out.print(render.stats_text(result.stats))
        output.out.print(escape(f"pools: {result.pools.verdict}"))
        if min_headroom is None:
            from autoplan.kernels.memory import DEFAULT_HEADROOM_FRACTION

            output.out.print(f"every plan leaves {DEFAULT_HEADROOM_FRACTION:.0%} of each GPU's "
                             "memory free, for the allocator's fragmentation (kernels/memory.py; "
                             "--min-headroom changes it)")
        else:
            output.out.print(render.headroom_note(min_headroom * GiB, False))
        if out_path is not None:
            output.err.print(f"wrote the best plan to {files.name(out_path)}")


def _search_whatif(prepared: Any, out_path: Path | None, fmt: Format, plot: Path | None) -> None:
    """``search --train-tokens``: a search per GPU count, ranked by the objective, with
    the Pareto front of days against dollars (autoplan.whatif)."""
    req = prepared.request
    device = req.cluster.device
    counts = [c.gpus for c in req.clusters]
    with output.working(fmt.value, f"searching {req.space.name} space on "
                        f"{', '.join(map(str, counts))} GPUs ...", lines=len(counts) > 1) as tell:
        result = prepared.run(tell)
    train = result.train
    assert train is not None
    sweep, limits, summary = train.sweep, train.limits, train.summary
    if not sweep.points:
        if fmt is Format.json:
            output.emit_json(result.to_dict())
        else:
            output.out.print(render.stats_text(result.stats))
        output.err.print(f"autoplan: {result.reason}", markup=False)
        raise typer.Exit(1)
    if plot is not None:
        if _is_png(plot):
            from autoplan.png import training_front_png

            files.write_bytes(plot, training_front_png(
                sweep.points, sweep.front, limits.chosen, train.labels, train.title(),
                deadline_days=summary["deadline_days"], budget_usd=summary["budget_usd"]))
        else:
            files.write_text(plot, train.front_svg())
    if result.plans and out_path is not None:
        files.write_text(out_path, result.plans[0].to_yaml())
    if fmt is Format.json:
        output.emit_json(result.to_dict())
    else:
        title = escape(f"{req.model.name} on {', '.join(map(str, counts))} x {device.name} "
                       f"({req.cluster.name}), global batch {req.job.global_batch} x "
                       f"{req.job.seq_len} tokens, {req.job.dtype.value}, space {req.space.name}, "
                       f"ranked by {summary['objective']} to train {summary['tokens']:.3g} "
                       f"tokens")
        if result.plans:
            output.out.print(render.plans_table([(p.plan, p.prediction) for p in result.plans], title,
                                                show_gpus=True))
        output.out.print(render.front_table(sweep.points, sweep.front, limits.kept, limits.chosen,
                                            train.labels, price_known=train.price_per_gpu_hour is not None))
        for n, r in zip(sweep.counts, sweep.results, strict=True):
            if not r.plans:
                output.out.print(escape(f"{n} GPUs: {r.why_none()}"))
        output.out.print(escape(render.economics_note(summary)))
        if limits.reason:
            output.out.print(escape(limits.reason))
        if out_path is not None and result.plans:
            output.err.print(f"wrote the best plan to {files.name(out_path)}")
        if plot is not None:
            output.err.print(f"wrote the front to {files.name(plot)}")
    if not result.plans:
        output.err.print(f"autoplan: {limits.reason}", markup=False)
        raise typer.Exit(1)


CalibrationOpt = Annotated[Path | None, typer.Option(
    "--calibration", metavar="<path>",
    help="A serving engine's constants calibrated on measured runs (autoplan calibrate --out of serving "
         "runs): plans of its engine release line are predicted with them.")]


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
        callback=_objective_choices("serve", ("goodput", "cost", "energy")),
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
    from autoplan.api.serve import check_traffic_options, prepare_serve

    if quiet:
        output.quiet()
    if traffic is not None:
        check_traffic_options((("--rate", rate), ("--concurrency", concurrency),
                               ("--offline", offline or None), ("--trace", trace),
                               ("--disaggregated", disaggregated or None),
                               ("--objective", objective), ("--plot", plot), ("--top", top)))
    elif autoscale_out is not None:
        raise InputError.single("--autoscale-out", "", "writes the autoscaler settings of a day's plan: "
                                                       "give --traffic FILE.csv")
    if plot is not None:
        _check_plot(plot)
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
        output.out.print(render.serving_table(shown, req.slo, title))
        output.out.print(render.serving_front_table(search.front))
        output.out.print(escape(
            f"deployments: {search.evaluated} simulated, {search.not_fitting} leave no room for "
            "the KV cache; TTFT/TPOT over the simulated requests of one scheduler "
            "(autoplan/serving/simulate.py)"))
        if shown:
            for line in render.evidence_lines(shown[0].prediction, "#1: "):
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
        output.out.print(render.traffic_table(tp, title))
        output.out.print(render.traffic_totals_table(tp))
        output.out.print(escape(
            f"replica: {d.label()} ({d.gpus} GPU{'s' * (d.gpus > 1)}, max seqs {seqs or 'default'}), "
            f"{shape.rate_rps:,.3g} req/s at {shape.lengths[0]:,.0f} in / {shape.lengths[1]:,.0f} out "
            f"meeting the SLO: the most per GPU of {tp.shapes_tried} shapes tried ({tp.evaluations} "
            "simulations; autoplan/serving/traffic_plan.py)"))
        for line in render.autoscale_lines(tp):
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
    if files.is_stdout(path):
        raise InputError.single("--autoscale-out", "", "writes a folder of files, not stdout")
    path = path.expanduser()
    if path.exists() and not path.is_dir():
        raise InputError.single("--autoscale-out", "", f"{files.name(path)} is not a directory")


def _engine_label(req: Any) -> str:
    """The engine as the tables name it: with its release where one was given."""
    return req.engine.value + (f" {req.engine_version}" if req.engine_version is not None else "")


def _write_serving_plan(out_path: Path, result: Any) -> None:
    """The best serving deployment as its plan file; a trace is named relative to the plan
    file, so the two can move together."""
    here = None if files.is_stdout(out_path) else str(Path(os.path.abspath(out_path)).parent)
    files.write_text(out_path, result.plan_yaml(here))


def _check_plot(plot: Path) -> None:
    if files.is_stdout(plot):
        raise InputError.single("--plot", "", "expected a file, got '-'")
    _check_image("--plot", plot)


def _is_png(path: Path) -> bool:
    return path.suffix.lower() == ".png"


def _check_image(flag: str, path: Path) -> None:
    """An image output (``--plot``, ``--timeline``), refused before any work: a .svg (or
    ``-``, SVG to stdout, where the command allows it), or a .png with matplotlib (the png
    extra) installed; a path the command can write."""
    if not files.is_stdout(path) and path.suffix.lower() not in (".svg", ".png"):
        raise InputError.single(flag, "", f"expected a .svg or .png file, got {path}")
    if _is_png(path):
        from autoplan.png import require_png

        try:
            require_png()
        except AutoplanError as exc:
            raise InputError.single(flag, "", str(exc)) from None
    files.check_target(path)


def _write_serving_front(plot: Path, result: Any) -> None:
    """``serve --plot``: the serving front as an SVG, or a PNG for a .png file."""
    if _is_png(plot):
        from autoplan.png import serving_front_png

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
        output.out.print(render.serving_sweep_table(list(sweep.rows), sweep.objective.value, escape(
            f"{m.name} on {c.device.name} ({c.name}), {_engine_label(req)}, "
            f"{req.workload.input_len.mean:g} in / "
            f"{req.workload.output_len.mean:g} out, {req.workload.arrival.label()}: by GPU count")))
        output.out.print(render.serving_front_table(sweep.result.front, show_gpus=True))
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
    kinds = {e.serving for e in result.plans}
    if fmt is Format.json and len(kinds) > 1:
        raise InputError.single("--format", "", "json takes training or serving plans, not both at once")
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
    for renderable in render.serving_evaluation(source, plan, pred, step):
        output.out.print(renderable)


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
        from autoplan.descriptors.strict import read_yaml
        from autoplan.serving.planfile import is_serving

        if files.is_stdout(timeline):
            raise InputError.single("--timeline", "", "expected a file, got '-'")
        _check_image("--timeline", timeline)
        if is_serving(read_yaml(plan_path)):
            raise InputError.single("--timeline", "", "draws a training pipeline's schedule; a serving "
                                                      "plan's batch over the run is shown in the output")
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


@app.command()
def models(fmt: FormatOpt = Format.table) -> None:
    """List the built-in models with their parameter counts."""
    from rich.table import Table

    from autoplan.descriptors.library import builtin_names, resolve_model

    rows = [resolve_model(name) for name in builtin_names("model")]
    if fmt is Format.json:
        output.emit_json({"models": [
            {**m.to_dict(), "params_total": m.params_total, "params_active": m.params_active}
            for m in rows]})
        return
    table = Table(title="built-in models", title_justify="left")
    for col in ("name", "layers", "hidden", "heads", "kv", "ffn", "vocab", "activation",
                "experts", "params total", "params active"):
        table.add_column(col, justify="left" if col in ("name", "activation", "experts") else "right")
    for m in rows:
        experts = ""
        if m.is_moe:
            shared = f"+{m.shared_experts}" if m.shared_experts else ""
            experts = f"{m.experts}{shared} top{m.top_k} x {m.expert_width}"
        table.add_row(m.name, str(m.layers), str(m.hidden), str(m.heads),
                      "mla" if m.is_mla else str(m.kv_heads),
                      str(m.ffn_hidden), str(m.vocab), m.activation.value, experts,
                      f"{m.params_total / 1e9:.2f}B", f"{m.params_active / 1e9:.2f}B")
    output.out.print(table)


@app.command()
def hardware(fmt: FormatOpt = Format.table) -> None:
    """List the built-in devices and clusters."""
    from rich.table import Table

    from autoplan.descriptors.library import builtin_names, resolve_cluster, resolve_device

    devices = [resolve_device(n, "profiles", "device") for n in builtin_names("device")]
    clusters = [resolve_cluster(n) for n in builtin_names("cluster")]
    if fmt is Format.json:
        output.emit_json({"devices": [d.to_dict() for d in devices],
                          "clusters": [c.to_dict() for c in clusters]})
        return
    dt = Table(title="built-in devices", title_justify="left")
    for col in ("name", "bf16 TFLOP/s", "fp8 TFLOP/s", "fp4 TFLOP/s", "memory GiB", "HBM GB/s"):
        dt.add_column(col, justify="left" if col == "name" else "right")
    for d in devices:
        fp8, fp4 = (f"{peak / 1e12:.0f}" if peak else "-" for peak in (d.peak_fp8_flops, d.peak_fp4_flops))
        dt.add_row(d.name, f"{d.peak_bf16_flops / 1e12:.0f}", fp8, fp4, f"{d.mem_GiB:.0f}",
                   f"{d.hbm_Bps / 1e9:.0f}")
    ct = Table(title="built-in clusters", title_justify="left")
    for col in ("name", "device", "GPUs/node", "NVLink domain", "intra GB/s", "inter GB/s",
                "host GB/s", "host GiB"):
        ct.add_column(col, justify="left" if col in ("name", "device") else "right")
    for c in clusters:  # host: each GPU's link to host memory, and the node's (offload)
        host = ((f"{round(c.host_link_Bps / 1e9, 1):g}", f"{c.host_mem_bytes / GiB:.0f}")
                if c.host_link_Bps is not None and c.host_mem_bytes is not None else ("-", "-"))
        ct.add_row(c.name, c.device.name, str(c.gpus_per_node), str(c.nvlink_domain),
                   f"{c.intra_node.bandwidth_Bps / 1e9:.0f}", f"{c.inter_node.bandwidth_Bps / 1e9:.0f}",
                   *host)
    output.out.print(dt)
    output.out.print(ct)


@app.command()
def bench(
    device: Annotated[Device | None, typer.Option(
        "--device", "-d", help="cpu or cuda (default: cuda when a GPU is visible).")] = None,
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", parser=files.out_path, metavar="<path>",
        help="Write the profile CSV here and print a summary "
                            "(default: the CSV to stdout).")] = None,
    preset: Annotated[str, typer.Option(
        "--preset", "-p", metavar="<tiny|default|full>",
        help="tiny (seconds), default (about a minute on a CPU), or full.")] = "default",
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="Models whose sharded layer shapes to measure: comma-separated built-in "
                              "names or descriptor paths (default: the preset's).")] = None,
    world: Annotated[int | None, typer.Option(
        "--world", "-w", help="Processes for the collectives; on CPU the kernels then run with "
                              "cpu_count // world torch threads, as each validate rank does "
                              "(OMP_NUM_THREADS overrides) (default: 2 on CPU, every GPU on CUDA; "
                              "under torchrun: the launched world).")] = None,
    descriptor: Annotated[str | None, typer.Option(
        "--descriptor", help="The built-in device this machine is (default: known from the CUDA "
                             "device name; none on CPU).")] = None,
    fit: Annotated[bool, typer.Option(
        "--fit", help="Fit the random-forest surrogate on the profile and print its cross-validated "
                      "error against the analytic model's.")] = False,
    profile_path: Annotated[Path | None, typer.Option(
        "--profile", help="Fit (--fit) or describe (--describe) this profile instead of measuring.")
    ] = None,
    fit_cluster: Annotated[str | None, typer.Option(
        "--cluster", "-c", help="--fit: the analytic baseline (default: the machine described from "
                                "the profile itself).")] = None,
    describe: Annotated[Path | None, typer.Option(
        "--describe", parser=files.out_path, metavar="<path>",
        help="Write a cluster descriptor of this machine fitted on the profile "
                           "(peaks, memory bandwidth, link bandwidth and latency).")] = None,
    name: Annotated[str, typer.Option("--name", help="--describe: the cluster's name.")] = "local-cpu",
) -> None:
    """Microbenchmarks on the local devices (GEMMs, attention, elementwise, collectives) as a
    profile CSV: exit 0, or 2 on bad input or when the benchmarks cannot run here."""
    import shlex
    import time

    from autoplan.bench import run as bench_run
    from autoplan.bench.presets import PRESET_NAMES
    from autoplan.descriptors.strict import name_problem, shown
    from autoplan.measured.profile import format_profile, parse_profile, read_profile

    if name_problem(name):  # written into the descriptor, which must load again
        raise InputError.single("--name", "", str(name_problem(name)))
    if preset not in PRESET_NAMES:  # refused before minutes of measuring, not after the imports
        raise InputError.single("--preset", "", f"expected one of {', '.join(PRESET_NAMES)}, "
                                                f"got {shown(preset)}")
    for target in (out_path, describe):  # refused before minutes of measuring
        if target is not None:
            files.check_target(target)
    files.check_apart([("--out", out_path), ("--describe", describe)], [profile_path])
    if profile_path is not None:
        if not (fit or describe):
            raise InputError.single("--profile", "", "give --fit or --describe with a profile to read")
        _fit_and_describe(read_profile(profile_path), fit, fit_cluster, describe, name)
        return
    models = [m.strip() for m in model.split(",") if m.strip()] if model is not None else None
    if models == []:
        raise InputError.single("--model", "", "expected one or more model names or paths")
    kwargs: dict[str, Any] = dict(device=None if device is None else device.value, preset=preset,
                                  models=models, world=world, descriptor=descriptor,
                                  command=shlex.join(["autoplan", *sys.argv[1:]]))
    started = time.monotonic()
    if output.interactive("table") and bench_run.is_writer():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), console=output.err, transient=True) as bar:
            task = bar.add_task("", total=None)
            meta, rows = bench_run.run_bench(
                **kwargs, progress=lambda done, total, label: bar.update(
                    task, completed=done, total=total, description=escape(label)))
    else:
        meta, rows = bench_run.run_bench(**kwargs)
    if not bench_run.is_writer():
        return  # torchrun: rank 0 writes
    text = format_profile(meta, rows)
    profile = parse_profile(text, str(out_path or "<stdout>"))  # what we write must read back
    if out_path is None or files.is_stdout(out_path):
        sys.stdout.write(text)
        return
    files.write_text(out_path, text)
    from rich.table import Table

    title = f"bench: {meta['device_name']} ({meta['device_kind']}, preset {meta['preset']})"
    table = Table(title=escape(title), title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for label, value in bench_run.summary(profile):
        table.add_row(escape(label), value)
    output.out.print(table)
    output.err.print(f"wrote {len(rows)} rows to {escape(str(out_path))} "
                     f"in {time.monotonic() - started:.0f} s")
    _fit_and_describe(profile, fit, fit_cluster, describe, name)


def _fit_and_describe(profile: Profile, fit: bool, cluster_ref: str | None, describe: Path | None,
                      name: str) -> None:
    """bench --fit: the surrogate's cross-validated error; --describe: the machine descriptor."""
    from rich.table import Table

    from autoplan.measured import surrogate
    from autoplan.measured.machine import cluster_yaml, describe_machine, physical_memory_bytes

    if fit:
        from autoplan.descriptors.library import resolve_cluster

        # default: the machine described from the profile; an engine profile (no elementwise
        # rows to describe one) the built-in node cluster of its device
        cluster = (resolve_cluster(cluster_ref) if cluster_ref is not None
                   else surrogate.builtin_baseline(profile))
        table = Table(title="surrogate fit: mean relative error per kind", title_justify="left",
                      caption=escape(f"{profile.source}; surrogate error cross-validated over "
                                     f"{surrogate.CV_FOLDS} folds"), caption_justify="left")
        for col in ("kind", "rows", "analytic", "surrogate"):
            table.add_column(col, justify="left" if col == "kind" else "right")
        report = surrogate.fit_report(profile, cluster)
        for row in report:
            table.add_row(row.kind, str(row.rows), f"{row.analytic_mape:.1%}",
                          "-" if row.surrogate_mape is None else f"{row.surrogate_mape:.1%}")
        output.out.print(table)
        output.out.print("analytic: the cost model's formula on " + escape(
            cluster.name if cluster else "the machine described from the profile")
            + "; surrogate: the same corrected by forests fitted without the row")
        for line in _fit_notes(profile, report):
            output.out.print(escape(line))
    if describe is not None:
        import shlex

        if profile.meta.get("device_kind") != "cpu":
            raise InputError.single("--describe", "", "describes a CPU profile's machine; for a GPU, use "
                                    "its built-in device with --profile on search and evaluate")
        ranks = surrogate.measured_machine(profile).gpus_per_node
        # each local process is one "GPU" and gets an equal share of the machine's memory
        cluster = describe_machine(profile, name=name, ranks_per_node=ranks,
                                   mem_bytes=physical_memory_bytes() / ranks,
                                   compute_dtype=surrogate.compute_dtype(profile))
        command = shlex.join(["autoplan", *sys.argv[1:]])
        files.write_text(describe, cluster_yaml(cluster, profile, command))
        output.err.print(f"wrote the machine descriptor to {escape(str(describe))}")


def _fit_notes(profile: Profile, report: list[Any]) -> list[str]:
    """What the fit table leaves unsaid: which of the profile's rows it counts, and where
    the surrogate does worse held out than the formula it corrects."""
    from autoplan.measured.surrogate import kind_rows

    counts = kind_rows(profile.rows)
    used = {r.kind: r.rows for r in report}
    unused = [f"{counts[k] - n} {k}" for k, n in used.items() if counts.get(k, 0) > n]
    others = [f"{n} {k}" for k, n in sorted(counts.items()) if k not in used]
    notes = [f"rows: {sum(used.values())} of the profile's {len(profile.rows)} train the surrogate"
             + (f"; {', '.join(unused)} rows are in a precision the analytic model prices no job in "
                f"(fp32; fp4 until autoplan names it: see autoplan/measured/surrogate.py, dtype rule)"
                if unused else "")
             + (f"; {', '.join(others)} rows fit the machine descriptor (--describe) only"
                if others else "")]
    for r in report:
        if r.surrogate_mape is not None and r.surrogate_mape > r.analytic_mape:
            notes.append(
                f"{r.kind}: the surrogate's held-out error ({r.surrogate_mape:.1%}) is worse than the "
                f"formula's ({r.analytic_mape:.1%}): its {r.rows} rows are too few or too scattered to "
                f"learn from; measure more (longer bench runs, more sizes) before trusting its "
                f"{r.kind} correction")
    return notes


def _export_choices() -> tuple[list[str], list[str]]:
    """export's --to (training targets, then serving engines) and slurm's --launcher, from
    the launcher registry (autoplan/export/*.py) and the engine registry."""
    from autoplan.export.launcher import Target, slurm_launchers

    return ([t.value for t in Target] + [e.value for e in Engine] + list(_deploy_targets()),
            [s.name for s in slurm_launchers()])


def _deploy_targets() -> tuple[str, ...]:
    """export's Kubernetes-style targets of a serving plan (autoplan.export.deploy)."""
    from autoplan.export.deploy import TARGETS

    return TARGETS


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


_TARGETS, _SLURM_RUNS = _export_choices()
# export's choices as its help shows them (tests/cli/test_vocabulary.py holds them to the registries)
EXPORT_TARGETS = "<" + "|".join(_TARGETS) + ">"
SLURM_LAUNCHERS = "<" + "|".join(_SLURM_RUNS) + ">"
_SERVING = [t for t in _TARGETS if t in {e.value for e in Engine} or t in _deploy_targets()]


@app.command("export")
def export_plan(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.yaml", help="A plan file.")],
    to: Annotated[str, typer.Option(
        "--to", "-t", metavar=EXPORT_TARGETS,
        help=f"Training plans: {_listed([t for t in _TARGETS if t not in _SERVING])}; serving plans: "
             f"{_listed(_SERVING)}.")],
    launcher: Annotated[str, typer.Option(
        "--launcher", metavar=SLURM_LAUNCHERS,
        help=f"slurm only: what the job runs ({_listed(_SLURM_RUNS)}).")] = "megatron",
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", parser=files.out_path, metavar="<path>",
        help="Write here (a directory when the target writes several files) "
                            "instead of printing.")] = None,
) -> None:
    """Write a launcher's configuration for a plan: exit 0, or 2 on bad input or a plan it can't run."""
    from autoplan.api.plans import export as run_export

    written = run_export(plan_path, to=to, launcher=launcher).files
    if out_path is None or files.is_stdout(out_path):
        for name, text in written.items():
            if len(written) > 1:
                sys.stdout.write(f"# ==> {name} <==\n")
            sys.stdout.write(text)
        return
    directory = files.named_as_directory(out_path)  # --out launch/: a folder, made if need be
    out_path = out_path.expanduser()
    if len(written) > 1 or directory or out_path.is_dir():
        paths = {name: out_path / name for name in written}
    else:
        paths = {name: out_path for name in written}
    for path in paths.values():
        files.check_target(path)  # every one before any is written
    files.check_apart([("--out", path) for path in paths.values()], [plan_path])
    for name, path in paths.items():
        files.write_text(path, written[name], executable=name.endswith((".sh", ".sbatch")))
        output.err.print(f"wrote {escape(str(path))}")


@app.command()
def validate(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.yaml", help="A plan file.")],
    device_kind: Annotated[Device, typer.Option(
        "--device", "-d", help="cpu: the plan's world size as local processes over gloo; cuda: one "
                               "rank's slice on one GPU (--slice implied).")] = Device.cpu,
    profile: Annotated[Path | None, typer.Option(
        "--profile", help="Profile CSV from `autoplan bench` on this machine: the prediction is made "
                          "on a descriptor fitted on it (default: the plan's own cluster, which must "
                          "describe this machine, e.g. examples/cpu/local-cpu.yaml).")] = None,
    cluster: Annotated[str | None, typer.Option(
        "--cluster", "-c", help="Built-in cluster name or descriptor path of this machine to predict "
                                "on, such as the one `autoplan bench --describe` wrote (default: the "
                                "plan's own).")] = None,
    slice_: Annotated[bool, typer.Option(
        "--slice", help="Run one rank's share of the plan (one pipeline stage at TP-sharded widths, "
                        "its ZeRO optimizer shard, no communication) and compare its compute time "
                        "and peak memory.")] = False,
    stage: Annotated[int | None, typer.Option(
        "--stage", min=0, help="--slice: the pipeline stage to run (default: the one with the highest "
                               "predicted peak memory).")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed steps (the median is compared).")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", min=1, help="Untimed steps before them.")] = 2,
    tolerance: Annotated[float | None, typer.Option(
        "--tolerance", min=0.0, help="Allowed relative error of the step time (slice: compute time); "
                                     "default 0.5 on cpu (eager PyTorch, no overlap on one core), "
                                     "0.3 on cuda.")] = None,
    memory_tolerance: Annotated[float, typer.Option(
        "--memory-tolerance", min=0.0, help=(
            "Allowed relative error of peak memory (on cpu a gap under 48 MiB also passes: "
            "eager PyTorch's own objects)."))] = 0.25,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1.0, help="Seconds the whole run may take before its processes are stopped.")
    ] = 900.0,
    max_step_s: Annotated[float, typer.Option(
        "--max-step-s", min=0.01, help="Make a plan predicted slower than this per step smaller "
                                       "(fewer layers, then narrower, then fewer microbatches).")] = 20.0,
    exact: Annotated[bool, typer.Option(
        "--exact", help="Run the plan as it is, even where it is larger than the machine's budget.")
    ] = False,
    runs: Annotated[Path | None, typer.Option(
        "--runs", parser=files.out_path, metavar="<path>",
        help="Append the run to this runs log (what ran, on this machine's descriptor; "
             "distributed runs only: a slice's compute time is not a step time).")] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Run the plan for real with torch's distributed engine and compare measured with predicted
    step time and peak memory: exit 0 within tolerance, 1 not, 2 bad input or a failed run."""
    from autoplan.bench.validate import Options
    from autoplan.bench.validate import validate as run_validation
    from autoplan.descriptors.strict import read_yaml
    from autoplan.planfile import read_plan

    device = device_kind.value
    if cluster is not None and profile is not None:
        raise InputError.single("--cluster", "", "give --cluster or --profile, not both")
    if runs is not None:
        from autoplan.cli.loop import appended_runs

        if slice_ or device == "cuda":
            raise InputError.single("--runs", "", "a slice's compute time is not a step time: "
                                                  "the runs log takes distributed runs (--device cpu)")
        files.check_target(runs)
        files.check_apart([("--runs", runs)], [plan_path])
        if files.is_stdout(runs):
            raise InputError.single("--runs", "", "the runs log is a file to append to, not stdout")
        appended_runs(runs, [])  # refused before the run, not after it
    plan = read_plan(read_yaml(plan_path), str(plan_path))
    options = Options(device=device, profile=profile, cluster=cluster, slice=slice_, stage=stage,
                      steps=steps, warmup=warmup, tolerance=tolerance, memory_tolerance=memory_tolerance,
                      timeout_s=timeout, max_step_s=max_step_s, fit=not exact)
    what = "one rank's slice" if slice_ or device == "cuda" else f"{plan.layout.gpus} processes"
    with output.working(fmt.value, f"validating {plan_path}: {what} on {device} ..."):
        result = run_validation(plan, str(plan_path), options)
    if runs is not None:
        import datetime

        from autoplan.cli.loop import appended_runs
        from autoplan.tune.runs import Run

        files.write_text(runs, appended_runs(runs, [Run(
            plan=result.plan, measured_step_time_s=result.measured_time_s,
            measured_peak_gib=result.measured_peak_bytes / GiB,
            predicted_step_time_s=result.predicted_time_s,
            predicted_peak_gib=result.predicted_peak_bytes / GiB, source="validate", runner="local",
            time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            steps=len(result.step_times_s))]))
    if fmt is Format.json:
        output.emit_json(result.to_dict())
    else:
        _print_validation(result)
    if runs is not None:
        output.err.print(f"appended the run to {files.name(runs)}")
    if not result.within:
        raise typer.Exit(1)


def _print_validation(result: Validation) -> None:
    """A validation for people: what ran, measured against predicted, per rank, notes."""
    import statistics

    from rich.table import Table

    plan, lay = result.plan, result.plan.layout
    degrees = [("dp", lay.dp), ("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp), ("ep", lay.ep),
               ("vpp", lay.vpp)] + ([("etp", lay.etp)] if lay.etp != lay.tp else [])
    shown = ", ".join(f"{k}={v}" for k, v in degrees if v != 1 or k in ("dp", "tp", "pp"))
    output.out.print(f"[bold]{escape(result.source)}[/bold]: " + escape(
        f"{plan.model.name} ({plan.model.layers} layers, hidden {plan.model.hidden}), "
        f"{shown}, {plan.schedule.value}, zero {int(plan.zero)}, {plan.num_microbatches} microbatches "
        f"of {plan.micro_batch} x {plan.job.seq_len}, {result.mode} on {result.device}"
        + (f", stage {result.stage}" if result.stage is not None else "")))
    output.out.print(escape(f"predicted on {result.descriptor}"))
    what = "step time" if result.mode == "distributed" else "compute time (fwd+bwd)"
    table = Table(title="measured against predicted", title_justify="left")
    for col in ("", "measured", "predicted", "ratio", "tolerance", ""):
        table.add_column(col, justify="left" if col == "" else "right")
    lo, hi = result.spread
    table.add_row(what, f"{result.measured_time_s:.3f} s", f"{result.predicted_time_s:.3f} s",
                  f"{result.time_ratio:.2f}", f"±{result.time_tolerance:.0%}",
                  "[green]ok[/green]" if result.time_within else "[red]outside[/red]")
    table.add_row("peak memory", f"{result.measured_peak_bytes / GiB:.3f} GiB",
                  f"{result.predicted_peak_bytes / GiB:.3f} GiB", f"{result.memory_ratio:.2f}",
                  f"±{result.memory_tolerance:.0%}"
                  + (f" or {result.memory_floor_bytes / MiB:.0f} MiB" if result.memory_floor_bytes else ""),
                  "[green]ok[/green]" if result.memory_within else "[red]outside[/red]")
    output.out.print(table)
    output.out.print(f"timed steps {len(result.step_times_s)}: {lo:.3f} to {hi:.3f} s; "
                     f"peak memory over {escape(result.peak_window)}")
    if result.step_time_band_s is not None:
        p10, p90 = result.step_time_band_s
        output.out.print(f"predicted step time over the learned correction's trees: {p10:.3f} to "
                         f"{p90:.3f} s (10th to 90th percentile)")
    ranks = Table(title="per rank", title_justify="left")
    for col in ("rank", "stage", "median step s", "peak GiB", "predicted GiB", "threads"):
        ranks.add_column(col, justify="right")
    for r in result.ranks:
        ranks.add_row(str(r.rank), str(r.stage), f"{statistics.median(r.step_times_s):.3f}",
                      f"{r.peak_memory_bytes / GiB:.3f}", f"{r.predicted_peak_bytes / GiB:.3f}",
                      str(r.threads))
    output.out.print(ranks)
    for line in (*result.adjustments, *result.notes):
        output.err.print(f"note: {line}", markup=False)


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
    from autoplan.check import Status

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


def _one_paragraph_lines(app: typer.Typer) -> None:
    """Each command's help from its docstring with every paragraph on one line: typer keeps
    a docstring's line breaks, which the command list then shows mid-sentence."""
    import inspect

    for info in app.registered_commands:
        if info.help is None and info.callback is not None and info.callback.__doc__:
            paragraphs = inspect.cleandoc(info.callback.__doc__).split("\n\n")
            info.help = "\n\n".join(" ".join(p.split()) for p in paragraphs)


# the same app's other commands: tune, runs import, calibrate; profiles import
from autoplan.cli import loop, profiles  # noqa: E402,F401

_one_paragraph_lines(app)


def _usage_errors() -> tuple[type[Exception], ...]:
    """Click's usage-error base classes: recent typer vendors click as ``typer._click``,
    whose exceptions derive from ``typer.TyperException``, not ``click.ClickException``."""
    found: list[type[Exception]] = []
    with contextlib.suppress(ImportError):
        import click

        found.append(click.exceptions.ClickException)
    vendored = getattr(typer, "TyperException", None)
    if isinstance(vendored, type) and issubclass(vendored, Exception):
        found.append(vendored)
    return tuple(found)


_TYPER_WORDING = (  # typer's validation messages, reworded as autoplan's read
    ("a valid number, unable to parse string as a number", "a number"),
    ("a valid integer, unable to parse string as an integer", "a whole number"),
    ("a valid integer, got a number with a fractional part", "a whole number"),
    ("greater than or equal to ", "a value >= "), ("less than or equal to ", "a value <= "),
    ("greater than ", "a value > "), ("less than ", "a value < "),
)


def _given(opts: list[str]) -> str | None:
    """The value given on the command line for the option named by ``opts``, if any: the
    last one given, as click keeps the last of a repeated option and refuses that one
    (``--top 3 ... --top -5`` refuses -5). Spelled ``--top 5``, ``--top=5``, ``-k 5`` or
    ``-k5``; nothing after ``--`` is an option."""
    argv = sys.argv[1:]
    if "--" in argv:
        argv = argv[:argv.index("--")]
    found = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        for opt in opts:
            if arg == opt and i + 1 < len(argv):
                found = argv[i + 1]
                i += 1  # the value is not read as an option
                break
            if opt.startswith("--") and arg.startswith(opt + "="):
                found = arg[len(opt) + 1:]
                break
            if len(opt) == 2 and opt[0] == "-" and opt[1] != "-" and arg.startswith(opt) and len(arg) > 2:
                found = arg[2:]
                break
        i += 1
    return found


def _usage_message(exc: Exception) -> list[str]:
    """A usage error (a flag's value that does not parse, a missing argument, an unknown
    option) in the one format every error has, ``FLAG: what was expected, got VALUE``,
    then where the command's help is."""
    from autoplan.descriptors.strict import shown

    param = getattr(exc, "param", None)
    message = str(getattr(exc, "message", "") or "").strip().rstrip(".")
    opts = [str(o) for o in (getattr(param, "opts", None) or [])]
    kind = type(exc).__name__
    if message.startswith("Input should be "):
        message = message[len("Input should be "):]
        for theirs, ours in _TYPER_WORDING:
            message = message.replace(theirs, ours)
        message = "expected " + message
    elif message.startswith("Value error, ") and " is not one of " in message:
        choices = message.split(" is not one of ", 1)[1].replace("'", "")
        message = f"expected one of {choices}"
    elif message[:1].isupper() and not message[1:2].isupper():
        message = message[0].lower() + message[1:]
    if kind == "MissingParameter":
        head = (f"{max(opts, key=len)}: required" if opts and opts[0].startswith("-")
                else f"{getattr(param, 'metavar', None) or (opts or ['an argument'])[0]}: missing argument")
    elif kind == "NoSuchOption":
        close = list(getattr(exc, "possibilities", None) or [])
        head = (f"{getattr(exc, 'option_name', '')}: no such option"
                + (f"; did you mean {' or '.join(close[:2])}?" if close else ""))
    elif kind == "BadOptionUsage" and getattr(exc, "option_name", None):
        head = f"{exc.option_name}: expected a value"  # type: ignore[attr-defined]
    elif opts:
        value = _given(opts)
        head = f"{max(opts, key=len)}: {message}" + (f", got {shown(value)}" if value is not None else "")
        if hint := getattr(exc, "autoplan_hint", None):  # what the value means elsewhere
            head += f": {hint}"
    else:
        head = message or kind
    # the subcommands' names from the context (click names the program itself after how
    # Python was started: python -m ...)
    names: list[str] = []
    ctx = getattr(exc, "ctx", None)
    while ctx is not None and getattr(ctx, "parent", None) is not None:
        names.append(str(ctx.info_name))
        ctx = ctx.parent
    command = " ".join(["autoplan", *reversed(names)]) if names else None
    if not command:
        known = {_command_name(c) for c in app.registered_commands} | {
            c.callback.__name__ for c in app.registered_commands if c.callback}
        given = sys.argv[1] if len(sys.argv) > 1 else ""
        command = f"autoplan {given}" if given in known else "autoplan"
    return [head, f"see '{command} --help'"]


def _command_name(command: typer.models.CommandInfo) -> str | None:
    """The name a registered command is typed by: its own, or its function's as typer
    names it (``typer.main.get_command_name``: lower case, dashes for underscores)."""
    if command.name:
        return command.name
    return typer.main.get_command_name(command.callback.__name__) if command.callback else None


def _only_the_command(args: list[str]) -> typer.Typer:
    """``app`` holding only the command (or command group) ``args`` name, with the root
    options: typer builds a click command from every registered function's signature, about
    60 ms for all 16 of a process that runs one (measured with cProfile). Without such a name
    (``--help``, a typo the error message suggests a command for), the whole app."""
    name = next((a for a in args if not a.startswith("-")), None)
    if name is None:
        return app
    commands = [c for c in app.registered_commands if _command_name(c) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if not commands and not groups:
        return app
    only = copy.copy(app)
    only.registered_commands, only.registered_groups = commands, groups
    return only


def main() -> None:
    """Entry point: one error handler turns a known error into one message and its exit code."""
    try:
        # returns typer.Exit's code instead of raising it
        code = _only_the_command(sys.argv[1:])(standalone_mode=False)
    except AutoplanError as exc:
        if os.environ.get("AUTOPLAN_DEBUG"):
            raise
        for line in str(exc).splitlines():
            output.err.print(f"autoplan: error: {line}", markup=False)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        output.err.print("autoplan: aborted")
        sys.exit(130)
    except Exception as exc:  # click usage errors and the like
        if isinstance(exc, _usage_errors()):
            for line in _usage_message(exc):
                output.err.print(f"autoplan: error: {line}", markup=False)
            sys.exit(2)
        raise
    sys.exit(code if isinstance(code, int) else 0)


def run() -> None:
    """The ``autoplan`` program: :func:`main`, then the process ends with its exit code
    without the interpreter's teardown. A search leaves its memoized costs (autoplan.caches)
    for the next question rather than freeing them as it ends; a process that has answered
    its one question would free them object by object at exit: a second of the README's
    pooled search (3.2 s to 4.4 s, measured). Output is flushed first; an uncaught
    exception still ends as Python ends it (its traceback, exit 1)."""
    try:
        main()
        code: int = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # sys.exit("message"): Python prints it and exits 1
            print(exc.code, file=sys.stderr)
            code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more reaches it
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
