"""``autoplan search``: rank training plans (one GPU count or several; --whatif, --export).
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from autoplan.api import outputs
from autoplan.cli import files, output, render
from autoplan.cli.app import _yaml, app
from autoplan.cli.options import (
    MAX_TOP,
    ClusterOpt,
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
    objective_choices,
)
from autoplan.plan import Plan
from autoplan.units import GiB
from autoplan.whatif.economics import Objective


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
        callback=objective_choices("search", tuple(o.value for o in Objective)),
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
        files.check_image("--plot", plot)
    if export_dir is not None:
        _check_export_dir(export_dir)
    files.check_apart([("--out", out_path), ("--plot", plot), ("--export", export_dir)], [job_file])
    outputs.one_stdout("--plot", plot, "--out", out_path)
    if files.is_stdout(out_path) or files.is_stdout(plot):
        output.data_to_stderr()
    prepared = prepare_search(
        job_file, model=model, cluster=cluster, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
        dtype=dtype, space=space, launcher=launcher, moe_imbalance=moe_imbalance, top=top, profile=profile,
        stack=stack, min_headroom=min_headroom, train_tokens=train_tokens, objective=objective_name,
        price=price, deadline=deadline, budget=budget, no_offload=no_offload,
        allow_bf16_states=allow_bf16_states, recompute_modules=recompute_modules,
        async_checkpoint=async_checkpoint)
    prepared.check_outputs(plot=plot is not None, export=export_dir is not None)
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
    outputs.check_folder("--export", path, "writes a folder of launch files, not stdout")


def _export_best(plan: Plan, doc: dict[str, Any], runs_on: Sequence[str], launcher: str | None,
                 directory: Path) -> None:
    """The best plan's launch files (``export --to`` its first launcher, or ``--launcher``)
    and the plan itself (``plan.yaml``) into ``directory``; every target checked first."""
    from autoplan.api.search import best_plan_files

    name, written = best_plan_files(plan, _yaml(doc), runs_on, launcher)
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
        if files.is_png(plot):
            from autoplan.api.png import training_front_png

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

